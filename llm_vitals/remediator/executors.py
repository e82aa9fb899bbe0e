"""Executors: one per restart method, all behind the `Executor` protocol.

Each is built from its target's config only; nothing here ever sees the webhook payload. Each
returns an `ExecResult` and never raises for an upstream failure: a failed restart is data for
the journal. Error text never carries a credential (tokens are sent as headers and never echoed).
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import signal
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import quote, urlsplit, urlunsplit

import aiohttp

from llm_vitals.http_body import read_upto
from llm_vitals.kube.client import KubeClient
from llm_vitals.kube.errors import ApiError, KubeConfigError, KubeTimeout, KubeUnavailable
from llm_vitals.kube.evictions import PodAction, PodRef, PodRemover, Sweep
from llm_vitals.kube.objects import list_pods

from .settings import CommandTarget, DockerTarget, HttpTarget, KubernetesTarget, TargetConfig

_DETAIL_LIMIT = 2000


@dataclass(frozen=True)
class ExecResult:
    result: str  # ok | error | timeout
    detail: str = ""
    # The API server refused the restart outright and nothing was done (an eviction a
    # PodDisruptionBudget forbids: "disruption_budget"): the gate's decision is taken back.
    refused: str | None = None
    # The node this action cordoned, once the cordon succeeded: only then is it marked as escalated.
    cordoned: str | None = None


class Executor(Protocol):
    """Restart one target. Bounded by the executor's own timeout; never raises for upstream errors."""

    kind: str

    async def restart(self) -> ExecResult: ...


def _truncate(text: str, limit: int = _DETAIL_LIMIT) -> str:
    return text if len(text) <= limit else text[:limit] + f"... [{len(text) - limit} more chars]"


def redact_url(url: str) -> str:
    """The URL without userinfo or query, for error text."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def _describe(exc: BaseException) -> str:
    """An exception's class and message for error text; callers name the place with a redacted URL."""
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if text != type(exc).__name__ else text


class CommandExecutor:
    """Runs a fixed argv, no shell, with a timeout; output is captured and truncated."""

    kind = "command"

    def __init__(self, config: CommandTarget):
        self.argv = list(config.argv)
        self.timeout = config.timeout
        self.output_limit = config.output_limit

    async def restart(self) -> ExecResult:
        return await run_argv(self.argv, self.timeout, self.output_limit)


async def run_argv(argv: list[str], timeout: float, output_limit: int) -> ExecResult:
    """Run a fixed argv (no shell) with a timeout, its output captured and capped; never raises."""
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            # Own process group, so a timeout kills the command's children too.
            start_new_session=True,
        )
    except OSError as exc:
        return ExecResult("error", f"cannot start {argv[0]}: {exc.strerror or exc}")
    try:
        output, _ = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        _kill_group(proc.pid)
        await proc.wait()
        return ExecResult("timeout", f"{argv[0]} did not finish within {timeout:g}s; killed")
    except asyncio.CancelledError:
        _kill_group(proc.pid)
        await proc.wait()  # reap it and close its pipes; a shutdown must not leave a zombie
        raise
    text = output[:output_limit].decode("utf-8", "replace")
    if len(output) > output_limit:
        text += f"... [{len(output) - output_limit} more bytes]"
    if proc.returncode == 0:
        return ExecResult("ok", text)
    return ExecResult("error", _truncate(f"exit status {proc.returncode}: {text}", max(_DETAIL_LIMIT, output_limit + 100)))


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


# Of an answer's body, at most this much is read: a few hundred characters of it are journaled.
_BODY_LIMIT = 64 * 1024


async def _answer(request: Any) -> tuple[int, bytes]:
    """The status and the start of the body of an aiohttp request (`session.get(...)`), its connection released."""
    async with request as response:
        return response.status, await read_upto(response, _BODY_LIMIT)


class HttpExecutor:
    """POSTs to a fixed URL (no redirect followed, the whole answer within `timeout`); any 2xx is success."""

    kind = "http"

    def __init__(self, config: HttpTarget, session: aiohttp.ClientSession):
        self.url = config.url
        self.timeout = config.timeout
        self.session = session

    async def restart(self) -> ExecResult:
        where = redact_url(self.url)
        try:
            status, body = await _answer(self.session.post(self.url, allow_redirects=False,
                                                           timeout=aiohttp.ClientTimeout(total=self.timeout)))
        except TimeoutError:  # aiohttp's own timeouts are TimeoutErrors too
            return ExecResult("timeout", f"POST {where}: no answer within {self.timeout:g}s")
        except aiohttp.ClientError as exc:
            return ExecResult("error", f"POST {where}: {type(exc).__name__}")
        text = _truncate(body.decode("utf-8", "replace"), 500)
        if 200 <= status < 300:
            return ExecResult("ok", f"HTTP {status}: {text}")
        return ExecResult("error", f"POST {where}: HTTP {status}: {text}")


class DockerExecutor:
    """Docker Engine API over the daemon's unix socket: inspect the container, then
    `POST /containers/{name}/restart` only if it is running.

    The Engine's restart *starts* a stopped container (checked on Engine 20.10): a container someone
    stopped on purpose would come back because an alert about it was still firing. So a container
    that is not running is refused, and nothing is started.
    """

    kind = "docker"

    def __init__(self, config: DockerTarget):
        self.container = config.container
        self.socket_path = str(config.socket_path)
        self.stop_timeout = config.stop_timeout
        self.timeout = config.timeout
        prefix = f"/v{config.api_version}" if config.api_version else ""
        base = f"{prefix}/containers/{quote(self.container, safe='')}"
        self.inspect_path = f"{base}/json"
        self.path = f"{base}/restart"

    async def restart(self) -> ExecResult:
        try:
            async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=self.socket_path)) as client:
                async with asyncio.timeout(self.timeout):
                    inspected = await _answer(client.get(f"http://docker{self.inspect_path}"))
                    refusal = _not_restartable(self.container, *inspected)
                    if refusal is not None:
                        return ExecResult("error", refusal)
                    status, body = await _answer(client.post(f"http://docker{self.path}", params={"t": str(self.stop_timeout)}))
        except TimeoutError:
            return ExecResult("timeout", f"docker restart {self.container}: no answer within {self.timeout:g}s")
        except aiohttp.ClientError as exc:
            code = _os_errno(exc)
            hint = socket_hint(code)
            # The socket's own errno, not the client library's wording of it: the journal's text stays
            # what the operator can look up (and what it was before the move from httpx to aiohttp).
            what = f"cannot connect: [Errno {code}] {os.strerror(code)}" if code is not None else _describe(exc)
            return ExecResult("error", f"docker socket {self.socket_path}: {what}" + (f" ({hint})" if hint else ""))
        if status == 204:
            return ExecResult("ok", f"docker restarted {self.container}")
        return ExecResult("error", f"docker restart {self.container}: HTTP {status}: {_engine_message(body)}")


_SOCKET_HINTS = {
    errno.EACCES: "this process's user may not use the socket: run as root or in the socket's group",
    errno.ECONNREFUSED: "nothing listens on the socket: the Docker daemon is down",
    errno.ENOENT: "no socket there: the Docker daemon is not running, or the socket is not mounted",
}


def socket_hint(code: int | None) -> str:
    """What a connect error on the Docker socket means, for the journal; "" when we cannot say."""
    return _SOCKET_HINTS.get(code, "") if code is not None else ""


def _os_errno(exc: BaseException) -> int | None:
    """The errno of the OSError an aiohttp error is (a connect error is one) or wraps, if any."""
    seen: BaseException | None = exc
    for _ in range(5):
        if seen is None:
            return None
        if isinstance(seen, OSError) and seen.errno is not None:
            return seen.errno
        seen = seen.__cause__ or seen.__context__
    return None


def _not_restartable(container: str, code: int, body: bytes) -> str | None:
    """Why a container must not be restarted, from its inspect answer (HTTP status and body); None when it is running."""
    if code != 200:
        return f"docker inspect {container}: HTTP {code}: {_engine_message(body)}"
    try:
        state = json.loads(body)["State"]
        status, running = str(state.get("Status", "")), bool(state.get("Running"))
    except (ValueError, KeyError, TypeError, AttributeError):
        return f"docker inspect {container}: unexpected answer (no State)"
    if not running or status != "running":
        return (f"container {container} is {status or 'not running'}, not running: refused, nothing started"
                " (the Engine's restart would start a stopped container)")
    return None


def _engine_message(body: bytes) -> str:
    try:
        return str(json.loads(body).get("message", ""))[:500]
    except (ValueError, AttributeError):
        return _truncate(body.decode("utf-8", "replace"), 500)


class KubernetesExecutor:
    """Evicts (or, with `pod_action: delete`, deletes) the pod(s) matching a label selector, each by
    name and UID; their controller recreates them.

    Reaches the API server as the target's keys say (a KubeAccess: a kubeconfig, else the in-cluster
    service account, whose token is re-read for every request and whose CA verifies the server).
    The UID precondition makes an eviction or a delete hit only the pod that was listed: a pod
    recreated under the same name in between is left alone (it is the restart we wanted). An
    eviction a PodDisruptionBudget forbids (429) deletes nothing: for the first pod it refuses the
    restart (`disruption_budget`), for a later one it ends the restart as an error naming what was done.
    """

    kind = "kubernetes"

    def __init__(self, config: KubernetesTarget, pod_action: PodAction = "evict"):
        self.config = config
        self.pod_action = pod_action

    async def restart(self) -> ExecResult:
        cfg = self.config
        kube = KubeClient(cfg)
        try:
            return await self._restart(kube)
        except KubeTimeout:
            return ExecResult("timeout", f"Kubernetes API {redact_url(cfg.api_url)}: no answer within {cfg.timeout:g}s")
        except KubeConfigError as exc:
            return ExecResult("error", str(exc))
        except KubeUnavailable as exc:
            return ExecResult("error", f"Kubernetes API {redact_url(cfg.api_url)}: {exc}")
        finally:
            await kube.close()

    async def _restart(self, kube: KubeClient) -> ExecResult:
        cfg = self.config
        try:
            listed = await list_pods(kube, cfg.namespace, cfg.pod_selector)
            pods = [(item["metadata"]["name"], item["metadata"]["uid"]) for item in listed]
        except ApiError as exc:
            return ExecResult("error", f"list pods: {exc}")
        except (KeyError, TypeError) as exc:
            return ExecResult("error", f"Kubernetes API {redact_url(cfg.api_url)}: unexpected answer ({type(exc).__name__})")
        if not pods:
            return ExecResult("error", f"no pod in {cfg.namespace} matches {cfg.pod_selector!r}")
        if len(pods) > cfg.max_pods:
            return ExecResult(
                "error", f"{len(pods)} pods match {cfg.pod_selector!r}, more than max_pods={cfg.max_pods}; nothing deleted")
        # The one eviction path (llm_vitals/kube/evictions.py): a pod gone already, or whose name a new pod
        # has (the UID precondition failed), is passed over: the pod that was listed is gone, as wanted.
        remover = PodRemover(kube, self.pod_action)
        sweep = await remover.remove_each([PodRef(cfg.namespace, name, uid) for name, uid in pods], Sweep())
        names = ", ".join(pod.name for pod, _ in sweep.passed)
        if sweep.stopped is None:
            return ExecResult("ok", f"{remover.verb} pod(s) {names} in {cfg.namespace}")
        removed = ", ".join(pod.name for pod in sweep.removed)
        before = f" ({remover.verb} before: {removed})" if removed else ""
        result = "timeout" if sweep.stopped.outcome == "no_answer" else "error"
        return ExecResult(result, sweep.stopped.detail + before, refused=sweep.refused)


def build_executor(config: TargetConfig, http_client: aiohttp.ClientSession, pod_action: PodAction = "evict") -> Executor:
    """The executor for one configured target (`pod_action`: how the kubernetes executor restarts a pod)."""
    if isinstance(config, CommandTarget):
        return CommandExecutor(config)
    if isinstance(config, HttpTarget):
        return HttpExecutor(config, http_client)
    if isinstance(config, DockerTarget):
        return DockerExecutor(config)
    if isinstance(config, KubernetesTarget):
        return KubernetesExecutor(config, pod_action)
    raise TypeError(f"no executor for {type(config).__name__}")
