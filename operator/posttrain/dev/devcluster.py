"""A real local Kubernetes control plane for tests and people: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and kwok with simulated GPU nodes, all on 127.0.0.1, built by hack/build-k8s.sh.

    with DevCluster(Path(".cluster")) as cluster:      # tests
        cluster.kubeconfig                             # admin kubeconfig (system:masters)

    python -m posttrain.dev.devcluster up --dir .cluster   # people: background, prints `export KUBECONFIG=...`
    python -m posttrain.dev.devcluster down --dir .cluster

Flags follow controller-runtime's envtest (certificates, service-account keys, RBAC) plus what envtest lacks
and a job controller needs: garbage collection, the Job controller, the scheduler, and nodes (kwok).
"""

from __future__ import annotations

import argparse
import atexit
import datetime as dt
import ipaddress
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

from posttrain import reaper
from posttrain.localhost import free_port, stop_group

REPO_ROOT = Path(__file__).resolve().parents[3]
STAGES_FILE = REPO_ROOT / "hack" / "k8s" / "kwok-stages.yaml"
REQUIRED_BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
# A test ends a running kwok pod by setting this annotation to its exit code ("0" succeeds).
KWOK_EXIT_ANNOTATION = "posttrain.dev/kwok-exit"
GPU_RESOURCE = "nvidia.com/gpu"
# Enabled on top of the API server's defaults (which include PodSecurity): the plugin that refuses
# ownerReferences a client may not set, as many production clusters run it.
ADMISSION_PLUGINS = ("OwnerReferencesPermissionEnforcement",)
# No kubelet sends heartbeats, so the node lifecycle controller would taint every node not-ready; the
# cloud and IPAM controllers have nothing to manage here.
DISABLED_CONTROLLERS = (
    "node-lifecycle-controller",
    "cloud-node-lifecycle-controller",
    "node-ipam-controller",
    "service-lb-controller",
    "node-route-controller",
    "persistentvolume-binder-controller",
    "persistentvolume-attach-detach-controller",
)


class ClusterError(RuntimeError):
    """The control plane could not be started; the message says which part and why."""


def binaries_dir() -> Path:
    """KUBEBUILDER_ASSETS (the envtest convention) when set, else the repository's bin/."""
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    return Path(assets) if assets else REPO_ROOT / "bin"


def missing_binaries(directory: Path | None = None) -> list[str]:
    directory = directory or binaries_dir()
    return [b for b in REQUIRED_BINARIES if not os.access(directory / b, os.X_OK)]


def kubectl_path() -> str:
    local = binaries_dir() / "kubectl"
    if os.access(local, os.X_OK):
        return str(local)
    found = shutil.which("kubectl")
    if not found:
        raise ClusterError("kubectl not found: run `make k8s-bins` (it builds bin/kubectl)")
    return found


# ---------------------------------------------------------------------------------------------- certificates


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    path.chmod(0o600)


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _certificate(
    subject: x509.Name,
    public_key: ec.EllipticCurvePublicKey,
    issuer: x509.Name,
    issuer_key: ec.EllipticCurvePrivateKey,
    *,
    ca: bool,
    server: bool = False,
) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=7))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    else:
        usages = [x509.ExtendedKeyUsageOID.SERVER_AUTH] if server else [x509.ExtendedKeyUsageOID.CLIENT_AUTH]
        builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [
                    x509.DNSName("localhost"),
                    x509.DNSName("kubernetes.default.svc"),
                    x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                    x509.IPAddress(ipaddress.ip_address("10.0.0.1")),
                ]
            ),
            critical=False,
        )
    return builder.sign(issuer_key, hashes.SHA256())


def write_certificates(pki: Path) -> None:
    """A tiny CA (serving and client), the API server's serving cert, an admin client cert in
    system:masters, and the service-account signing key pair."""
    pki.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "posttrain-devcluster-ca")])
    _write_key(pki / "ca.key", ca_key)
    _write_cert(pki / "ca.crt", _certificate(ca_name, ca_key.public_key(), ca_name, ca_key, ca=True))

    server_key = ec.generate_private_key(ec.SECP256R1())
    server_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")])
    _write_key(pki / "apiserver.key", server_key)
    _write_cert(
        pki / "apiserver.crt",
        _certificate(server_name, server_key.public_key(), ca_name, ca_key, ca=False, server=True),
    )

    admin_key = ec.generate_private_key(ec.SECP256R1())
    admin_name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:masters"),
            x509.NameAttribute(NameOID.COMMON_NAME, "posttrain-admin"),
        ]
    )
    _write_key(pki / "admin.key", admin_key)
    _write_cert(
        pki / "admin.crt", _certificate(admin_name, admin_key.public_key(), ca_name, ca_key, ca=False)
    )

    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    _write_key(pki / "sa.key", sa_key)
    (pki / "sa.pub").write_bytes(
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )


def kubeconfig_dict(server: str, pki: Path, user: str = "posttrain-admin") -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "posttrain-dev",
                "cluster": {"server": server, "certificate-authority": str(pki / "ca.crt")},
            }
        ],
        "users": [
            {
                "name": user,
                "user": {
                    "client-certificate": str(pki / "admin.crt"),
                    "client-key": str(pki / "admin.key"),
                },
            }
        ],
        "contexts": [{"name": "posttrain-dev", "context": {"cluster": "posttrain-dev", "user": user}}],
        "current-context": "posttrain-dev",
    }


# ---------------------------------------------------------------------------------------------- processes


@dataclass
class DevCluster:
    """Starts the control plane in `workdir` on enter and stops every process it started on exit."""

    workdir: Path
    nodes: int = 4
    gpus_per_node: int = 8
    node_name_prefix: str = "kwok-gpu"
    start_timeout: float = 60.0
    log_to_files: bool = True
    admission_plugins: tuple[str, ...] = ADMISSION_PLUGINS
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)
    ready_seconds: float = 0.0

    @property
    def kubeconfig(self) -> Path:
        return self.workdir / "kubeconfig"

    @property
    def pki(self) -> Path:
        return self.workdir / "pki"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports['apiserver']}"

    def __enter__(self) -> DevCluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---------------------------------------------------------------------------------------- lifecycle

    def start(self) -> None:
        missing = missing_binaries()
        if missing:
            raise ClusterError(
                f"control-plane binaries missing from {binaries_dir()}: {', '.join(missing)}; "
                "run `make k8s-bins` (builds them from the Go module proxy) or set KUBEBUILDER_ASSETS"
            )
        began = time.monotonic()
        if self.workdir.exists():
            shutil.rmtree(self.workdir)
        (self.workdir / "logs").mkdir(parents=True)
        write_certificates(self.pki)
        for name in ("etcd", "etcd-peer", "apiserver", "scheduler", "kwok-server", "kwok-node"):
            self.ports[name] = free_port()
        self.kubeconfig.write_text(yaml.safe_dump(kubeconfig_dict(self.server, self.pki)))

        self._spawn("etcd", self._etcd_args())
        self._wait_http(f"http://127.0.0.1:{self.ports['etcd']}/health", "etcd")
        self._spawn("kube-apiserver", self._apiserver_args())
        self._wait_http(f"{self.server}/readyz", "kube-apiserver", tls=True)
        self._spawn("kube-controller-manager", self._controller_manager_args())
        self._spawn("kube-scheduler", self._scheduler_args())
        self._spawn("kwok", self._kwok_args())
        self._create_nodes()
        self._wait_ready()
        self.ready_seconds = time.monotonic() - began
        (self.workdir / "ports.json").write_text(json.dumps(self.ports))

    def stop(self) -> None:
        # Reverse start order: nodes' controller first, the store last.
        for name in reversed(list(self.processes)):
            proc = self.processes.pop(name)
            stop_group(proc)
            reaper.unwatch(proc.pid)

    # ---------------------------------------------------------------------------------------- arguments

    def _etcd_args(self) -> list[str]:
        port, peer = self.ports["etcd"], self.ports["etcd-peer"]
        return [
            "--name=posttrain-dev",
            f"--data-dir={self.workdir / 'etcd'}",
            f"--listen-client-urls=http://127.0.0.1:{port}",
            f"--advertise-client-urls=http://127.0.0.1:{port}",
            f"--listen-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-cluster=posttrain-dev=http://127.0.0.1:{peer}",
            "--unsafe-no-fsync=true",  # throwaway test data: durability buys nothing, fsync costs seconds
            "--auto-compaction-retention=1",
            "--quota-backend-bytes=4294967296",
            "--log-level=warn",
        ]

    def _apiserver_args(self) -> list[str]:
        pki = self.pki
        return [
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={self.ports['apiserver']}",
            f"--etcd-servers=http://127.0.0.1:{self.ports['etcd']}",
            f"--cert-dir={pki}",
            f"--tls-cert-file={pki / 'apiserver.crt'}",
            f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={pki / 'ca.crt'}",
            "--authorization-mode=RBAC",
            "--service-cluster-ip-range=10.0.0.0/24",
            f"--service-account-issuer=https://127.0.0.1:{self.ports['apiserver']}",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            "--allow-privileged=true",
            *(
                [f"--enable-admission-plugins={','.join(self.admission_plugins)}"]
                if self.admission_plugins
                else []
            ),
            # Loopback is not a valid endpoint for the `kubernetes` Service: do not reconcile it.
            "--endpoint-reconciler-type=none",
            # One test client on 2 cores: flow control only adds latency here.
            "--enable-priority-and-fairness=false",
            "--max-requests-inflight=0",
            "--max-mutating-requests-inflight=0",
            "--v=0",
        ]

    def _controller_manager_args(self) -> list[str]:
        controllers = ",".join(["*", *(f"-{c}" for c in DISABLED_CONTROLLERS)])
        return [
            f"--kubeconfig={self.kubeconfig}",
            f"--authentication-kubeconfig={self.kubeconfig}",
            f"--authorization-kubeconfig={self.kubeconfig}",
            "--secure-port=0",
            "--leader-elect=false",
            f"--controllers={controllers}",
            f"--root-ca-file={self.pki / 'ca.crt'}",
            f"--service-account-private-key-file={self.pki / 'sa.key'}",
            "--use-service-account-credentials=false",
            "--kube-api-qps=500",
            "--kube-api-burst=1000",
            "--concurrent-gc-syncs=20",
            "--v=0",
        ]

    def _scheduler_args(self) -> list[str]:
        return [
            f"--kubeconfig={self.kubeconfig}",
            f"--authentication-kubeconfig={self.kubeconfig}",
            f"--authorization-kubeconfig={self.kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={self.ports['scheduler']}",
            "--leader-elect=false",
            "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics",
            "--v=0",
        ]

    def _kwok_args(self) -> list[str]:
        return [
            f"--kubeconfig={self.kubeconfig}",
            f"--config={STAGES_FILE}",
            "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}=fake",
            "--node-ip=127.0.0.1",
            f"--node-port={self.ports['kwok-node']}",
            f"--server-address=127.0.0.1:{self.ports['kwok-server']}",
            "--cidr=10.1.0.0/16",
            "--node-lease-duration-seconds=0",
        ]

    # ---------------------------------------------------------------------------------------- helpers

    def _spawn(self, name: str, args: list[str]) -> None:
        log = open(self.workdir / "logs" / f"{name}.log", "ab")  # noqa: SIM115 - handed to the child
        env = {**os.environ, "GOMAXPROCS": os.environ.get("POSTTRAIN_CLUSTER_GOMAXPROCS", "2")}
        self.processes[name] = subprocess.Popen(
            [str(binaries_dir() / name), *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,  # its own process group: stopping it never signals the test runner
        )
        reaper.watch(self.processes[name].pid)  # stopped even if this process dies without stop()
        log.close()

    def _check_alive(self) -> None:
        for name, proc in self.processes.items():
            if proc.poll() is not None:
                tail = (self.workdir / "logs" / f"{name}.log").read_text(errors="replace")[-2000:]
                raise ClusterError(f"{name} exited with code {proc.returncode}; last log lines:\n{tail}")

    def _ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        ctx.load_cert_chain(str(self.pki / "admin.crt"), str(self.pki / "admin.key"))
        return ctx

    def _wait_http(self, url: str, what: str, tls: bool = False) -> None:
        deadline = time.monotonic() + self.start_timeout
        ctx = self._ssl_context() if tls else None
        last = ""
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                with urllib.request.urlopen(url, timeout=2, context=ctx) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as err:
                last = str(err)
            time.sleep(0.1)
        raise ClusterError(f"{what} not healthy at {url} after {self.start_timeout:.0f}s: {last}")

    def _api(self, method: str, path: str, body: dict | None = None) -> dict:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(
            f"{self.server}{path}", data=data, method=method, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=10, context=self._ssl_context()) as resp:
            return json.loads(resp.read() or b"{}")

    def node_manifest(self, index: int) -> dict:
        capacity = {"cpu": "96", "memory": "1Ti", "pods": "110", GPU_RESOURCE: str(self.gpus_per_node)}
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": f"{self.node_name_prefix}-{index}",
                "annotations": {KWOK_NODE_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
                "labels": {
                    "type": "kwok",
                    "kubernetes.io/hostname": f"{self.node_name_prefix}-{index}",
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    "nvidia.com/gpu.present": "true",
                },
            },
            "status": {"capacity": capacity, "allocatable": capacity},
        }

    def _create_nodes(self) -> None:
        for index in range(self.nodes):
            self._api("POST", "/api/v1/nodes", self.node_manifest(index))

    def _untaint(self, nodes: list[dict]) -> None:
        """The API server's TaintNodesByCondition admission taints new nodes not-ready; the node lifecycle
        controller that would lift it is off (no kubelet heartbeats), so lift it once kwok made them Ready."""
        for node in nodes:
            if node["spec"].get("taints"):
                self._api_merge_patch(f"/api/v1/nodes/{node['metadata']['name']}", {"spec": {"taints": None}})

    def _api_merge_patch(self, path: str, body: dict) -> dict:
        req = urllib.request.Request(
            f"{self.server}{path}",
            data=json.dumps(body).encode(),
            method="PATCH",
            headers={"Content-Type": "application/merge-patch+json"},
        )
        with urllib.request.urlopen(req, timeout=10, context=self._ssl_context()) as resp:
            return json.loads(resp.read() or b"{}")

    def _wait_ready(self) -> None:
        """Ready means: every node Ready with its GPUs, and the default ServiceAccount exists (pods can be
        admitted)."""
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            self._check_alive()
            nodes = self._api("GET", "/api/v1/nodes").get("items", [])
            ready = [
                n
                for n in nodes
                if any(
                    c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions", [])
                )
                and n["status"].get("allocatable", {}).get(GPU_RESOURCE) == str(self.gpus_per_node)
            ]
            try:
                self._api("GET", "/api/v1/namespaces/default/serviceaccounts/default")
                has_sa = True
            except urllib.error.HTTPError:
                has_sa = False
            if len(ready) == self.nodes and has_sa:
                self._untaint(ready)
                return
            time.sleep(0.2)
        raise ClusterError(f"cluster not ready after {self.start_timeout:.0f}s (see {self.workdir / 'logs'})")


# ---------------------------------------------------------------------------------------------- CLI


def _serve(args: argparse.Namespace) -> int:
    """Foreground: start, write the pid file, wait for a signal, stop."""
    workdir = Path(args.dir).resolve()
    cluster = DevCluster(workdir, nodes=args.nodes, gpus_per_node=args.gpus_per_node)
    stopping = False

    def on_signal(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    atexit.register(cluster.stop)
    with cluster:
        (workdir / "harness.pid").write_text(str(os.getpid()))
        (workdir / "ready").write_text(f"{cluster.ready_seconds:.1f}\n")
        print(f"cluster ready in {cluster.ready_seconds:.1f}s", flush=True)
        while not stopping:
            time.sleep(0.5)
            cluster._check_alive()
    return 0


def _up(args: argparse.Namespace) -> int:
    workdir = Path(args.dir).resolve()
    pid_file = workdir / "harness.pid"
    if pid_file.exists() and _pid_alive(int(pid_file.read_text())):
        print(f"already running (pid {pid_file.read_text().strip()})")
        print(f"export KUBECONFIG={workdir / 'kubeconfig'}")
        return 0
    workdir.parent.mkdir(parents=True, exist_ok=True)
    log_path = workdir.parent / f"{workdir.name}-harness.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "posttrain.dev.devcluster",
                "serve",
                "--dir",
                str(workdir),
                "--nodes",
                str(args.nodes),
                "--gpus-per-node",
                str(args.gpus_per_node),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            print(log_path.read_text(errors="replace")[-3000:], file=sys.stderr)
            print(f"cluster failed to start (log: {log_path})", file=sys.stderr)
            return 1
        if (workdir / "ready").exists():
            print(f"cluster ready in {(workdir / 'ready').read_text().strip()}s (harness pid {proc.pid})")
            print(f"export KUBECONFIG={workdir / 'kubeconfig'}")
            return 0
        time.sleep(0.2)
    print(f"cluster not ready after 120s (log: {log_path})", file=sys.stderr)
    return 1


def _down(args: argparse.Namespace) -> int:
    pid_file = Path(args.dir).resolve() / "harness.pid"
    if not pid_file.exists():
        print("not running")
        return 0
    pid = int(pid_file.read_text())
    if _pid_alive(pid):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        while _pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
    pid_file.unlink(missing_ok=True)
    print("stopped")
    return 0


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m posttrain.dev.devcluster", description=__doc__.split("\n")[0]
    )
    sub = parser.add_subparsers(dest="action", required=True)
    for name in ("up", "serve", "down"):
        p = sub.add_parser(name)
        p.add_argument("--dir", default=".cluster")
        p.add_argument("--nodes", type=int, default=4)
        p.add_argument("--gpus-per-node", type=int, default=8)
    args = parser.parse_args(argv)
    return {"up": _up, "serve": _serve, "down": _down}[args.action](args)


if __name__ == "__main__":
    sys.exit(main())
