"""A real two-node Kubernetes 1.20.2 cluster, each node a network namespace of its own, started and
stopped by PID: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, and per node its own
dockerd (with its containerd) and a kubelet with its built-in dockershim.

Built by tools/real-kubelet-setup.sh (cached outside the clone); the layout follows the kubelet
fixture recipe (../shared/fixtures/kubelet/RECIPE.md), with one change: each node has a network
namespace of its own instead of all nodes sharing one. A hostNetwork pod then has its node's
loopback, as on real nodes, so the shipped pod template's `127.0.0.1:8000` and `0.0.0.0:9471` mean
the same on every node, and a pod that moves to node 2 never meets its old copy's ports on node 1.

    netns lvk-hub:  lo 127.0.0.1 (etcd :22379, kube-apiserver :443 on every address),
                    lo 10.213.1.1 (the `kubernetes` Service's ClusterIP: in-cluster config works
                    unchanged without kube-proxy), br0 10.213.0.254/24 (the nodes' segment)
    netns lvk-nN:   eth0 10.213.0.N/24 (veth, its peer enslaved to br0), route 10.213.1.0/24 via .254;
                    dockerd-nN (unix socket in the run dir) -> containerd -> the node's pods (hostNetwork);
                    kubelet on 10.213.0.N:10250 (name = InternalIP = hostNetwork pod IP)
    host:           nothing listens but the forwarders (nsfwd.py, 127.0.0.1 only); the route
                    `unreachable 10.213.0.0/23` makes a host-side client fail at once instead of
                    leaking to the default gateway (recipe trap 1)

What it changes on the host, every change recorded in the run dir and undone by `stop_run` (also the
tier's backstop, `python tests/kubelet/cluster.py stop RUN_DIR`, when pytest itself dies): the three
network namespaces (and /run/netns when it made it), the guard route, the kernel sysctls the kubelet
sets at each start (global: vm.overcommit_memory, kernel.panic, kernel.panic_on_oops), the cgroups
/lvk-nN and /lvk-docker-nN in every hierarchy, the mounts under the run dir, and /var/log/pods and
/var/log/containers (mount targets of each kubelet's private mount namespace). `leftovers()` says
what of it is still there; the tier's teardown asserts it is nothing.

Every daemon runs at nice 10 (its session's autogroup too), below the test process that judges it;
the pods inherit it from their dockerd.
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
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

VERSION = "1.20.2"
PREFIX = "lvk"
HUB = f"{PREFIX}-hub"
NET = "10.213.0"
HUB_IP = f"{NET}.254"
SERVICE_CIDR = "10.213.1.0/24"
API_SERVICE_IP = "10.213.1.1"  # the first address of SERVICE_CIDR: the `kubernetes` Service's ClusterIP
GUARD_ROUTE = "10.213.0.0/23"  # both ranges above
API_PORT = 443  # the `kubernetes` Service's port, so its ClusterIP reaches the apiserver as it is
ETCD_PORT = 22379
PAUSE_IMAGE = "llm-vitals-test/pause:3.2"
NICENESS = 10
# Global (not per namespace) kernel settings the kubelet writes at every start; saved once, restored at stop.
SYSCTLS = ("vm.overcommit_memory", "vm.panic_on_oom", "kernel.panic", "kernel.panic_on_oops",
           "kernel.keys.root_maxkeys", "kernel.keys.root_maxbytes")
LOG_DIRS = ("/var/log/pods", "/var/log/containers")
# Fixed host paths a kubelet or dockerd makes whatever its flags say: the device plugin manager's
# socket dir (hardcoded in 1.20) and containerd's shim socket dir. Removed after the run if the run
# made them (and, for the shared socket dir, only once empty).
HOST_PATHS = ("/var/lib/kubelet", "/run/containerd")
# What the teardown checks is gone unless it was there before (the dockershim socket's default path
# included: the kubelets are given their own, so it must never appear).
WATCHED_PATHS = (*LOG_DIRS, *HOST_PATHS, "/var/run/dockershim.sock")
DOCKER = "/usr/bin/docker"  # Debian's CLI: the daemon's own version
HERE = Path(__file__).resolve().parent


class ClusterError(RuntimeError):
    """A component did not start or a request failed; the message carries the evidence (log tails)."""


@dataclass(frozen=True)
class Binaries:
    """Where tools/real-kubelet-setup.sh put everything (its last line, handed over by the test script)."""

    kube_bin: Path  # kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kubectl, pause
    etcd: str = "/usr/bin/etcd"
    dockerd: str = "/usr/sbin/dockerd"

    def missing(self) -> str | None:
        for path in (*(self.kube_bin / n for n in ("kube-apiserver", "kube-controller-manager", "kube-scheduler",
                                                   "kubelet", "kubectl", "pause")),
                     Path(self.etcd), Path(self.dockerd), Path(DOCKER)):
            if not os.access(path, os.X_OK):
                return f"no {path}; run `bash tools/real-kubelet-setup.sh` (or `make test-kubelet`)"
        for tool in ("ip", "nsenter", "unshare", "openssl", "mount"):
            if shutil.which(tool) is None:
                return f"no {tool} on PATH"
        return None


def netns_path(name: str) -> str:
    return f"/run/netns/{name}"


def node_netns(n: int) -> str:
    return f"{PREFIX}-n{n}"


def node_ip(n: int) -> str:
    return f"{NET}.{n}"


def _run(*argv: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise ClusterError(f"{' '.join(argv)}: exit {result.returncode}: {result.stderr.strip() or result.stdout.strip()}")
    return result


def _lower_priority_and_die_with_parent() -> None:
    """In the child before exec: nice 10, and SIGTERM when the test process dies (the wrapper's
    backstop stop then finds the rest by the recorded PIDs)."""
    with contextlib.suppress(Exception):
        os.nice(NICENESS)
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)


def _preexec() -> Callable[[], None] | None:
    # PR_SET_PDEATHSIG fires when the *thread* that started the child exits: only the main thread's.
    if threading.current_thread() is threading.main_thread():
        return _lower_priority_and_die_with_parent
    return lambda: os.nice(NICENESS)


def _state(pid: int) -> str | None:
    """The process state letter, None when gone. Our daemons' parent reaps late: Z counts as gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _running(pid: int) -> bool:
    return _state(pid) not in (None, "Z")


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


class Cluster:
    """The control plane in netns lvk-hub and `nodes` nodes, each in its own netns, under `run_dir`."""

    def __init__(self, run_dir: Path, binaries: Binaries, *, nodes: int = 2, start_timeout: float = 180.0):
        self.run = Path(run_dir)
        self.bins = binaries
        self.nodes = nodes
        self.start_timeout = start_timeout
        self.pki = self.run / "pki"
        self.logs = self.run / "logs"
        self.pids = self.run / "pids"
        self.api_url = ""  # https://127.0.0.1:<forwarder port> on the host
        self._tokens: dict[str, str] = {}
        self._forwards: dict[tuple[str, int], int] = {}
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._tls: ssl.SSLContext | None = None
        self.timings: dict[str, float] = {}
        self.stop_notes: list[str] = []

    # -- lifetime ---------------------------------------------------------------------------------

    def start(self) -> Cluster:
        for d in (self.pki, self.logs, self.pids):
            d.mkdir(parents=True, exist_ok=True)
        try:
            began = time.monotonic()
            self._network()
            self._credentials()
            self._control_plane()
            self.timings["control plane"] = round(time.monotonic() - began, 1)
            began = time.monotonic()
            self._save_host_state()
            with ThreadPoolExecutor(self.nodes) as pool:
                list(pool.map(self._start_node, range(1, self.nodes + 1)))
            self.timings["nodes Ready"] = round(time.monotonic() - began, 1)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> list[str]:
        """Stop everything by its recorded PID and undo every host change; what is left over (empty: nothing)."""
        began = time.monotonic()
        self.stop_notes = stop_run(self.run, remove=False)
        left = leftovers(self.run)
        shutil.rmtree(self.run, ignore_errors=True)
        self.timings["stop"] = round(time.monotonic() - began, 1)
        return left

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the network --------------------------------------------------------------------------------

    def _network(self) -> None:
        if not Path("/run/netns").is_dir() or not _run("findmnt", "-rn", "--mountpoint", "/run/netns", check=False).stdout:
            (self.run / "created-run-netns").touch()
        for name in [HUB, *(node_netns(n) for n in range(1, self.nodes + 1))]:
            if Path(netns_path(name)).exists():
                raise ClusterError(f"network namespace {name} exists already: another run, or a leftover "
                                   f"(`python tests/kubelet/cluster.py stop RUN_DIR` of that run removes it)")
            _run("ip", "netns", "add", name)
            with open(self.run / "created-netns", "a") as f:
                f.write(name + "\n")
        hub = ("ip", "-n", HUB)
        _run(*hub, "link", "set", "lo", "up")
        _run(*hub, "addr", "add", f"{API_SERVICE_IP}/32", "dev", "lo")
        _run(*hub, "link", "add", "br0", "type", "bridge")
        _run(*hub, "addr", "add", f"{HUB_IP}/24", "dev", "br0")
        _run(*hub, "link", "set", "br0", "up")
        for n in range(1, self.nodes + 1):
            node = ("ip", "-n", node_netns(n))
            _run(*hub, "link", "add", f"vn{n}", "type", "veth", "peer", "name", "eth0", "netns", node_netns(n))
            _run(*hub, "link", "set", f"vn{n}", "master", "br0")
            _run(*hub, "link", "set", f"vn{n}", "up")
            _run(*node, "link", "set", "lo", "up")
            _run(*node, "addr", "add", f"{node_ip(n)}/24", "dev", "eth0")
            _run(*node, "link", "set", "eth0", "up")
            _run(*node, "route", "add", SERVICE_CIDR, "via", HUB_IP)
        if "unreachable" not in _run("ip", "route", "show", GUARD_ROUTE, check=False).stdout:
            _run("ip", "route", "add", "unreachable", GUARD_ROUTE)
            (self.run / "guard-route").write_text(GUARD_ROUTE + "\n")

    # -- credentials ---------------------------------------------------------------------------------

    def _credentials(self) -> None:
        p = self.pki

        def openssl(*args: str) -> None:
            _run("openssl", *args)

        openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=llm-vitals-kubelet-ca",
                "-keyout", str(p / "ca.key"), "-out", str(p / "ca.crt"))
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=kube-apiserver",
                "-keyout", str(p / "apiserver.key"), "-out", str(p / "apiserver.csr"))
        (p / "ext.cnf").write_text(
            f"subjectAltName=IP:127.0.0.1,IP:{HUB_IP},IP:{API_SERVICE_IP},DNS:localhost,DNS:kubernetes,"
            "DNS:kubernetes.default,DNS:kubernetes.default.svc\nextendedKeyUsage=serverAuth\n")
        openssl("x509", "-req", "-in", str(p / "apiserver.csr"), "-CA", str(p / "ca.crt"), "-CAkey", str(p / "ca.key"),
                "-CAcreateserial", "-days", "2", "-extfile", str(p / "ext.cnf"), "-out", str(p / "apiserver.crt"))
        openssl("genrsa", "-out", str(p / "sa.key"), "2048")
        openssl("rsa", "-in", str(p / "sa.key"), "-pubout", "-out", str(p / "sa.pub"))
        # The controller-manager acts as itself (--use-service-account-credentials=false): it needs every
        # controller's rights, as in the recipe.
        users = {"admin": "system:masters", "system:kube-controller-manager": "system:masters", "system:kube-scheduler": ""}
        users |= {f"system:node:{node_ip(n)}": "system:nodes" for n in range(1, self.nodes + 1)}
        self._tokens = {user: secrets.token_hex(24) for user in users}
        lines = [f'{self._tokens[u]},{u},uid-{i}' + (f',"{g}"' if g else "") for i, (u, g) in enumerate(users.items())]
        (p / "tokens.csv").write_text("\n".join(lines) + "\n")
        for secret in ("ca.key", "apiserver.key", "sa.key", "tokens.csv"):
            (p / secret).chmod(0o600)

    def kubeconfig(self, user: str, server: str) -> Path:
        """A kubeconfig for `user` (a static token) pointed at `server`, written once (drill threads
        read it concurrently: rewriting it on each call once gave a kubectl an empty file)."""
        path = self.run / f"kubeconfig-{user.replace(':', '-')}-{abs(hash(server)) % 10000}"
        if path.exists():
            return path
        doc = {"apiVersion": "v1", "kind": "Config",
               "clusters": [{"name": "lvk", "cluster": {"server": server, "certificate-authority": str(self.pki / "ca.crt")}}],
               "users": [{"name": "u", "user": {"token": self._tokens[user]}}],
               "contexts": [{"name": "lvk", "context": {"cluster": "lvk", "user": "u", "namespace": "default"}}],
               "current-context": "lvk"}
        partial = path.with_name(f"{path.name}.{threading.get_ident()}")
        partial.write_text(json.dumps(doc, indent=1))
        partial.chmod(0o600)
        partial.replace(path)  # atomic: a reader sees the whole file or none
        return path

    @property
    def admin_kubeconfig(self) -> Path:
        """The host-side admin kubeconfig (through the API forwarder)."""
        return self.kubeconfig("admin", self.api_url)

    @property
    def ca_file(self) -> Path:
        return self.pki / "ca.crt"

    # -- processes ----------------------------------------------------------------------------------

    def _daemon(self, name: str, netns: str | None, argv: Sequence[str], expect: str) -> subprocess.Popen[bytes]:
        """Start one daemon in `netns` (nsenter --net: the host's mount namespace stays), in its own
        session at nice 10; its PID and what its cmdline must hold go to pids/NAME.pid."""
        full = ["nsenter", f"--net={netns_path(netns)}", *argv] if netns else list(argv)
        with open(self.logs / f"{name}.log", "ab") as log:
            proc = subprocess.Popen(full, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True, preexec_fn=_preexec())
        with contextlib.suppress(OSError):
            Path(f"/proc/{proc.pid}/autogroup").write_text(f"{NICENESS}\n")
        (self.pids / f"{name}.pid").write_text(f"{proc.pid}\n{expect}\n")
        self._procs[name] = proc
        return proc

    def _wait(self, name: str, ready: Callable[[], Any], what: str, timeout: float | None = None) -> None:
        proc = self._procs[name]
        deadline = time.monotonic() + (timeout or self.start_timeout)
        last: object = None
        while True:
            if proc.poll() is not None:
                raise ClusterError(f"{name} exited ({proc.returncode}) before {what}\n{self.tail(name)}")
            try:
                if ready():
                    return
            except (httpx.HTTPError, OSError, ValueError, ClusterError) as exc:
                last = exc
            if time.monotonic() > deadline:
                raise ClusterError(f"no {what} after {timeout or self.start_timeout:g}s (last: {last!r})\n{self.tail(name)}")
            time.sleep(0.25)

    def tail(self, name: str, lines: int = 30) -> str:
        try:
            text = (self.logs / f"{name}.log").read_text(errors="replace")
        except OSError:
            text = ""
        return f"--- {name} ---\n" + "\n".join(text.splitlines()[-lines:])

    def forward(self, host: str, port: int) -> int:
        """A host loopback port whose connections are made to host:port inside the cluster's namespace
        (one forwarder process per route, kept until stop)."""
        key = (host, port)
        if key not in self._forwards:
            local = _free_port()
            name = f"nsfwd-{host}-{port}"
            proc = self._daemon(name, None, [sys.executable, str(HERE / "nsfwd.py"), netns_path(HUB),
                                             f"{local}:{host}:{port}"], "nsfwd.py")
            deadline = time.monotonic() + 20
            while "forwarding" not in (self.logs / f"{name}.log").read_text(errors="replace"):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise ClusterError(f"forwarder to {host}:{port} did not start\n{self.tail(name)}")
                time.sleep(0.05)
            self._forwards[key] = local
        return self._forwards[key]

    # -- the control plane ----------------------------------------------------------------------------

    def _control_plane(self) -> None:
        p, kb = self.pki, self.bins.kube_bin
        etcd_url = f"http://127.0.0.1:{ETCD_PORT}"
        self._daemon("etcd", HUB, [
            self.bins.etcd, "--name", "lvk", "--data-dir", str(self.run / "etcd-data"),
            "--listen-client-urls", etcd_url, "--advertise-client-urls", etcd_url,
            "--listen-peer-urls", f"http://127.0.0.1:{ETCD_PORT + 1}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{ETCD_PORT + 1}",
            "--initial-cluster", f"lvk=http://127.0.0.1:{ETCD_PORT + 1}"], "etcd")
        self._daemon("kube-apiserver", HUB, [
            str(kb / "kube-apiserver"), f"--etcd-servers={etcd_url}",
            # Every address of the hub: 127.0.0.1 for the control plane, 10.213.0.254 for the
            # kubelets, 10.213.1.1 (the `kubernetes` ClusterIP) for in-cluster clients.
            "--bind-address=0.0.0.0", f"--advertise-address={HUB_IP}", f"--secure-port={API_PORT}", "--insecure-port=0",
            f"--tls-cert-file={p / 'apiserver.crt'}", f"--tls-private-key-file={p / 'apiserver.key'}",
            f"--client-ca-file={p / 'ca.crt'}", f"--token-auth-file={p / 'tokens.csv'}",
            "--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-key-file={p / 'sa.pub'}", f"--service-account-signing-key-file={p / 'sa.key'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            # No controller writes the `kubernetes` Endpoints (nothing reads them: clients use the ClusterIP,
            # which is the hub's own address here).
            "--endpoint-reconciler-type=none",
            "--kubelet-preferred-address-types=InternalIP",
            "--profiling=false", "--v=1"], "kube-apiserver")
        self.api_url = f"https://127.0.0.1:{self.forward('127.0.0.1', API_PORT)}"

        def ready() -> bool:
            with self.client() as client:
                return client.get("/readyz").status_code == 200

        self._wait("kube-apiserver", ready, "kube-apiserver /readyz")
        inside = f"https://127.0.0.1:{API_PORT}"
        self._daemon("kube-controller-manager", HUB, [
            str(kb / "kube-controller-manager"),
            f"--kubeconfig={self.kubeconfig('system:kube-controller-manager', inside)}",
            "--port=0", "--secure-port=0",
            f"--service-account-private-key-file={p / 'sa.key'}", f"--root-ca-file={p / 'ca.crt'}",
            "--use-service-account-credentials=false", "--leader-elect=false", "--v=1"], "kube-controller-manager")

        def default_account() -> bool:
            with self.client() as client:
                return client.get("/api/v1/namespaces/default/serviceaccounts/default").status_code == 200

        self._wait("kube-controller-manager", default_account, "the default ServiceAccount")
        self._daemon("kube-scheduler", HUB, [
            str(self.bins.kube_bin / "kube-scheduler"),
            f"--kubeconfig={self.kubeconfig('system:kube-scheduler', inside)}",
            "--port=0", "--secure-port=0", "--leader-elect=false", "--v=1"], "kube-scheduler")

    # -- nodes ----------------------------------------------------------------------------------------

    def _save_host_state(self) -> None:
        saved = {k: _run("sysctl", "-n", k).stdout.strip() for k in SYSCTLS}
        (self.run / "sysctl.saved").write_text(json.dumps(saved))
        (self.run / "preexisting").write_text("\n".join(d for d in WATCHED_PATHS if os.path.exists(d)) + "\n")
        for d in LOG_DIRS:
            os.makedirs(d, exist_ok=True)

    def docker_argv(self, n: int, *args: str) -> list[str]:
        return [DOCKER, "-H", f"unix://{self.run / f'n{n}' / 'docker.sock'}", *args]

    def docker(self, n: int, *args: str, check: bool = True, timeout: float = 300,
               stdin: Any = None) -> subprocess.CompletedProcess[str]:
        """The docker CLI against node `n`'s own dockerd."""
        argv = self.docker_argv(n, *args)
        result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=stdin)
        if check and result.returncode != 0:
            raise ClusterError(f"docker {' '.join(args)} on node {n}: exit {result.returncode}: {result.stderr[-2000:]}")
        return result

    def _start_node(self, n: int) -> None:
        ip, ns, d = node_ip(n), node_netns(n), self.run / f"n{n}"
        d.mkdir(parents=True, exist_ok=True)
        began = time.monotonic()
        # The node's images and containers in memory: loading the image is quicker, and the stop
        # unmounts them at once instead of deleting tens of thousands of files on a loaded disk.
        (d / "docker").mkdir()
        _run("mount", "-t", "tmpfs", "-o", "size=3g,mode=0711", f"lvk-docker-n{n}", str(d / "docker"))
        # Its own daemon (socket, data root, exec root, pid file), in the node's namespace, so that
        # "host network" containers share the node's network. No bridge, firewall or sysctl changes.
        self._daemon(f"dockerd-n{n}", ns, [
            self.bins.dockerd, "--host", f"unix://{d / 'docker.sock'}", "--data-root", str(d / "docker"),
            "--exec-root", str(d / "dexec"), "--pidfile", str(d / "dockerd.pid"),
            "--bridge=none", "--iptables=false", "--ip6tables=false", "--ip-forward=false", "--ip-masq=false",
            "--exec-opt", "native.cgroupdriver=cgroupfs", "--cgroup-parent", f"/{PREFIX}-docker-n{n}",
            "--log-driver=json-file"], self.bins.dockerd)
        self._wait(f"dockerd-n{n}", lambda: self.docker(n, "info", check=False, timeout=10).returncode == 0,
                   f"dockerd of node {n}", timeout=120)
        pause = subprocess.Popen(["tar", "-C", str(self.bins.kube_bin), "-cf", "-", "pause"], stdout=subprocess.PIPE)
        self.docker(n, "import", "-c", 'ENTRYPOINT ["/pause"]', "-", PAUSE_IMAGE, stdin=pause.stdout)
        pause.wait()
        # One cgroup root per node in every v1 hierarchy: two kubelets sharing /kubepods SIGKILL each
        # other's pods as orphans (recipe). cpuset needs its cpus and mems copied down.
        for h in Path("/sys/fs/cgroup").iterdir():
            if not (h / "cgroup.procs").exists():
                continue
            own = h / f"{PREFIX}-n{n}"
            own.mkdir(exist_ok=True)
            if (h / "cpuset.cpus").exists():
                (own / "cpuset.cpus").write_text((h / "cpuset.cpus").read_text())
                (own / "cpuset.mems").write_text((h / "cpuset.mems").read_text())
        server = f"https://{HUB_IP}:{API_PORT}"
        root = d / "kubelet"
        for sub in (root, d / "var-log-pods", d / "var-log-containers"):
            sub.mkdir(parents=True, exist_ok=True)
        # The root dir an rshared mount of its own, so the volume mounts the kubelet makes in its
        # private mount namespace (secret tmpfs) still reach dockerd in the host's.
        _run("mount", "--bind", str(root), str(root))
        _run("mount", "--make-rshared", str(root))
        args = [
            f"--kubeconfig={self.kubeconfig(f'system:node:{ip}', server)}",
            f"--hostname-override={ip}", f"--node-ip={ip}",
            f"--address={ip}", "--port=10250", "--read-only-port=0",
            f"--healthz-bind-address={ip}", "--healthz-port=10248",
            f"--root-dir={root}", f"--cert-dir={root / 'pki'}", f"--volume-plugin-dir={root / 'volume-plugins'}",
            "--container-runtime=docker", f"--docker-endpoint=unix://{d / 'docker.sock'}",
            # The dockershim's own CRI socket. Its default, /var/run/dockershim.sock, is one path for
            # both kubelets: the second to start takes it over, and then both kubelets run their pods
            # through node 1's dockershim and dockerd (seen: node 2's pods in node 1's daemon).
            f"--container-runtime-endpoint=unix://{d / 'dockershim.sock'}",
            f"--image-service-endpoint=unix://{d / 'dockershim.sock'}",
            f"--experimental-dockershim-root-directory={d / 'dockershim'}",
            f"--docker=unix://{d / 'docker.sock'}",  # cadvisor's; without it /stats/summary lists no pod
            f"--pod-infra-container-image={PAUSE_IMAGE}",
            "--cgroup-driver=cgroupfs", "--cgroups-per-qos=true", f"--cgroup-root=/{PREFIX}-n{n}",
            "--make-iptables-util-chains=false", "--hairpin-mode=none", "--fail-swap-on=false", "--v=1",
        ]
        # /var/log/pods and /var/log/containers are fixed paths and each kubelet's GC deletes pod log
        # dirs it does not know: each kubelet gets its own mount namespace with its own two bound there.
        self._daemon(f"kubelet-n{n}", ns, [
            "unshare", "--mount", "--propagation", "unchanged", "sh", "-c",
            'mount --bind "$1" /var/log/pods && mount --bind "$2" /var/log/containers && shift 2 && exec "$@"',
            "sh", str(d / "var-log-pods"), str(d / "var-log-containers"),
            str(self.bins.kube_bin / "kubelet"), *args], str(self.bins.kube_bin / "kubelet"))

        def node_ready() -> bool:
            with self.client() as client:
                node = client.get(f"/api/v1/nodes/{ip}")
                if node.status_code != 200:
                    return False
                return any(c["type"] == "Ready" and c["status"] == "True" for c in node.json()["status"]["conditions"])

        self._wait(f"kubelet-n{n}", node_ready, f"node {ip} Ready")
        self.timings[f"node {n} Ready"] = round(time.monotonic() - began, 1)

    # -- clients ----------------------------------------------------------------------------------------

    def client(self) -> httpx.Client:
        """An admin JSON client on the host, through the API forwarder; close it (or use `with`)."""
        if self._tls is None:
            self._tls = ssl.create_default_context(cafile=str(self.ca_file))
        return httpx.Client(base_url=self.api_url, verify=self._tls, trust_env=False, timeout=30,
                            headers={"Authorization": f"Bearer {self._tokens['admin']}", "Accept": "application/json"})

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True,
                timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """The built kubectl 1.20 on the host, as admin, through the API forwarder."""
        argv = [str(self.bins.kube_bin / "kubectl"), f"--kubeconfig={self.admin_kubeconfig}", *args]
        result = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=timeout)
        if check and result.returncode != 0:
            raise ClusterError(f"kubectl {' '.join(args)}: exit {result.returncode}: {result.stderr[-3000:]}")
        return result


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- stopping: by the files in the run dir alone, so the tier's backstop can call it too ---------------

def _stop_pid(pid_file: Path, timeout: float = 30.0) -> str | None:
    try:
        pid_text, expect = pid_file.read_text().splitlines()[:2]
        pid = int(pid_text)
    except (OSError, ValueError):
        return None
    said = None
    if _running(pid) and expect in _cmdline(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while _running(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _running(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            said = f"killed {pid_file.stem} (pid {pid})"
    pid_file.unlink(missing_ok=True)
    return said


def _kill_node_containers(run: Path, n: str) -> None:
    """dockerd's TERM waits out each container's stop timeout (recipe trap 15): kill them first."""
    sock = run / f"n{n}" / "docker.sock"
    if not sock.is_socket():
        return
    host = f"unix://{sock}"
    ids = subprocess.run([DOCKER, "-H", host, "ps", "-q"], capture_output=True, text=True, timeout=30).stdout.split()
    if ids:
        subprocess.run([DOCKER, "-H", host, "kill", *ids], capture_output=True, timeout=60)


def _strays(run: Path) -> list[int]:
    """Running processes other than this one whose command line names the run dir."""
    marker = str(run)
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != os.getpid() and marker in _cmdline(int(proc.name)) \
                and _running(int(proc.name)):
            found.append(int(proc.name))
    return found


def _stop_strays(run: Path, grace: float = 10.0) -> list[str]:
    """Give the daemons' children `grace` seconds to exit on their own, then TERM and KILL each by PID."""
    deadline = time.monotonic() + grace
    while (left := _strays(run)) and time.monotonic() < deadline:
        time.sleep(0.2)
    said = []
    for pid in left:
        said.append(f"stopped stray {pid}: {_cmdline(pid)[:100]}")
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 5
    while (still := [p for p in left if _running(p)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in still:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return said


def stop_run(run: Path, *, remove: bool = True) -> list[str]:
    """Stop every daemon recorded under `run` (kubelets, then each node's containers and dockerd,
    then forwarders and the control plane) and undo each recorded host change. Safe to call twice."""
    said: list[str] = []
    pids = run / "pids"
    if pids.is_dir():
        for f in sorted(pids.glob("kubelet-n*.pid")):
            said.append(_stop_pid(f) or "")
        nodes = sorted({p.stem.removeprefix("dockerd-n") for p in pids.glob("dockerd-n*.pid")})

        def stop_node(n: str) -> None:
            with contextlib.suppress(Exception):
                _kill_node_containers(run, n)
            said.append(_stop_pid(pids / f"dockerd-n{n}.pid", timeout=60) or "")

        with ThreadPoolExecutor(max(1, len(nodes))) as pool:
            list(pool.map(stop_node, nodes))
        for f in sorted(pids.glob("nsfwd-*.pid")):
            said.append(_stop_pid(f) or "")
        for name in ("kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"):
            said.append(_stop_pid(pids / f"{name}.pid") or "")
        # A containerd shim can outlive its dockerd (seen once, after a container whose process was
        # frozen by ptrace was killed): whatever still names this run dir was started by our daemons.
        said += _stop_strays(run)
    # Mounts under the run dir: kubelet root binds, secret tmpfs, docker overlays, shm, netns binds.
    mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
    for target in sorted((m for m in mounts if m.startswith(f"{run}/")), reverse=True):
        if subprocess.run(["umount", target], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", target], capture_output=True)
    saved_file = run / "sysctl.saved"
    if saved_file.exists():
        for key, value in json.loads(saved_file.read_text()).items():
            if _run("sysctl", "-n", key, check=False).stdout.strip() != value:
                _run("sysctl", "-q", "-w", f"{key}={value}", check=False)
                said.append(f"restored {key}={value}")
        saved_file.unlink()
    for h in Path("/sys/fs/cgroup").iterdir():
        for top in sorted(h.glob(f"{PREFIX}-n*")) + sorted(h.glob(f"{PREFIX}-docker-n*")):
            for d in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
                with contextlib.suppress(OSError):
                    d.rmdir()
            with contextlib.suppress(OSError):
                top.rmdir()
    preexisting = run / "preexisting"
    if preexisting.exists():
        kept = set(preexisting.read_text().split())
        (run / "preexisting.done").write_text(preexisting.read_text())
        for d in LOG_DIRS:
            if d not in kept:
                with contextlib.suppress(OSError):
                    os.rmdir(d)
        if "/var/lib/kubelet" not in kept:
            # Only the device plugin manager's socket and marker: nothing else is ever put there.
            plugins = Path("/var/lib/kubelet/device-plugins")
            for name in ("kubelet.sock", "DEPRECATION"):
                (plugins / name).unlink(missing_ok=True)
            for d in (plugins, plugins.parent):
                with contextlib.suppress(OSError):
                    d.rmdir()
        if "/run/containerd" not in kept:
            for d in (Path("/run/containerd/s"), Path("/run/containerd")):
                with contextlib.suppress(OSError):
                    d.rmdir()  # empty only: another dockerd on the machine may have shims there
        preexisting.unlink()
    guard = run / "guard-route"
    if guard.exists():
        _run("ip", "route", "del", "unreachable", guard.read_text().strip(), check=False)
        guard.unlink()
    created = run / "created-netns"
    if created.exists():
        for name in created.read_text().split():
            left = _run("ip", "netns", "pids", name, check=False).stdout.split()
            if left:
                said.append(f"still in netns {name}: " + "; ".join(f"{p} {_cmdline(int(p))[:80]}" for p in left))
            _run("ip", "netns", "del", name, check=False)
        created.unlink()
    if (run / "created-run-netns").exists() and Path("/run/netns").is_dir() and not any(Path("/run/netns").iterdir()):
        subprocess.run(["umount", "/run/netns"], capture_output=True)
        with contextlib.suppress(OSError):
            os.rmdir("/run/netns")
        (run / "created-run-netns").unlink()
    if remove:
        shutil.rmtree(run, ignore_errors=True)
    return [s for s in said if s]


def leftovers(run: Path) -> list[str]:
    """What of a run is still on the machine after `stop_run`: processes, mounts, netns, cgroups,
    the guard route, changed sysctls. Empty when nothing is left."""
    marker = str(run)
    found = [f"process {pid}: {_cmdline(pid)[:120]}" for pid in _strays(run)]
    for line in Path("/proc/mounts").read_text().splitlines():
        if line.split()[1].startswith(marker):
            found.append(f"mount {line.split()[1]}")
    names = _run("ip", "netns", "list", check=False).stdout
    found += [f"netns {line.split()[0]}" for line in names.splitlines() if line.startswith(f"{PREFIX}-")]
    if "unreachable" in _run("ip", "route", "show", GUARD_ROUTE, check=False).stdout and (run / "guard-route").exists():
        found.append(f"route unreachable {GUARD_ROUTE}")
    for h in Path("/sys/fs/cgroup").iterdir():
        found += [f"cgroup {p}" for p in h.glob(f"{PREFIX}-*")]
    # Made by the run and not removed (their state before the run is in `preexisting` until stop_run,
    # which also removes them: so here, after it, they must be gone unless they were there before).
    if (run / "preexisting.done").exists():  # else the run never got to start a node
        kept = set((run / "preexisting.done").read_text().split())
        found += [f"path {p}" for p in WATCHED_PATHS if os.path.exists(p) and p not in kept]
    return found


if __name__ == "__main__":
    # The tier's backstop: `python tests/kubelet/cluster.py stop RUN_DIR` after pytest, whatever happened.
    if len(sys.argv) != 3 or sys.argv[1] != "stop":
        sys.exit("usage: cluster.py stop RUN_DIR")
    target = Path(sys.argv[2])
    for line in stop_run(target, remove=False):
        print(line)
    remaining = leftovers(target)
    shutil.rmtree(target, ignore_errors=True)
    for line in remaining:
        print(f"LEFT OVER: {line}")
    sys.exit(1 if remaining else 0)
