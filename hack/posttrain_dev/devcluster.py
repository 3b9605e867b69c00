"""A real local Kubernetes control plane for tests and people: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and kwok with simulated GPU nodes, all on 127.0.0.1, built by hack/build-k8s.sh; with
`real_node=True` (`up --real-node`) also a real kubelet node beside them (posttrain_dev.devnode), for which the
API server listens on the host's address instead, so that pods reach it.

    with DevCluster(Path(".cluster")) as cluster:      # tests
        cluster.kubeconfig                             # admin kubeconfig (system:masters)

    PYTHONPATH=hack python -m posttrain_dev.devcluster up --dir .cluster  # people (make cluster-up): background,
    PYTHONPATH=hack python -m posttrain_dev.devcluster down --dir .cluster  # prints `export KUBECONFIG=...`

Flags follow controller-runtime's envtest (certificates, service-account keys, RBAC) plus what envtest lacks
and a job controller needs: garbage collection, the Job controller, the scheduler, and nodes (kwok).
"""

from __future__ import annotations

import argparse
import atexit
import base64
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
from posttrain.controller.gpu_types import DEFAULT_GPU_PRODUCTS, GFD_PRODUCT_LABEL
from posttrain.localhost import free_port, signalable, stop_group, stop_pids

from posttrain_dev import devnode, kueue

REPO_ROOT = Path(__file__).resolve().parents[2]
HACK = REPO_ROOT / "hack"  # this package's parent: a child process imports it from there too
STAGES_FILE = REPO_ROOT / "hack" / "k8s" / "kwok-stages.yaml"
REQUIRED_BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
PORT_CLASH_ATTEMPTS = 3  # starts with fresh ports when a server finds its picked port taken
NODE_PORTS = (30000, 32767)  # the API server's default --service-node-port-range
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
# A test ends a running kwok pod by setting this annotation to its exit code ("0" succeeds).
KWOK_EXIT_ANNOTATION = "posttrain.dev/kwok-exit"
GPU_RESOURCE = "nvidia.com/gpu"
DEFAULT_GPU_PRODUCT = DEFAULT_GPU_PRODUCTS["H100"][0]
# Enabled on top of the API server's defaults (which include PodSecurity): the plugin that refuses
# ownerReferences a client may not set, as many production clusters run it.
ADMISSION_PLUGINS = ("OwnerReferencesPermissionEnforcement",)
GPU_TAINT = {"key": GPU_RESOURCE, "value": "present", "effect": "NoSchedule"}
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
    server_names: tuple[str, ...] = (),
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
        names = ("localhost", "kubernetes.default.svc", "127.0.0.1", "10.0.0.1", *server_names)
        builder = builder.add_extension(
            x509.SubjectAlternativeName([_general_name(n) for n in dict.fromkeys(names)]),
            critical=False,
        )
    return builder.sign(issuer_key, hashes.SHA256())


def _general_name(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def issue_certificate(
    pki: Path, stem: str, common_name: str, organizations: list[str], server_names: list[str] | None = None
) -> None:
    """<stem>.crt/.key signed by the CA in `pki`: a client certificate (CN = user, O = groups), or a serving
    one for `server_names` (DNS names or IPs)."""
    ca_key = serialization.load_pem_private_key((pki / "ca.key").read_bytes(), password=None)
    ca_cert = x509.load_pem_x509_certificate((pki / "ca.crt").read_bytes())
    key = ec.generate_private_key(ec.SECP256R1())
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
    subject = x509.Name([*attrs, x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    cert = _certificate(
        subject, key.public_key(), ca_cert.subject, ca_key, ca=False,
        server=server_names is not None, server_names=tuple(server_names or ()),
    )  # fmt: skip
    _write_key(pki / f"{stem}.key", key)
    _write_cert(pki / f"{stem}.crt", cert)


def write_certificates(pki: Path, server_names: tuple[str, ...] = ()) -> None:
    """A tiny CA (serving and client), the API server's serving cert (also valid for `server_names`), an
    admin client cert in system:masters, and the service-account signing key pair."""
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
        _certificate(
            server_name,
            server_key.public_key(),
            ca_name,
            ca_key,
            ca=False,
            server=True,
            server_names=server_names,
        ),  # fmt: skip
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
    # What GPU feature discovery would label the simulated GPUs (nvidia.com/gpu.product): the jobs' default
    # gpuType H100 chooses these nodes (controller/render/gpu.py).
    gpu_product: str = DEFAULT_GPU_PRODUCT
    start_timeout: float = 60.0
    log_to_files: bool = True
    admission_plugins: tuple[str, ...] = ADMISSION_PLUGINS
    real_node: bool = False
    network_policy: bool = False  # the real node also enforces NetworkPolicies (kube-router; devnode)
    kueue: bool = False  # also run Kueue's manager (hack/build-kueue.sh; posttrain_dev.kueue)
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)
    ready_seconds: float = 0.0
    host: str = "127.0.0.1"  # where the API server listens: the host's address when a real node runs
    node: devnode.RealNode | None = None

    @property
    def kubeconfig(self) -> Path:
        return self.workdir / "kubeconfig"

    @property
    def pki(self) -> Path:
        return self.workdir / "pki"

    @property
    def server(self) -> str:
        return f"https://{self.host}:{self.ports['apiserver']}"

    def __enter__(self) -> DevCluster:
        for attempt in range(PORT_CLASH_ATTEMPTS):
            try:
                self.start()
                break
            except ClusterError as err:
                self.stop()
                # another process bound a picked port before its server did: pick new ones and start over
                if "address already in use" not in str(err) or attempt + 1 == PORT_CLASH_ATTEMPTS:
                    raise
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
        if self.real_node:
            # A node a killed harness left behind holds mounts inside the workdir: clear it first.
            devnode.cleanup_host(self.workdir / "node", binaries_dir())
            self.host = devnode.host_ipv4()
        if self.workdir.exists():
            stop_recorded_processes(self.workdir)
            shutil.rmtree(self.workdir)
        (self.workdir / "logs").mkdir(parents=True)
        write_certificates(self.pki, server_names=(self.host,))
        if self.real_node:
            issue_certificate(self.pki, "apiserver-kubelet-client", "kube-apiserver-kubelet-client",
                              ["system:masters"])  # fmt: skip
        for name in ("etcd", "etcd-peer", "apiserver", "scheduler", "kwok-server", "kwok-node"):
            self.ports[name] = free_port()
        while self.real_node and NODE_PORTS[0] <= self.ports["apiserver"] <= NODE_PORTS[1]:
            # pods may reach the node's own addresses on NodePorts whatever the NetworkPolicies say
            # (kube-router, like kube-proxy, lets them through): an API server there would be unfenced
            self.ports["apiserver"] = free_port()
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
        # Ready nodes do not show that the scheduler serves: one whose port was taken exits only after
        # loading its config, which can be after the nodes are up.
        self._wait_http(f"https://127.0.0.1:{self.ports['scheduler']}/healthz", "kube-scheduler", tls="any")
        if self.kueue:
            self._start_kueue()
        if self.real_node:
            self._start_real_node()
        self.ready_seconds = time.monotonic() - began
        (self.workdir / "ports.json").write_text(json.dumps(self.ports))

    def stop(self) -> None:
        # The real node first, while the API server still answers; then reverse start order: nodes'
        # controller first, the store last.
        if self.node is not None:
            node, self.node = self.node, None
            node.stop()
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
        args = [
            f"--bind-address={self.host}",
            f"--advertise-address={self.host}",
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
                [f"--enable-admission-plugins={','.join(self._admission_plugins())}"]
                if self._admission_plugins()
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
        if self.real_node:
            # Pods reach the API server through the `kubernetes` Service: let the API server keep its
            # endpoint (the host's address); authorize the kubelet as a node; let GPU pods tolerate the kwok
            # nodes' nvidia.com/gpu taint; reach the kubelet (logs, exec) with a client certificate.
            args.remove("--endpoint-reconciler-type=none")
            args.remove("--authorization-mode=RBAC")
            args += [
                "--authorization-mode=Node,RBAC",
                # The node's name does not resolve on the host: reach the kubelet at its InternalIP.
                "--kubelet-preferred-address-types=InternalIP,Hostname",
                f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.crt'}",
                f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
            ]
        return args

    def _admission_plugins(self) -> tuple[str, ...]:
        """Beside a real node, the kubelet's own writes are restricted (NodeRestriction) and GPU pods get the
        toleration of the kwok nodes' nvidia.com/gpu taint (ExtendedResourceToleration)."""
        extra = ("NodeRestriction", "ExtendedResourceToleration") if self.real_node else ()
        return tuple(dict.fromkeys((*self.admission_plugins, *extra)))

    def _start_real_node(self) -> None:
        self.node = devnode.RealNode(
            workdir=self.workdir / "node",
            pki=self.pki,
            server=self.server,
            node_ip=self.host,
            bin_dir=binaries_dir(),
            api=self._api,
            issue_client_cert=lambda stem, cn, orgs: issue_certificate(self.pki, stem, cn, orgs),
            issue_server_cert=lambda stem, cn, names: issue_certificate(self.pki, stem, cn, [], names),
            enforce_network_policy=self.network_policy,
        )
        self.node.start()

    def _start_kueue(self) -> None:
        crd_dir = binaries_dir() / "kueue-crd"
        if not (binaries_dir() / "kueue").exists() or not crd_dir.is_dir():
            raise ClusterError(f"kueue missing from {binaries_dir()}: run `make kueue-bins` (hack/build-kueue.sh)")
        crd_path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
        names = []
        for crd in kueue.crd_manifests(crd_dir):
            self._api("POST", crd_path, crd)
            names.append(crd["metadata"]["name"])
        for path, obj in kueue.setup_objects():
            self._api("POST", path, obj)
        deadline = time.monotonic() + self.start_timeout
        while any(not self._established(f"{crd_path}/{n}") for n in names):
            if time.monotonic() > deadline:
                raise ClusterError("Kueue's CRDs not Established")
            time.sleep(0.2)
        for name in ("kueue-health", "kueue-webhook"):
            self.ports[name] = free_port()
        self._spawn("kueue", kueue.args(self.workdir, self.kubeconfig, self.ports["kueue-health"],
                                        self.ports["kueue-webhook"]))  # fmt: skip
        self._mount_kueue_certs()
        # /readyz answers once its certificates are made and injected (cert-controller), i.e. it runs.
        self._wait_http(f"http://127.0.0.1:{self.ports['kueue-health']}/readyz", "kueue", timeout=120)

    def _mount_kueue_certs(self) -> None:
        """Do the kubelet's part: cert-controller writes the webhook certificate into its Secret and waits
        for the files to appear in the certificate directory, where a pod would have the Secret mounted."""
        path = f"/api/v1/namespaces/{kueue.NAMESPACE}/secrets/{kueue.WEBHOOK_SECRET}"
        deadline = time.monotonic() + self.start_timeout
        while True:
            self._check_alive()
            data = self._api("GET", path).get("data") or {}
            if "tls.crt" in data and "tls.key" in data:
                break
            if time.monotonic() > deadline:
                raise ClusterError("Kueue wrote no webhook certificate into its Secret")
            time.sleep(0.2)
        certs = self.workdir / "kueue-certs"
        certs.mkdir(exist_ok=True)
        for key, value in data.items():
            (certs / key).write_bytes(base64.b64decode(value))
            (certs / key).chmod(0o600)

    def _established(self, path: str) -> bool:
        conds = self._api("GET", path).get("status", {}).get("conditions") or []
        return any(c["type"] == "Established" and c["status"] == "True" for c in conds)

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
        # So that `down` can stop them when no harness owns them (a run that kept its cluster and exited).
        (self.workdir / PIDS_FILE).write_text(json.dumps({n: p.pid for n, p in self.processes.items()}))

    def _check_alive(self) -> None:
        if self.node is not None:
            self.node.check_alive()
        for name, proc in self.processes.items():
            if proc.poll() is not None:
                tail = (self.workdir / "logs" / f"{name}.log").read_text(errors="replace")[-2000:]
                raise ClusterError(f"{name} exited with code {proc.returncode}; last log lines:\n{tail}")

    def _ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        ctx.load_cert_chain(str(self.pki / "admin.crt"), str(self.pki / "admin.key"))
        return ctx

    def _wait_http(
        self, url: str, what: str, tls: bool | str = False, timeout: float | None = None
    ) -> None:
        """tls: True checks the server against the cluster's CA; "any" takes any certificate (the scheduler
        serves one it generated in memory)."""
        timeout = timeout or self.start_timeout
        deadline = time.monotonic() + timeout
        ctx = self._ssl_context() if tls is True else None
        if tls == "any":
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
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
        raise ClusterError(f"{what} not healthy at {url} after {timeout:.0f}s: {last}")

    def _api(
        self, method: str, path: str, body: dict | None = None, content_type: str = "application/json"
    ) -> dict:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(
            f"{self.server}{path}", data=data, method=method, headers={"Content-Type": content_type}
        )
        with urllib.request.urlopen(req, timeout=10, context=self._ssl_context()) as resp:
            return json.loads(resp.read() or b"{}")

    def node_manifest(self, index: int, gpu_product: str | None = None) -> dict:
        capacity = {"cpu": "96", "memory": "1Ti", "pods": "110", GPU_RESOURCE: str(self.gpus_per_node)}
        # Beside a real node, only pods that ask for GPUs may land here (ExtendedResourceToleration gives
        # them the toleration): CPU pods go to the real node and run for real.
        spec = {"taints": [GPU_TAINT]} if self.real_node else {}
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
                    GFD_PRODUCT_LABEL: gpu_product or self.gpu_product,
                },
            },
            "spec": spec,
            "status": {"capacity": capacity, "allocatable": capacity},
        }

    def _create_nodes(self) -> None:
        for index in range(self.nodes):
            self._api("POST", "/api/v1/nodes", self.node_manifest(index))

    def _untaint(self, nodes: list[dict]) -> None:
        """The API server's TaintNodesByCondition admission taints new nodes not-ready; the node lifecycle
        controller that would lift it is off (no kubelet heartbeats), so lift it once kwok made them Ready.
        Other taints (the GPU taint beside a real node) stay."""
        for node in nodes:
            taints = node["spec"].get("taints") or []
            kept = [t for t in taints if t["key"] != devnode.NOT_READY_TAINT]
            if len(kept) != len(taints):
                self._api_merge_patch(
                    f"/api/v1/nodes/{node['metadata']['name']}", {"spec": {"taints": kept or None}}
                )

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


PIDS_FILE = "pids.json"  # {component: pid} of the control-plane processes a DevCluster started


def stop_recorded_processes(workdir: Path, grace: float = 30.0) -> list[str]:
    """Stops the control-plane processes recorded in `workdir`'s PIDS_FILE that still run from this workdir
    (their command line names it, so a recycled pid is never signalled): SIGTERM, then SIGKILL after
    `grace` seconds. Returns the names it stopped."""
    pids_file = workdir / PIDS_FILE
    try:
        recorded = json.loads(pids_file.read_text())
    except (OSError, ValueError):
        return []
    mine = {}
    for name, pid in recorded.items():
        try:
            cmdline = (
                Path(f"/proc/{int(pid)}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            )
        except (OSError, ValueError):
            continue
        if str(workdir) in cmdline:
            mine[name] = int(pid)
    stop_pids(list(mine.values()), grace=grace, alive=_pid_running)
    pids_file.unlink(missing_ok=True)
    return sorted(mine)


def _pid_running(pid: int) -> bool:
    """Alive and not a zombie (a stopped child of this process stays a zombie until reaped)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


READY_FILE = "ready"  # {"pid": harness pid, "seconds": start time, "server": API server URL}


def _serve(args: argparse.Namespace) -> int:
    """Foreground: start, write the pid file, wait for a signal, stop."""
    workdir = Path(args.dir).resolve()
    cluster = DevCluster(
        workdir, nodes=args.nodes, gpus_per_node=args.gpus_per_node, real_node=args.real_node,
        network_policy=args.network_policy,
        kueue=args.kueue,
    )
    stopping = False

    def on_signal(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    atexit.register(cluster.stop)
    with cluster:
        (workdir / "harness.pid").write_text(str(os.getpid()))
        ready = {"pid": os.getpid(), "seconds": round(cluster.ready_seconds, 1), "server": cluster.server}
        (workdir / READY_FILE).write_text(json.dumps(ready))
        print(f"cluster ready in {cluster.ready_seconds:.1f}s", flush=True)
        while not stopping:
            time.sleep(0.5)
            cluster._check_alive()
    return 0


def ready_marker(workdir: Path, harness_pid: int) -> dict | None:
    """The ready marker written by the harness with this pid; None while it is absent or still the one a
    previous harness left (its kubeconfig would name that harness's API server)."""
    try:
        marker = json.loads((workdir / READY_FILE).read_text())
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) and marker.get("pid") == harness_pid else None


def _up(args: argparse.Namespace) -> int:
    workdir = Path(args.dir).resolve()
    pid_file = workdir / "harness.pid"
    if pid_file.exists() and signalable(int(pid_file.read_text())):
        print(f"already running (pid {pid_file.read_text().strip()})")
        print(f"export KUBECONFIG={workdir / 'kubeconfig'}")
        return 0
    workdir.parent.mkdir(parents=True, exist_ok=True)
    (workdir / READY_FILE).unlink(missing_ok=True)
    log_path = workdir.parent / f"{workdir.name}-harness.log"
    command = [
        sys.executable, "-m", "posttrain_dev.devcluster", "serve", "--dir", str(workdir),
        "--nodes", str(args.nodes), "--gpus-per-node", str(args.gpus_per_node),
    ]  # fmt: skip
    if args.real_node:
        command.append("--real-node")
    if args.network_policy:
        command.append("--network-policy")
    if args.kueue:
        command.append("--kueue")
    # the harness imports this package as we do: hack/ on its import path (not installed anywhere)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(HACK), os.environ.get("PYTHONPATH")]))}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            command,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    timeout = 600 if args.real_node else 120
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            print(log_path.read_text(errors="replace")[-3000:], file=sys.stderr)
            print(f"cluster failed to start (log: {log_path})", file=sys.stderr)
            return 1
        marker = ready_marker(workdir, proc.pid)
        if marker:
            node = f", real node {devnode.NODE_NAME}" if args.real_node else ""
            print(
                f"cluster ready in {marker['seconds']}s at {marker['server']}{node} (harness pid {proc.pid})"
            )
            print(f"export KUBECONFIG={workdir / 'kubeconfig'}")
            return 0
        time.sleep(0.2)
    print(f"cluster not ready after {timeout}s (log: {log_path})", file=sys.stderr)
    return 1


def _down(args: argparse.Namespace) -> int:
    workdir = Path(args.dir).resolve()
    pid_file = workdir / "harness.pid"
    node_dir = workdir / "node"
    if not pid_file.exists() and not node_dir.exists() and not (workdir / PIDS_FILE).exists():
        print("not running")
        return 0
    pid = int(pid_file.read_text()) if pid_file.exists() else 0
    if pid and signalable(pid):
        stop_pids([pid], grace=300, alive=signalable)
    pid_file.unlink(missing_ok=True)
    (workdir / READY_FILE).unlink(missing_ok=True)
    if node_dir.exists():
        # The node first, while the API server still answers.
        devnode.cleanup_host(node_dir, binaries_dir())
    # Control-plane processes no harness stopped (a `make e2e --keep` run's, or a killed harness's).
    stop_recorded_processes(workdir)
    if node_dir.exists():
        # Also after a harness that was killed: idempotent, then checked.
        devnode.cleanup_host(node_dir, binaries_dir())
        left = devnode.leftovers(node_dir)
        if left:
            print("stopped, but the real node left: " + "; ".join(left), file=sys.stderr)
            return 1
        print("stopped; the real node left nothing behind (checked: processes, containerd shims, mounts, "
              "network namespaces, iptables KUBE-*/CNI-* chains, links, cgroups)")  # fmt: skip
        return 0
    print("stopped")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m posttrain_dev.devcluster", description=__doc__.split("\n")[0]
    )
    sub = parser.add_subparsers(dest="action", required=True)
    for name in ("up", "serve", "down"):
        p = sub.add_parser(name)
        p.add_argument("--dir", default=".cluster")
        p.add_argument("--nodes", type=int, default=4)
        p.add_argument("--gpus-per-node", type=int, default=8)
        p.add_argument(
            "--real-node",
            action="store_true",
            help="also start a real kubelet node (containerd, runc, CNI, kube-proxy, CoreDNS); needs root "
            "and `make node-bins`",
        )
        p.add_argument("--network-policy", action="store_true",
                       help="with --real-node: the node also enforces NetworkPolicies (kube-router's controller)")
        p.add_argument("--kueue", action="store_true",
                       help="also run Kueue's manager (`make kueue-bins`); see posttrain_dev.kueue")  # fmt: skip
    args = parser.parse_args(argv)
    return {"up": _up, "serve": _serve, "down": _down}[args.action](args)


if __name__ == "__main__":
    sys.exit(main())
