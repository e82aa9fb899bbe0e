"""The Kubernetes client on real TLS: inline keys kept off the disk, a real exec plugin, rotating tokens, clear errors.

The API server here is a loopback HTTPS stand-in speaking the documented paths (the real one is
the k8s tier's, tests/k8s/test_exec_plugin.py); the certificates are made with the openssl CLI, the
exec plugin is tests/k8s/exec_credential.py run as a process, as a kubeconfig's `exec` runs it.
"""

from __future__ import annotations

import base64
import json
import shutil
import ssl
import subprocess
import tempfile
from pathlib import Path

import pytest
from aiohttp import web
from fake_http import app_of
from k8s.exec_credential import exec_kubeconfig, runs

from llm_vitals.config import KubeAccess
from llm_vitals.kube.client import KubeClient
from llm_vitals.kube.errors import ApiError, KubeConfigError, KubeUnavailable
from llm_vitals.kube.leases import LeaseTransport
from llm_vitals.kube.objects import Query, delete_pod, list_objects, watch_objects

TOKEN = "kube-client-test-token"


def self_signed(directory: Path, name: str) -> tuple[Path, Path]:
    """A self-signed certificate (CN `name`, for 127.0.0.1) and its key, made with the openssl CLI."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("SKIPPED: openssl not found; apt-get install openssl")
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    subprocess.run([openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", f"/CN={name}",
                    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"], check=True, capture_output=True, timeout=30)
    return cert, key


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    directory = tmp_path_factory.mktemp("pki")
    return {"server": self_signed(directory, "server"), "client": self_signed(directory, "client")}


def b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


class ApiStandIn:
    """A loopback HTTPS API server: a Lease, a pod delete, a pod watch; records every request's auth and body."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, str | None, object]] = []
        self.tokens = {f"Bearer {TOKEN}"}
        self.watch_lines: list[bytes] = []

    def app(self) -> web.Application:
        return app_of(
            ("GET", "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases/{name}", self.lease),
            ("DELETE", "/api/v1/namespaces/{ns}/pods/{name}", self.delete),
            ("GET", "/api/v1/namespaces/{ns}/pods", self.pods),
        )

    async def _seen(self, request: web.Request) -> web.Response | None:
        body = await request.json() if request.can_read_body else None
        auth = request.headers.get("Authorization")
        self.requests.append((request.method, request.path_qs, auth, body))
        peer = request.transport.get_extra_info("peercert") if request.transport else None
        if auth not in self.tokens and not peer:
            return web.json_response({"kind": "Status", "code": 401, "reason": "Unauthorized", "message": "Unauthorized"},
                                     status=401)
        return None

    async def lease(self, request: web.Request) -> web.StreamResponse:
        refused = await self._seen(request)
        if refused is not None:
            return refused
        if request.match_info["name"] == "missing":
            return web.json_response({"kind": "Status", "code": 404, "reason": "NotFound",
                                      "message": 'leases.coordination.k8s.io "missing" not found'}, status=404)
        return web.json_response({"kind": "Lease", "metadata": {"name": request.match_info["name"], "resourceVersion": "7"}})

    async def delete(self, request: web.Request) -> web.StreamResponse:
        refused = await self._seen(request)
        if refused is not None:
            return refused
        return web.json_response({"kind": "Pod", "metadata": {"name": request.match_info["name"]}})

    async def pods(self, request: web.Request) -> web.StreamResponse:
        refused = await self._seen(request)
        if refused is not None:
            return refused
        if request.query.get("watch", "").lower() != "true":  # the client sends Python's True: Go's ParseBool takes it
            return web.json_response({"kind": "PodList", "metadata": {"resourceVersion": "5"}, "items": []})
        response = web.StreamResponse()
        await response.prepare(request)
        for line in self.watch_lines:
            await response.write(line)
        return response


@pytest.fixture
async def api(aiohttp_server, pki):
    cert, key = pki["server"]
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    context.verify_mode = ssl.CERT_OPTIONAL  # a client certificate, when sent, must be the test's
    context.load_verify_locations(pki["client"][0])
    stand_in = ApiStandIn()
    server = await aiohttp_server(stand_in.app(), ssl=context)
    stand_in.url = f"https://127.0.0.1:{server.port}"  # type: ignore[attr-defined]
    return stand_in


def kubeconfig(server: str, user: dict, cluster: dict | None = None) -> dict:
    return {"apiVersion": "v1", "kind": "Config", "current-context": "x",
            "clusters": [{"name": "c", "cluster": {"server": server, **(cluster or {})}}],
            "users": [{"name": "u", "user": user}], "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}]}


def written(directory: Path, doc: dict) -> Path:
    """The kubeconfig `doc` as a file (JSON is YAML) in `directory`."""
    path = directory / "kubeconfig"
    path.write_text(json.dumps(doc))
    return path


async def test_inline_keys_authenticate_and_never_touch_the_disk(api, pki, tmp_path, monkeypatch):
    """The CA, client certificate and key given inline reach TLS from memory: the temp dir stays empty."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    doc = kubeconfig(api.url, {"client-certificate-data": b64(pki["client"][0]), "client-key-data": b64(pki["client"][1])},
                     {"certificate-authority-data": b64(pki["server"][0])})
    kube = KubeClient(KubeAccess(kubeconfig=written(tmp_path, doc)))
    try:
        lease = (await LeaseTransport(kube).get_lease("llm", "l1")).value
    finally:
        await kube.close()
    assert lease == {"kind": "Lease", "metadata": {"name": "l1", "resourceVersion": "7"}}
    assert api.requests[0][2] is None  # no token: the client certificate was the credential
    assert list(scratch.iterdir()) == []  # where the library would have written its temp files too


async def test_an_inline_key_that_is_not_base64_is_one_sentence(api, tmp_path):
    path = written(tmp_path, kubeconfig(api.url, {"token": TOKEN}, {"certificate-authority-data": "%%%"}))
    kube = KubeClient(KubeAccess(kubeconfig=path))
    with pytest.raises(KubeConfigError, match=r"^cannot use the kubeconfig .*: ValueError: certificate-authority-data is not base64$"):
        await LeaseTransport(kube).get_lease("llm", "l1")


@pytest.mark.parametrize(("content", "message"), [
    (None, "cannot use the kubeconfig {path}: FileNotFoundError: No such file or directory"),
    ("[]", "cannot use the kubeconfig {path}: ValueError: not a kubeconfig (no mapping at the top)"),
    ('{"clusters": [], "contexts": [], "current-context": "gone"}',
     "cannot use the kubeconfig {path}: ConfigException: Invalid kube-config file. Expected object with name gone in "
     "kube-config/contexts list"),
])
async def test_a_kubeconfig_that_cannot_be_used_is_one_sentence_at_the_first_request(tmp_path, content, message):
    path = tmp_path / "kubeconfig"
    if content is not None:
        path.write_text(content)
    kube = KubeClient(KubeAccess(kubeconfig=path))  # constructing it does no I/O: a process starts either way
    with pytest.raises(KubeConfigError) as caught:
        await list_objects(kube, Query("nodes"))
    assert str(caught.value) == message.format(path=path)


async def test_an_exec_plugin_runs_once_and_again_after_a_401(api, pki, tmp_path):
    token_file, log = tmp_path / "token", tmp_path / "runs"
    token_file.write_text("an-old-token")
    path = exec_kubeconfig(tmp_path / "kubeconfig", api.url, token_file, log, ca_file=pki["server"][0])
    kube = KubeClient(KubeAccess(kubeconfig=path))
    try:
        with pytest.raises(ApiError, match="HTTP 401: Unauthorized"):  # run again, the plugin still says the old token
            await LeaseTransport(kube).get_lease("llm", "l1")
        assert runs(log) == 2
        token_file.write_text(TOKEN)  # logged in again (the cloud's token rotated)
        assert (await LeaseTransport(kube).get_lease("llm", "l1")).value is not None  # 401 -> run -> retried once
        assert runs(log) == 3
        assert (await LeaseTransport(kube).get_lease("llm", "missing")).value is None
        assert runs(log) == 3  # a credential without expiry is kept until a 401
    finally:
        await kube.close()
    assert [auth for _, _, auth, _ in api.requests] == [
        "Bearer an-old-token", "Bearer an-old-token",  # the first call, and its one retry after running the plugin
        "Bearer an-old-token", f"Bearer {TOKEN}",  # the second: 401 with the credential kept, the plugin, the retry
        f"Bearer {TOKEN}"]
    assert json.loads(log.read_text().splitlines()[0])["apiVersion"] == "client.authentication.k8s.io/v1beta1"


async def test_an_expiring_exec_credential_is_renewed_before_requests(api, pki, tmp_path):
    token_file, log = tmp_path / "token", tmp_path / "runs"
    token_file.write_text(TOKEN)
    # Expiring within the loader's 5 minutes of margin: expired for it, so run before each request.
    path = exec_kubeconfig(tmp_path / "kubeconfig", api.url, token_file, log, ca_file=pki["server"][0], expires_in=60)
    kube = KubeClient(KubeAccess(kubeconfig=path))
    try:
        for _ in range(2):
            assert (await LeaseTransport(kube).get_lease("llm", "l1")).value is not None
    finally:
        await kube.close()
    assert runs(log) == 3  # at connect, then before each of the two requests


async def test_an_exec_plugin_that_fails_is_a_config_error_with_its_stderr(api, pki, tmp_path):
    path = exec_kubeconfig(tmp_path / "kubeconfig", api.url, tmp_path / "no-token", tmp_path / "runs",
                           ca_file=pki["server"][0])
    kube = KubeClient(KubeAccess(kubeconfig=path))
    with pytest.raises(KubeConfigError, match=r"^cannot use the kubeconfig .*: ConfigException: exec: process returned 1\. "
                                              r"cannot log in: \[Errno 2\] No such file or directory"):
        await LeaseTransport(kube).get_lease("llm", "l1")
    assert api.requests == []


async def test_the_service_account_token_is_read_again_for_each_request(api, pki, tmp_path):
    token = tmp_path / "token"
    token.write_text("first\n")
    api.tokens = {"Bearer first", "Bearer second"}
    kube = KubeClient(KubeAccess(api_url=api.url, token_path=token, ca_path=pki["server"][0]))
    try:
        await delete_pod(kube, "llm", "vllm-0", "uid-0")
        token.write_text("second\n")  # the kubelet rotated the projected token
        await delete_pod(kube, "llm", "vllm-0", None)
        token.unlink()
        with pytest.raises(KubeConfigError, match=f"^cannot read the service account token {token}: No such file"):
            await delete_pod(kube, "llm", "vllm-0", "uid-0")
    finally:
        await kube.close()
    assert [(auth, body) for _, _, auth, body in api.requests] == [
        ("Bearer first", {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": "uid-0"}}),
        ("Bearer second", {"apiVersion": "v1", "kind": "DeleteOptions"}),
    ]


async def test_a_ca_that_did_not_sign_the_server_is_refused_before_any_request(api, pki, tmp_path):
    token = tmp_path / "token"
    token.write_text(TOKEN)
    kube = KubeClient(KubeAccess(api_url=api.url, token_path=token, ca_path=pki["client"][0]))
    try:
        with pytest.raises(KubeUnavailable, match="CERTIFICATE_VERIFY_FAILED"):
            await delete_pod(kube, "llm", "vllm-0", "uid-0")
    finally:
        await kube.close()
    assert api.requests == []
    missing = KubeClient(KubeAccess(api_url=api.url, token_path=token, ca_path=tmp_path / "no-ca.crt"))
    with pytest.raises(KubeConfigError, match=r"^cannot load the cluster CA .*no-ca\.crt: FileNotFoundError"):
        await delete_pod(missing, "llm", "vllm-0", "uid-0")


async def test_a_watch_yields_events_and_raises_its_error_event(api, pki, tmp_path):
    api.watch_lines = [
        b'{"type": "ADDED", "object": {"metadata": {"name": "a", "resourceVersion": "6"}}}\n',
        b'{"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "8"}}}\n',
        b'{"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"}}\n',
    ]
    doc = kubeconfig(api.url, {"token": TOKEN}, {"certificate-authority-data": b64(pki["server"][0])})
    kube = KubeClient(KubeAccess(kubeconfig=written(tmp_path, doc)))
    seen = []
    try:
        with pytest.raises(ApiError) as caught:
            async with watch_objects(kube, Query("pods", "llm", "app=vllm"), "5", 30) as events:
                async for event in events:
                    seen.append(event["type"])
    finally:
        await kube.close()
    assert seen == ["ADDED", "BOOKMARK"] and (caught.value.status, caught.value.reason) == (410, "Expired")
    _, path, _, _ = api.requests[0]
    path = path.lower()
    assert "watch=true" in path and "resourceversion=5" in path and "allowwatchbookmarks=true" in path
    assert "timeoutseconds=30" in path and "labelselector=app%3dvllm" in path
