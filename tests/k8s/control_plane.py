"""A real Kubernetes control plane on loopback for tests: etcd + kube-apiserver (+ controller-manager).

Kubernetes v1.20.2 built from Debian's source by `tools/real-k8s-setup.sh` (cached outside the clone)
and Debian's etcd 3.4.23. Real authentication (static bearer tokens), RBAC, admission, validation,
`resourceVersion` conflicts, watches, label selectors and an audit log of every request. No kubelet
and no scheduler: pods stay Pending until a test plays the kubelet (`play_kubelet`).

The whole API, for tests here and anyone else's (the `control_plane` / `namespace` fixtures in
tests/k8s/conftest.py give you a started one and a fresh namespace per test):

    cp = ControlPlane(run_dir)            # or the session fixture `control_plane`
    cp.start()                            # etcd, kube-apiserver on free ports; waits for /readyz
    cp.url, cp.ca_file                    # https://127.0.0.1:PORT and its CA
    cp.kubeconfig(user) -> Path           # one kubeconfig per user (USERS below)
    cp.token(user) -> str                 # that user's static bearer token
    cp.client(user="admin") -> httpx.Client          # JSON client with that token (sync)
    cp.async_client(user="admin") -> httpx.AsyncClient
    cp.new_namespace(prefix) -> str       # a fresh namespace; never waited on to delete
    cp.grant(namespace, user, rules)      # a Role + RoleBinding (namespace None: ClusterRole + binding)
    cp.create_pod(ns, name, labels=..., node=None, port=..., owners=...) -> dict   # a Pending pod (one container)
    cp.play_kubelet(ns, pod, ip="127.0.0.1", ready=True) -> dict       # patch pods/status to Running
    cp.bind_pod(ns, pod, node) -> None    # play the scheduler: pods/binding sets spec.nodeName
    cp.create_node(name, conditions=...) -> dict   # a Node object (no kubelet behind it)
    cp.audit(verb=, resource=, namespace=, user=) -> list[dict]        # requests seen by the API server
    cp.stop_apiserver(); cp.start_apiserver()      # the same port, etcd kept: an API outage
    cp.outages                            # [(stopped, ready again)]: a client may meet 403s as it comes back
    cp.start_controller_manager(controllers=...); cp.stop_controller_manager()
    cp.stop()                             # everything, by the PIDs started here

USERS: `admin` (system:masters), `llm-vitals-remediator` and `llm-vitals-exporter` (no rights until
a test grants them), `controller-manager` (system:masters, for kube-controller-manager).

Every process runs at `nice 10` (and its session's autogroup too) so that it yields to the code
under test, gets SIGTERM if the test process dies (PR_SET_PDEATHSIG), and is stopped by its own
PID (its process group): nothing is ever stopped by name.

Traps of this version (see the fixture recipe): EndpointSlice is `discovery.k8s.io/v1beta1` only;
Lease MicroTimes need exactly six fractional digits; bound pods (with a nodeName) stay Terminating
after a plain delete, since no kubelet confirms it (unbound pods go at once); with no
controller-manager nothing recreates a deleted pod and namespaces never finish deleting; a probe on
an init container is refused (native sidecars, as deploy/kubernetes/native/vllm.yaml's shim, are 1.29+).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import secrets
import shutil
import signal
import ssl
import subprocess
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from llm_vitals.demo.ports import free_port

REPO = Path(__file__).resolve().parents[2]
VERSION = "1.20.2"
USERS = ("admin", "llm-vitals-remediator", "llm-vitals-exporter", "controller-manager")
_GROUPS = {"admin": "system:masters", "controller-manager": "system:masters"}
NICENESS = 10
# Controllers started by default: enough for Deployments/ReplicaSets to replace deleted pods; the
# serviceaccount controller's `default` ServiceAccount says the controller-manager is working.
DEFAULT_CONTROLLERS = ("deployment", "replicaset", "serviceaccount")

_AUDIT_POLICY = """\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
  # The control plane's own traffic and the harness's readiness polls: noise.
  - level: None
    users: ["system:kube-controller-manager", "system:apiserver"]
  - level: None
    nonResourceURLs: ["/readyz", "/healthz*", "/livez*", "/version"]
  - level: Metadata
"""


def log_tail(path: Path, header: str, lines: int) -> str:
    """The last `lines` lines of a process's log under a `--- header ---` line (none when it cannot be read)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        text = ""
    return f"--- {header} ---\n" + "\n".join(text.splitlines()[-lines:])


class ControlPlaneError(RuntimeError):
    """A component did not start or a request failed; the message carries the evidence (log tails)."""


def bin_dir() -> Path:
    """Where tools/real-k8s-setup.sh caches kube-apiserver and kube-controller-manager."""
    if env := os.environ.get("LLM_VITALS_K8S_BIN_DIR"):
        return Path(env)
    out = subprocess.run(["bash", str(REPO / "tools" / "real-k8s-setup.sh"), "--where"],
                         capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


def etcd_binary() -> str | None:
    return shutil.which("etcd") or ("/usr/sbin/etcd" if os.access("/usr/sbin/etcd", os.X_OK) else None) or (
        "/usr/bin/etcd" if os.access("/usr/bin/etcd", os.X_OK) else None)


def missing() -> str | None:
    """Why a control plane cannot start here (None when everything is built and installed)."""
    where = bin_dir()
    for name in ("kube-apiserver", "kube-controller-manager"):
        if not os.access(where / name, os.X_OK):
            return f"no {name} at {where}; run `bash tools/real-k8s-setup.sh` (or `make test-k8s`)"
    if etcd_binary() is None:
        return "no etcd; run `bash tools/real-k8s-setup.sh` (apt-get install etcd-server)"
    if shutil.which("openssl") is None:
        return "no openssl; apt-get install openssl"
    return None


def _lower_priority() -> None:
    """In the child, before exec: a lower priority."""
    with contextlib.suppress(Exception):
        os.nice(NICENESS)


def _lower_priority_and_die_with_parent() -> None:
    """As `_lower_priority`, and SIGTERM when the test process dies (PR_SET_PDEATHSIG)."""
    _lower_priority()
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)


def _preexec():
    """PR_SET_PDEATHSIG fires when the *thread* that started the child exits, not the process: a
    server started from a worker thread (asyncio.to_thread, whose pool is shut down with each test's
    event loop) would get SIGTERM at the end of that test. So only children of the main thread get
    it; the fixtures stop every child by PID anyway."""
    return _lower_priority_and_die_with_parent if threading.current_thread() is threading.main_thread() else _lower_priority


class _Proc:
    """One started binary: its own session and process group, a log file, stopped by its PID."""

    def __init__(self, name: str, argv: Sequence[str], log_path: Path):
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.popen: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log_path, "ab") as log:
            self.popen = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                          start_new_session=True, preexec_fn=_preexec())
        # With autogroup scheduling, nice orders only within a session: lower the session too.
        with contextlib.suppress(OSError):
            Path(f"/proc/{self.popen.pid}/autogroup").write_text(f"{NICENESS}\n")

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen else None

    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def stop(self, grace: float = 10.0) -> None:
        popen = self.popen
        if popen is None or popen.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(popen.pid, signal.SIGTERM)
        try:
            popen.wait(grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(popen.pid, signal.SIGKILL)
            popen.wait()

    def tail(self, lines: int = 30) -> str:
        return log_tail(self.log_path, f"{self.name} (pid {self.pid}) {self.log_path}", lines)


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


class ControlPlane:
    """etcd + kube-apiserver (+ kube-controller-manager) on free loopback ports under `run_dir`."""

    def __init__(self, run_dir: Path, *, start_timeout: float = 180.0):
        self.run_dir = Path(run_dir)
        self.start_timeout = start_timeout
        self.bin_dir = bin_dir()
        self.pki = self.run_dir / "pki"
        self.ca_file = self.pki / "ca.crt"
        self.audit_log = self.run_dir / "audit.log"
        self.etcd: _Proc | None = None
        self.apiserver: _Proc | None = None
        self.controller_manager: _Proc | None = None
        self.etcd_url = ""
        self.url = ""
        self._tokens: dict[str, str] = {}
        self._port = 0
        self._tls: ssl.SSLContext | None = None
        # (stopped, serving again) in unix seconds for each stop_apiserver/start_apiserver pair.
        self.outages: list[tuple[float, float]] = []
        self._stopped_at: float | None = None

    # -- lifetime -------------------------------------------------------------------------------

    def start(self) -> ControlPlane:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._credentials()
        try:
            self._start_etcd()
            self._port = free_port()
            self.url = f"https://127.0.0.1:{self._port}"
            self.start_apiserver()
            self._kubeconfigs()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop every process started here, each by its own PID; safe to call twice."""
        for proc in (self.controller_manager, self.apiserver, self.etcd):
            if proc is not None:
                proc.stop()

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def diagnostics(self) -> str:
        return "\n".join(p.tail() for p in (self.etcd, self.apiserver, self.controller_manager) if p is not None)

    def _credentials(self) -> None:
        p = self.pki
        p.mkdir(parents=True, exist_ok=True)
        _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=llm-vitals-test-ca",
                 "-keyout", str(p / "ca.key"), "-out", str(self.ca_file))
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=kube-apiserver",
                 "-keyout", str(p / "apiserver.key"), "-out", str(p / "apiserver.csr"))
        (p / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n")
        _openssl("x509", "-req", "-in", str(p / "apiserver.csr"), "-CA", str(self.ca_file), "-CAkey", str(p / "ca.key"),
                 "-CAcreateserial", "-days", "2", "-extfile", str(p / "ext.cnf"), "-out", str(p / "apiserver.crt"))
        _openssl("genrsa", "-out", str(p / "sa.key"), "2048")
        _openssl("rsa", "-in", str(p / "sa.key"), "-pubout", "-out", str(p / "sa.pub"))
        self._tokens = {user: secrets.token_hex(24) for user in USERS}
        lines = []
        for user, token in self._tokens.items():
            name = "system:kube-controller-manager" if user == "controller-manager" else user
            group = f',"{_GROUPS[user]}"' if user in _GROUPS else ""
            lines.append(f"{token},{name},uid-{user}{group}")
        (p / "tokens.csv").write_text("\n".join(lines) + "\n")
        for secret in ("ca.key", "apiserver.key", "sa.key", "tokens.csv"):
            (p / secret).chmod(0o600)
        (self.run_dir / "audit-policy.yaml").write_text(_AUDIT_POLICY)

    def _start_etcd(self) -> None:
        etcd = etcd_binary()
        assert etcd is not None, missing()
        for attempt in range(3):
            port, peer = free_port(), free_port()
            self.etcd_url = f"http://127.0.0.1:{port}"
            data = self.run_dir / "etcd-data"
            shutil.rmtree(data, ignore_errors=True)
            self.etcd = _Proc("etcd", [
                etcd, "--name", "llm-vitals-test", "--data-dir", str(data),
                "--listen-client-urls", self.etcd_url, "--advertise-client-urls", self.etcd_url,
                "--listen-peer-urls", f"http://127.0.0.1:{peer}", "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
                "--initial-cluster", f"llm-vitals-test=http://127.0.0.1:{peer}",
            ], self.run_dir / "etcd.log")
            self.etcd.start()
            try:
                self._wait(self.etcd, lambda: httpx.get(f"{self.etcd_url}/health", timeout=2).json().get("health") == "true",
                           "etcd /health")
                return
            except ControlPlaneError:
                self.etcd.stop()
                if attempt == 2 or "address already in use" not in self.etcd.tail():
                    raise

    def start_apiserver(self) -> None:
        """Start (or, after `stop_apiserver`, restart) kube-apiserver on its port; waits for /readyz
        and for RBAC to authorize a non-admin user."""
        p = self.pki
        self.apiserver = _Proc("kube-apiserver", [
            str(self.bin_dir / "kube-apiserver"),
            f"--etcd-servers={self.etcd_url}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
            f"--secure-port={self._port}", "--insecure-port=0",
            f"--tls-cert-file={p / 'apiserver.crt'}", f"--tls-private-key-file={p / 'apiserver.key'}",
            f"--token-auth-file={p / 'tokens.csv'}",
            "--authorization-mode=RBAC",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-key-file={p / 'sa.pub'}", f"--service-account-signing-key-file={p / 'sa.key'}",
            # Only an allocation range stored in etcd: nothing routes to it.
            "--service-cluster-ip-range=10.0.0.0/24",
            # The `kubernetes` Service would get a loopback endpoint, which validation rejects.
            "--endpoint-reconciler-type=none",
            # Nothing makes the `default` ServiceAccount without the controller-manager.
            "--disable-admission-plugins=ServiceAccount",
            f"--audit-policy-file={self.run_dir / 'audit-policy.yaml'}",
            f"--audit-log-path={self.audit_log}", "--audit-log-format=json", "--audit-log-mode=blocking",
            "--profiling=false", "--v=1",
        ], self.run_dir / "kube-apiserver.log")
        self.apiserver.start()

        def ready() -> bool:
            with self.client() as client:
                return client.get("/readyz").status_code == 200

        self._wait(self.apiserver, ready, "kube-apiserver /readyz")

        # /readyz can pass while the RBAC authorizer has not synced yet: until then it refuses every
        # user but system:masters (403), as seen from a client that raced an API server restart.
        # Every authenticated user may create a SelfSubjectAccessReview (system:basic-user).
        review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                  "spec": {"resourceAttributes": {"verb": "get", "resource": "pods"}}}

        def rbac_works() -> bool:
            with self.client("llm-vitals-exporter") as client:
                path = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
                return client.post(path, json=review).status_code == 201

        self._wait(self.apiserver, rbac_works, "RBAC answering a non-admin user")
        if self._stopped_at is not None:
            self.outages.append((self._stopped_at, time.time()))
            self._stopped_at = None

    def stop_apiserver(self) -> None:
        """Stop kube-apiserver by its PID (etcd and its data stay): the API is unreachable until start_apiserver."""
        if self.apiserver is not None:
            self._stopped_at = time.time()
            self.apiserver.stop()

    def start_controller_manager(self, controllers: Iterable[str] = DEFAULT_CONTROLLERS) -> None:
        """Start kube-controller-manager (no leader election, so a restart is immediate); waits until it works."""
        names = list(controllers)
        self.controller_manager = _Proc("kube-controller-manager", [
            str(self.bin_dir / "kube-controller-manager"),
            f"--kubeconfig={self.kubeconfig('controller-manager')}",
            "--port=0", "--secure-port=0",  # serves nothing; only talks to the API server
            f"--service-account-private-key-file={self.pki / 'sa.key'}", f"--root-ca-file={self.ca_file}",
            "--use-service-account-credentials=false",
            "--leader-elect=false",
            f"--controllers={','.join(names)}",
            "--v=1",
        ], self.run_dir / "kube-controller-manager.log")
        self.controller_manager.start()
        if "serviceaccount" in names:
            def works() -> bool:
                with self.client() as client:
                    return client.get("/api/v1/namespaces/default/serviceaccounts/default").status_code == 200

            self._wait(self.controller_manager, works, "the controller-manager's default ServiceAccount")

    def stop_controller_manager(self) -> None:
        if self.controller_manager is not None:
            self.controller_manager.stop()
            self.controller_manager = None

    def _wait(self, proc: _Proc, ready: Any, what: str) -> None:
        deadline = time.monotonic() + self.start_timeout
        last: object = None
        while True:
            if not proc.running():
                raise ControlPlaneError(f"{proc.name} exited before {what}\n{proc.tail()}")
            try:
                if ready():
                    return
            except (httpx.HTTPError, ValueError) as exc:
                last = exc
            if time.monotonic() > deadline:
                raise ControlPlaneError(f"no {what} after {self.start_timeout:g}s (last: {last!r})\n{proc.tail()}")
            time.sleep(0.2)

    # -- credentials and clients ----------------------------------------------------------------

    def token(self, user: str) -> str:
        return self._tokens[user]

    def kubeconfig(self, user: str) -> Path:
        return self.run_dir / f"kubeconfig-{user}"

    def _kubeconfigs(self) -> None:
        for user in USERS:
            doc = {
                "apiVersion": "v1", "kind": "Config",
                "clusters": [{"name": "local", "cluster": {"server": self.url, "certificate-authority": str(self.ca_file)}}],
                "users": [{"name": user, "user": {"token": self._tokens[user]}}],
                "contexts": [{"name": f"{user}@local", "context": {"cluster": "local", "user": user, "namespace": "default"}}],
                "current-context": f"{user}@local",
            }
            path = self.kubeconfig(user)
            path.write_text(json.dumps(doc, indent=1))  # JSON is YAML
            path.chmod(0o600)

    def _client_args(self, user: str) -> dict[str, Any]:
        if self._tls is None:
            self._tls = ssl.create_default_context(cafile=str(self.ca_file))
        return {"base_url": self.url, "verify": self._tls, "trust_env": False, "timeout": 30,
                "headers": {"Authorization": f"Bearer {self._tokens[user]}", "Accept": "application/json"}}

    def client(self, user: str = "admin") -> httpx.Client:
        """A JSON client acting as `user`; close it (or use `with`)."""
        return httpx.Client(**self._client_args(user))

    def async_client(self, user: str = "admin") -> httpx.AsyncClient:
        return httpx.AsyncClient(**self._client_args(user))

    def request(self, method: str, path: str, body: Any = None, *, user: str = "admin", ok: Sequence[int] = (200, 201),
                content_type: str = "application/json") -> dict[str, Any]:
        """One request as `user`; the JSON answer, or ControlPlaneError when the status is not in `ok`."""
        with self.client(user) as client:
            headers = {"Content-Type": content_type} if body is not None else {}
            response = client.request(method, path, content=json.dumps(body) if body is not None else None,
                                      headers=headers)
        if response.status_code not in ok:
            raise ControlPlaneError(f"{method} {path} as {user}: HTTP {response.status_code}: {response.text[:500]}")
        return response.json() if response.content else {}

    # -- objects --------------------------------------------------------------------------------

    def new_namespace(self, prefix: str = "t") -> str:
        """Create a namespace named `prefix-xxxxxx` (never waited on to delete: with no
        controller-manager it would stay Terminating)."""
        name = f"{prefix[:50]}-{secrets.token_hex(3)}"
        self.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
        return name

    def grant(self, namespace: str | None, user: str, rules: Sequence[Mapping[str, Any]], name: str | None = None) -> None:
        """Give `user` these RBAC rules: a Role + RoleBinding in `namespace`, or with None a
        ClusterRole + ClusterRoleBinding. Re-granting the same name replaces nothing (409 is fine)."""
        name = name or f"test-{user.replace(':', '-')}"
        subject = {"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": user}
        rbac = "/apis/rbac.authorization.k8s.io/v1"
        if namespace is None:
            role_path, binding_path, kind = f"{rbac}/clusterroles", f"{rbac}/clusterrolebindings", "ClusterRole"
        else:
            role_path, binding_path, kind = (f"{rbac}/namespaces/{namespace}/roles",
                                             f"{rbac}/namespaces/{namespace}/rolebindings", "Role")
        meta: dict[str, Any] = {"name": name} | ({"namespace": namespace} if namespace else {})
        self.request("POST", role_path, {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind, "metadata": meta,
                                         "rules": list(rules)}, ok=(201, 409))
        self.request("POST", binding_path, {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": f"{kind}Binding", "metadata": meta,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": name}, "subjects": [subject],
        }, ok=(201, 409))
        self._wait_allowed(namespace, user, rules[0])

    def _wait_allowed(self, namespace: str | None, user: str, rule: Mapping[str, Any], timeout: float = 30.0) -> None:
        """RBAC reads roles and bindings through informers: a grant takes effect a moment after its
        writes (long enough on a loaded box for a request right after it to get 403). Wait until a
        SubjectAccessReview, answered by that same authorizer, allows `user` the rule's first verb."""
        if not rule.get("resources"):
            return
        attributes = {"verb": rule["verbs"][0], "group": rule["apiGroups"][0], "resource": rule["resources"][0]}
        if rule.get("resourceNames"):
            attributes["name"] = rule["resourceNames"][0]
        if namespace:
            attributes["namespace"] = namespace
        review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                  "spec": {"user": user, "resourceAttributes": attributes}}
        deadline = time.monotonic() + timeout
        while not self.request("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", review)["status"].get(
                "allowed"):
            if time.monotonic() > deadline:
                raise ControlPlaneError(f"RBAC still refuses {user} {attributes} {timeout:g}s after the grant")
            time.sleep(0.05)

    def create_pod(self, namespace: str, name: str, *, labels: Mapping[str, str] | None = None, node: str | None = None,
                   port: int = 8000, port_name: str = "http", owners: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
        """A pod with one container (never run: no kubelet); `node` binds it (spec.nodeName) at creation;
        `owners` are its ownerReferences (no garbage collector runs: nothing removes it for them)."""
        spec: dict[str, Any] = {"containers": [{"name": "server", "image": "llm-vitals-test/none",
                                                "ports": [{"name": port_name, "containerPort": port}]}]}
        if node:
            spec["nodeName"] = node
        metadata: dict[str, Any] = {"name": name, "namespace": namespace, "labels": dict(labels or {})}
        if owners:
            metadata["ownerReferences"] = [dict(owner) for owner in owners]
        return self.request("POST", f"/api/v1/namespaces/{namespace}/pods", {
            "apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec})

    def bind_pod(self, namespace: str, pod: str, node: str) -> None:
        """Play the scheduler: bind an unbound pod to `node` (the pods/binding subresource sets spec.nodeName)."""
        self.request("POST", f"/api/v1/namespaces/{namespace}/pods/{pod}/binding", {
            "apiVersion": "v1", "kind": "Binding", "metadata": {"name": pod},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node}})

    def play_kubelet(self, namespace: str, pod: str, *, ip: str = "127.0.0.1", ready: bool = True) -> dict[str, Any]:
        """Report the pod Running (and Ready) with `podIP`, as its kubelet would: a pods/status patch."""
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        flag = "True" if ready else "False"
        status = {"status": {
            "phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}], "hostIP": "127.0.0.1", "startTime": now,
            "conditions": [{"type": t, "status": flag, "lastTransitionTime": now} for t in ("Ready", "ContainersReady")]
            + [{"type": "Initialized", "status": "True", "lastTransitionTime": now},
               {"type": "PodScheduled", "status": "True", "lastTransitionTime": now}],
            "containerStatuses": [{"name": "server", "ready": ready, "restartCount": 0, "image": "llm-vitals-test/none",
                                   "imageID": "", "state": {"running": {"startedAt": now}}}],
        }}
        return self.request("PATCH", f"/api/v1/namespaces/{namespace}/pods/{pod}/status", status,
                            content_type="application/merge-patch+json")

    def create_node(self, name: str, *, labels: Mapping[str, str] | None = None,
                    conditions: Sequence[Mapping[str, str]] = ()) -> dict[str, Any]:
        """A Node object (nothing runs on it); `conditions` are set through nodes/status."""
        node = self.request("POST", "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node",
                                                     "metadata": {"name": name, "labels": dict(labels or {})}})
        if conditions:
            node = self.set_node_conditions(name, conditions)
        return node

    def set_node_conditions(self, name: str, conditions: Sequence[Mapping[str, str]]) -> dict[str, Any]:
        """Replace the node's status conditions (as a node problem detector would write them)."""
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        full = [{"lastHeartbeatTime": now, "lastTransitionTime": now, **c} for c in conditions]
        return self.request("PATCH", f"/api/v1/nodes/{name}/status", {"status": {"conditions": full}},
                            content_type="application/merge-patch+json")

    # -- what happened --------------------------------------------------------------------------

    def during_outage(self, event: Mapping[str, Any]) -> bool:
        """True when an audit event was received while the API server was stopped or coming back."""
        received = datetime.fromisoformat(event["requestReceivedTimestamp"].replace("Z", "+00:00")).timestamp()
        return any(start <= received <= end for start, end in self.outages)

    def audit(self, *, verb: str | None = None, resource: str | None = None, namespace: str | None = None,
              user: str | None = None, name: str | None = None, stage: str | None = "ResponseComplete",
              ) -> list[dict[str, Any]]:
        """Requests the API server handled, as its audit log has them (`verb`, `user.username`,
        `objectRef`, `responseStatus.code`), filtered. Every user's requests are logged except the
        controller-manager's. Each request appears once, when its answer is complete (a watch when
        it ends); `stage="ResponseStarted"` gives the watches that started, None every record."""
        events = []
        try:
            lines = self.audit_log.read_text().splitlines()
        except FileNotFoundError:
            return []
        for line in lines:
            with contextlib.suppress(ValueError):
                event = json.loads(line)
                ref = event.get("objectRef") or {}
                if ((stage is None or event.get("stage") == stage)
                        and (verb is None or event.get("verb") == verb)
                        and (resource is None or ref.get("resource") == resource)
                        and (namespace is None or ref.get("namespace") == namespace)
                        and (name is None or ref.get("name") == name)
                        and (user is None or (event.get("user") or {}).get("username") == user)):
                    events.append(event)
        return events
