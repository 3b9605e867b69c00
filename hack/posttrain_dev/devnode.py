"""A real kubelet node for the dev control plane (DevCluster(real_node=True), `make cluster-up REAL_NODE=1`):
containerd 2.x with runc and the CNI bridge/host-local/loopback/portmap plugins, the kubelet, kube-proxy in
iptables mode and CoreDNS, all as host processes built by hack/build-node.sh and hack/build-k8s.sh.

Beside it the kwok GPU nodes stay: they carry the taint `nvidia.com/gpu=present:NoSchedule`, which the API
server's ExtendedResourceToleration admission lets every pod that asks for `nvidia.com/gpu` tolerate. So a
CPU pod can only land on this node and a GPU pod only on a kwok node (this one has no GPUs). kwok manages
only nodes annotated `kwok.x-k8s.io/node=fake`; this one is not.

Where things live (everything else it touches is listed by `leftovers()` and removed by `stop()`):
  <cluster>/node/            configs, certificates, kubelet root dir, pod logs, CNI IP allocations, logs
  /run/posttrain-node/       containerd's state and socket (short paths: Unix sockets are limited to 107 bytes)
  $POSTTRAIN_CACHE/containerd  containerd's content store and snapshots: imported images survive
                             `make cluster-down`, like every other cache outside the clone
  cgroups /posttrain         the kubelet's cgroup root in every cgroup v1 hierarchy (or the v2 tree)
  bridge posttrain0, pod network 10.244.0.0/24, DNS Service 10.0.0.10 -> CoreDNS on the node IP

With enforce_network_policy (DevCluster(network_policy=True), `make e2e-netpol`) kube-router's network policy
controller runs beside them (hack/node/kube-router, as `kube-router-netpol`): it enforces the API server's
NetworkPolicies for this node's pods with iptables chains (KUBE-ROUTER-*, KUBE-POD-FW-*, KUBE-NWPLCY-*) and
ipsets (KUBE-SRC-*, KUBE-DST-*), which stop() removes with the node's other chains.

Facts this relies on (measured on the dev machine, docs/real-node.md): a kubelet >= 1.35 refuses cgroup v1
unless its configuration sets failCgroupV1: false, so that is set only on a cgroup v1 host; no swap; root."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tarfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from posttrain.localhost import free_port, signalable, stop_group, stop_pids

NODE_NAME = "posttrain-node"
NODE_LABEL = "node.posttrain.dev/real"
BRIDGE = "posttrain0"
CNI_NETWORK = "posttrain"
POD_CIDR = "10.244.0.0/24"
CLUSTER_CIDR = "10.244.0.0/16"
DNS_SERVICE_IP = "10.0.0.10"
CLUSTER_DOMAIN = "cluster.local"
STATE_DIR = Path("/run/posttrain-node")
CGROUP_ROOT = "posttrain"
STOP_GRACE_SECONDS = 15.0  # kubelet and containerd tidy up their pods and shims on SIGTERM
PAUSE_IMAGE = "localhost/posttrain/pause:1.0"
CNI_BIN_DIR = Path("/usr/lib/cni")
CNI_PLUGINS = ("bridge", "host-local", "loopback", "portmap")
NODE_BINARIES = (
    "containerd", "containerd-shim-runc-v2", "ctr", "crictl", "kubelet", "kube-proxy", "coredns", "pause",
)  # fmt: skip
NETPOL_BINARY = "kube-router-netpol"  # hack/node/kube-router: kube-router's network policy controller only
SERVICE_CIDR = "10.0.0.0/24"  # the dev API server's --service-cluster-ip-range
NOT_READY_TAINT = "node.kubernetes.io/not-ready"
# Chains the kubelet, kube-proxy, the CNI bridge/portmap plugins and kube-router create; removed on stop.
CHAIN_PREFIXES = ("KUBE-", "CNI-")
# kube-router's ipsets (inet6: the IPv6 ones); removed on stop, once no rule refers to them.
IPSET_PREFIXES = ("KUBE-", "inet6:KUBE-")
IPTABLES_TABLES = ("filter", "nat", "mangle", "raw")
SYSCTLS = ("net/ipv4/ip_forward", "net/bridge/bridge-nf-call-iptables")

ApiCall = Callable[..., dict]


class NodeError(RuntimeError):
    """The node could not be started or stopped; the message says which part and why."""


def cache_dir() -> Path:
    return Path(os.environ.get("POSTTRAIN_CACHE") or Path.home() / ".cache" / "posttrain")


# ----------------------------------------------------------------------------------------- host facts


def cgroup_version(mounts: str | None = None) -> int:
    """1 when /sys/fs/cgroup is a tmpfs of v1 hierarchies (what `stat -fc %T /sys/fs/cgroup` calls tmpfs),
    2 when it is the unified cgroup2 file system."""
    text = mounts if mounts is not None else Path("/proc/self/mounts").read_text()
    for line in text.splitlines():
        parts = line.split()
        if len(parts) > 2 and parts[1] == "/sys/fs/cgroup":
            return 2 if parts[2] == "cgroup2" else 1
    return 1


def host_ipv4() -> str:
    """The address of the interface that holds the default route (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect(("203.0.113.1", 9))  # TEST-NET-3: routed by the default route, never answered
        return str(sock.getsockname()[0])


CAP_SYS_RESOURCE = 24


def can_lower_oom_score(status: str | None = None) -> bool:
    """Whether processes here may set a negative oom_score_adj: CAP_SYS_RESOURCE in the bounding set
    (/proc/self/status CapBnd). Some sandboxes drop it for every process, root included."""
    text = status if status is not None else Path("/proc/self/status").read_text()
    match = re.search(r"^CapBnd:\s*([0-9a-f]+)", text, re.M)
    return bool(match) and bool(int(match.group(1), 16) >> CAP_SYS_RESOURCE & 1)


def missing_prerequisites(bin_dir: Path, network_policy: bool = False) -> list[str]:
    """What the node needs on this host and does not find, each with the command that provides it."""
    binaries = (*NODE_BINARIES, NETPOL_BINARY) if network_policy else NODE_BINARIES
    out = [f"{bin_dir / b} (make node-bins)" for b in binaries if not os.access(bin_dir / b, os.X_OK)]
    if network_policy and not shutil.which("ipset"):
        out.append("ipset (apt-get install ipset; make node-bins does it)")
    if not shutil.which("runc"):
        out.append("runc (apt-get install runc; make node-bins does it)")
    for plugin in CNI_PLUGINS:
        if not os.access(CNI_BIN_DIR / plugin, os.X_OK):
            out.append(f"{CNI_BIN_DIR / plugin} (apt-get install containernetworking-plugins)")
    for tool in ("iptables", "iptables-save", "ip"):
        if not shutil.which(tool):
            out.append(f"{tool} (apt-get install iptables iproute2)")
    if os.geteuid() != 0:
        out.append("root (a kubelet node runs containers and changes iptables: run as root)")
    return out


# ----------------------------------------------------------------------------------------- configs (pure)


def containerd_config(
    *,
    root: Path,
    state: Path,
    socket_path: Path,
    cni_conf_dir: Path,
    registry_hosts_dir: Path = STATE_DIR / "certs.d",
    restrict_oom_score_adj: bool = False,
) -> str:
    """containerd 2.x configuration (version 3): the CRI plugin with runc (cgroupfs driver, as the kubelet),
    the CNI plugins from the Debian package, the locally built pause image as the pinned sandbox image.
    registry_hosts_dir: containerd's per-registry hosts.toml folders (`make e2e` trusts its loopback
    registry there, as a cluster admin does in /etc/containerd/certs.d); read at each pull, so a registry
    may be added while the node runs. Unpacked layers leave the content store: the snapshots are what pods
    run from, and the torch closure is then on disk once.
    restrict_oom_score_adj: where no process may lower its oom_score_adj (no CAP_SYS_RESOURCE), runc
    fails to start every pod sandbox (the kubelet asks -998 for it); containerd then clamps the value to its
    own instead."""
    runc = shutil.which("runc") or "/usr/sbin/runc"
    restrict = "true" if restrict_oom_score_adj else "false"
    return f"""version = 3
root = "{root}"
state = "{state}"

[grpc]
  address = "{socket_path}"

[ttrpc]
  address = "{socket_path}.ttrpc"

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  discard_unpacked_layers = true
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{PAUSE_IMAGE}"
  [plugins."io.containerd.cri.v1.images".registry]
    config_path = "{registry_hosts_dir}"

[plugins."io.containerd.cri.v1.runtime"]
  restrict_oom_score_adj = {restrict}
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = "{runc}"
        SystemdCgroup = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["{CNI_BIN_DIR}"]
    conf_dir = "{cni_conf_dir}"
    max_conf_num = 1
"""


def registry_hosts_dir(state: Path = STATE_DIR) -> Path:
    """containerd's config_path: <dir>/<host:port>/hosts.toml per registry (removed with the node's state)."""
    return state / "certs.d"


def registry_hosts_toml(address: str) -> str:
    """hosts.toml for a registry on loopback without TLS (host:port), like Debian's docker-registry that
    `make e2e` starts: pulls and resolves go to it over plain HTTP."""
    return f"""server = "http://{address}"

[host."http://{address}"]
  capabilities = ["pull", "resolve"]
"""


def cni_conflist(ipam_dir: Path) -> dict:
    """One bridge network for the node's pods: host-local IPs from POD_CIDR (state in ipam_dir), the
    bridge as their gateway, masquerade for traffic leaving the pod network, hairpin so that a pod reaches
    itself through its own Service, and portmap for hostPorts."""
    return {
        "cniVersion": "1.0.0",
        "name": CNI_NETWORK,
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": True,
                "ipMasq": True,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": POD_CIDR}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": str(ipam_dir),
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }


def kubelet_config(
    *,
    node_ip: str,
    port: int,
    healthz_port: int,
    ca_file: Path,
    serving_cert: Path,
    serving_key: Path,
    runtime_socket: Path,
    pod_logs_dir: Path,
    cgroup_v1: bool,
) -> dict:
    """KubeletConfiguration. failCgroupV1: false only on a cgroup v1 host (kubelet >= 1.35 refuses v1
    otherwise). Image garbage collection and disk-pressure eviction are effectively off: the dev machine's
    disk is shared, and a kubelet that deletes the locally built images (there is no registry to pull them
    back from) breaks every later pod."""
    config = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": node_ip,
        "port": port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz_port,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(ca_file)},
        },
        "authorization": {"mode": "Webhook"},
        "tlsCertFile": str(serving_cert),
        "tlsPrivateKeyFile": str(serving_key),
        "containerRuntimeEndpoint": f"unix://{runtime_socket}",
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": f"/{CGROUP_ROOT}",
        "clusterDNS": [DNS_SERVICE_IP],
        "clusterDomain": CLUSTER_DOMAIN,
        "resolvConf": "/etc/resolv.conf",
        "podLogsDir": str(pod_logs_dir),
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "1%",
            "imagefs.available": "1%",
            "nodefs.inodesFree": "1%",
        },
        "serializeImagePulls": False,
        "failSwapOn": True,
        "registerNode": True,
        "staticPodPath": "",
        "maxPods": 110,
        "shutdownGracePeriod": "0s",
    }
    if cgroup_v1:
        config["failCgroupV1"] = False
    return config


def kube_proxy_config(
    *, kubeconfig: Path, healthz_port: int, metrics_port: int, oom_score_adj: int = -999
) -> dict:
    """KubeProxyConfiguration: iptables mode; conntrack sysctls left as the host has them (zero values mean
    "do not touch"), so stopping the node has nothing to restore there."""
    return {
        "oomScoreAdj": oom_score_adj,
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "mode": "iptables",
        "hostnameOverride": NODE_NAME,
        "clusterCIDR": CLUSTER_CIDR,
        "detectLocalMode": "ClusterCIDR",
        "healthzBindAddress": f"127.0.0.1:{healthz_port}",
        "metricsBindAddress": f"127.0.0.1:{metrics_port}",
        "conntrack": {
            "maxPerCore": 0,
            "min": 0,
            "tcpEstablishedTimeout": "0s",
            "tcpCloseWaitTimeout": "0s",
        },
        "iptables": {"syncPeriod": "10s", "minSyncPeriod": "1s", "localhostNodePorts": False},
    }


def corefile(*, node_ip: str, port: int, ready_port: int, kubeconfig: Path) -> str:
    """CoreDNS: the cluster domain from the API server (Services, headless Services' pod records), the rest
    forwarded to the host's resolver."""
    return f""".:{port} {{
    bind {node_ip}
    errors
    ready 127.0.0.1:{ready_port}
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        kubeconfig {kubeconfig} posttrain-dev
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 5
    }}
    forward . /etc/resolv.conf
    cache 5
}}
"""


def dns_objects(node_ip: str, port: int) -> list[tuple[str, dict]]:
    """(API path to POST to, object): CoreDNS's RBAC (user posttrain-coredns), and the kube-dns Service at
    DNS_SERVICE_IP with an EndpointSlice pointing at CoreDNS on the node (kube-proxy routes it)."""
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": "posttrain:coredns"},
        "rules": [
            {"apiGroups": [""], "resources": ["services", "namespaces"], "verbs": ["list", "watch"]},
            {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]},
        ],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "posttrain:coredns"},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": "posttrain:coredns",
        },
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "posttrain-coredns"}],
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "kube-dns", "namespace": "kube-system", "labels": {"k8s-app": "kube-dns"}},
        "spec": {
            "clusterIP": DNS_SERVICE_IP,
            "ports": [
                {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": port},
                {"name": "dns-tcp", "port": 53, "protocol": "TCP", "targetPort": port},
            ],
        },
    }
    endpoints = {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": "kube-dns-node",
            "namespace": "kube-system",
            "labels": {
                "kubernetes.io/service-name": "kube-dns",
                "endpointslice.kubernetes.io/managed-by": "posttrain-devnode",
            },
        },
        "addressType": "IPv4",
        "endpoints": [{"addresses": [node_ip], "conditions": {"ready": True}, "nodeName": NODE_NAME}],
        "ports": [
            {"name": "dns", "port": port, "protocol": "UDP"},
            {"name": "dns-tcp", "port": port, "protocol": "TCP"},
        ],
    }
    return [
        ("/apis/rbac.authorization.k8s.io/v1/clusterroles", role),
        ("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", binding),
        ("/api/v1/namespaces/kube-system/services", service),
        ("/apis/discovery.k8s.io/v1/namespaces/kube-system/endpointslices", endpoints),
    ]


def netpol_rbac() -> list[tuple[str, dict]]:
    """(API path to POST to, object): what kube-router's network policy controller reads, for the user
    posttrain-kube-router: its node, and the pods, namespaces and NetworkPolicies it enforces."""
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": "posttrain:kube-router"},
        "rules": [
            {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": [""], "resources": ["pods", "namespaces"], "verbs": ["list", "watch"]},
            {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": ["list", "watch"]},
        ],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "posttrain:kube-router"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "posttrain:kube-router"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "posttrain-kube-router"}],
    }
    return [
        ("/apis/rbac.authorization.k8s.io/v1/clusterroles", role),
        ("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", binding),
    ]


def pause_image_archive(pause_binary: bytes, ref: str = PAUSE_IMAGE) -> bytes:
    """An OCI image layout (tar) with one layer holding /pause, named `ref` for `ctr images import`."""
    return binary_image_archive(pause_binary, "pause", ref, user="65535:65535")


def binary_image_archive(binary: bytes, name: str, ref: str, *, user: str) -> bytes:
    """An OCI image layout (tar) whose one layer holds the static program /<name> (its entrypoint), run as
    `user`, named `ref` for `ctr images import`."""

    def blob(data: bytes) -> tuple[str, bytes]:
        return "sha256:" + hashlib.sha256(data).hexdigest(), data

    layer_buf = io.BytesIO()
    with tarfile.open(fileobj=layer_buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo(name)
        info.size, info.mode, info.mtime = len(binary), 0o755, 0
        tar.addfile(info, io.BytesIO(binary))
    layer_digest, layer = blob(layer_buf.getvalue())
    config_digest, config = blob(
        json.dumps(
            {
                "architecture": "amd64",
                "os": "linux",
                "config": {"Entrypoint": [f"/{name}"], "User": user},
                "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
            },
            sort_keys=True,
        ).encode()
    )
    manifest_digest, manifest = blob(
        json.dumps(
            {
                "schemaVersion": 2,
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": {
                    "mediaType": "application/vnd.oci.image.config.v1+json",
                    "digest": config_digest,
                    "size": len(config),
                },
                "layers": [
                    {
                        "mediaType": "application/vnd.oci.image.layer.v1.tar",
                        "digest": layer_digest,
                        "size": len(layer),
                    }
                ],
            },
            sort_keys=True,
        ).encode()
    )
    index = json.dumps(
        {
            "schemaVersion": 2,
            "manifests": [
                {
                    "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "digest": manifest_digest,
                    "size": len(manifest),
                    "annotations": {"io.containerd.image.name": ref},
                }
            ],
        }
    ).encode()
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        files = {
            "oci-layout": json.dumps({"imageLayoutVersion": "1.0.0"}).encode(),
            "index.json": index,
            **{f"blobs/sha256/{d.split(':')[1]}": b for d, b in ((layer_digest, layer),
                                                              (config_digest, config),
                                                              (manifest_digest, manifest))},
        }  # fmt: skip
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


# ----------------------------------------------------------------------------------------- leftovers (pure)


def node_chains(iptables_save: str, keep: dict[str, list[str]] | None = None) -> dict[str, list[str]]:
    """{table: [chain, ...]} of the KUBE-*/CNI-* chains in an `iptables-save` dump, minus the chains in
    `keep` (what other CNI users, e.g. buildah or podman, had before the node started)."""
    keep = keep or {}
    out: dict[str, list[str]] = {}
    table = ""
    for line in iptables_save.splitlines():
        if line.startswith("*"):
            table = line[1:].strip()
        elif line.startswith(":"):
            chain = line[1:].split()[0]
            if chain.startswith(CHAIN_PREFIXES) and chain not in keep.get(table, []):
                out.setdefault(table, []).append(chain)
    return out


def jump_rules(iptables_save: str, table: str, chains: list[str]) -> list[str]:
    """`-A CHAIN ...` rules of `table`, in chains not being removed, that jump to one of `chains`."""
    rules, current = [], ""
    for line in iptables_save.splitlines():
        if line.startswith("*"):
            current = line[1:].strip()
        elif current == table and line.startswith("-A "):
            chain = line.split()[1]
            target = re.search(r"\s-j\s+(\S+)", line)
            if chain not in chains and target and target.group(1) in chains:
                rules.append(line)
    return rules


def mounts_under(mountinfo: str, roots: list[Path]) -> list[str]:
    """Mount points (from /proc/self/mountinfo) at or below any of roots, deepest first."""
    prefixes = [str(r).rstrip("/") for r in roots]
    points = []
    for line in mountinfo.splitlines():
        parts = line.split()
        if len(parts) < 5:
            continue
        point = parts[4].replace("\\040", " ")
        if any(point == p or point.startswith(p + "/") for p in prefixes):
            points.append(point)
    return sorted(set(points), key=lambda p: (-p.count("/"), p))


# ----------------------------------------------------------------------------------------- the node


@dataclass
class RealNode:
    """The node's processes and host state. `api(method, path, body=None, content_type=...)` calls the API
    server as the cluster admin (DevCluster provides it)."""

    workdir: Path
    pki: Path
    server: str
    node_ip: str
    bin_dir: Path
    api: ApiCall
    issue_client_cert: Callable[[str, str, list[str]], None]
    issue_server_cert: Callable[[str, str, list[str]], None]
    start_timeout: float = 180.0
    state: Path = STATE_DIR
    containerd_root: Path = field(default_factory=lambda: cache_dir() / "containerd")
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)
    containerd_version: str = ""
    enforce_network_policy: bool = False  # also kube-router's network policy controller

    @property
    def socket(self) -> Path:
        return self.state / "containerd.sock"

    @property
    def registry_hosts_dir(self) -> Path:
        return registry_hosts_dir(self.state)

    @property
    def kubelet_root(self) -> Path:
        return self.workdir / "kubelet"

    @property
    def pod_logs(self) -> Path:
        return self.workdir / "pod-logs"

    @property
    def ipam_dir(self) -> Path:
        return self.workdir / "cni-ipam"

    # ---------------------------------------------------------------------------------------- lifecycle

    def start(self) -> None:
        missing = missing_prerequisites(self.bin_dir, self.enforce_network_policy)
        if missing:
            raise NodeError("the real node needs: " + "; ".join(missing))
        if _answers(self.socket):
            raise NodeError(
                f"another real node runs on this host (containerd answers on {self.socket}): one node per host "
                "(it owns the bridge, the iptables chains and the cgroup root); stop it first (make cluster-down)"
            )
        for sub in ("logs", "cni", "pki"):
            (self.workdir / sub).mkdir(parents=True, exist_ok=True)
        _remember_chains(self.workdir)
        # A node left by a killed harness: clear it first, or the new kubelet adopts stale pods.
        cleanup_host(self.workdir, self.bin_dir, self.state)
        self.state.mkdir(parents=True, exist_ok=True)
        self.containerd_root.mkdir(parents=True, exist_ok=True)
        self._remember_sysctls()
        for name in ("kubelet", "kubelet-healthz", "proxy-healthz", "proxy-metrics", "dns", "dns-ready"):
            self.ports[name] = free_port()
        self._write_identities()

        self._start_containerd()
        self._ensure_pause_image()
        (self.workdir / "cni" / "10-posttrain.conflist").write_text(json.dumps(cni_conflist(self.ipam_dir)))
        self._make_cgroup_root()
        self._start_kubelet()
        self._wait_node_ready()
        self._start_kube_proxy()
        self._start_coredns()
        if self.enforce_network_policy:
            self._start_network_policy()

    def stop(self) -> None:
        """Stops every process and removes every trace on the host (see cleanup_host)."""
        for name in ("kubelet", "coredns"):
            proc = self.processes.pop(name, None)
            if proc is not None:
                stop_group(proc, grace=STOP_GRACE_SECONDS)
        _remove_pod_sandboxes(self.bin_dir, self.socket)
        for name in reversed(list(self.processes)):
            stop_group(self.processes.pop(name), grace=STOP_GRACE_SECONDS)
        cleanup_host(self.workdir, self.bin_dir, self.state)

    def check_alive(self) -> None:
        for name, proc in self.processes.items():
            if proc.poll() is not None:
                tail = (self.workdir / "logs" / f"{name}.log").read_text(errors="replace")[-2000:]
                raise NodeError(f"{name} exited with code {proc.returncode}; last log lines:\n{tail}")

    # ---------------------------------------------------------------------------------------- parts

    def _remember_sysctls(self) -> None:
        saved = self.workdir / "sysctls.json"
        if not saved.exists():
            values = {}
            for key in SYSCTLS:
                path = Path("/proc/sys") / key
                if path.exists():
                    values[key] = path.read_text().strip()
            saved.write_text(json.dumps(values))

    def _write_identities(self) -> None:
        """Client certificates (kubelet as system:node:<name> in system:nodes, kube-proxy as the
        system:kube-proxy user the API server's bootstrap RBAC binds, CoreDNS as posttrain-coredns), the
        kubelet's serving certificate, and a kubeconfig for each."""
        self.issue_client_cert("kubelet", f"system:node:{NODE_NAME}", ["system:nodes"])
        self.issue_client_cert("kube-proxy", "system:kube-proxy", [])
        self.issue_client_cert("coredns", "posttrain-coredns", [])
        self.issue_client_cert("kube-router", "posttrain-kube-router", [])
        self.issue_server_cert("kubelet-serving", NODE_NAME, [self.node_ip, NODE_NAME])
        for who in ("kubelet", "kube-proxy", "coredns", "kube-router"):
            (self.workdir / f"{who}.kubeconfig").write_text(yaml.safe_dump(self._kubeconfig(who)))

    def _kubeconfig(self, who: str) -> dict:
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {"name": "posttrain-dev", "cluster": {"server": self.server,
                                                      "certificate-authority": str(self.pki / "ca.crt")}}
            ],
            "users": [{"name": who, "user": {"client-certificate": str(self.pki / f"{who}.crt"),
                                             "client-key": str(self.pki / f"{who}.key")}}],
            "contexts": [{"name": "posttrain-dev", "context": {"cluster": "posttrain-dev", "user": who}}],
            "current-context": "posttrain-dev",
        }  # fmt: skip

    def _start_containerd(self) -> None:
        config = self.workdir / "containerd.toml"
        config.write_text(
            containerd_config(
                root=self.containerd_root,
                state=self.state / "state",
                socket_path=self.socket,
                cni_conf_dir=self.workdir / "cni",
                registry_hosts_dir=self.registry_hosts_dir,
                restrict_oom_score_adj=not can_lower_oom_score(),
            )
        )
        self._spawn("containerd", [f"--config={config}", "--log-level=warn"])
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            self.check_alive()
            out = self._ctr("version", check=False)
            if out.returncode == 0:
                match = re.search(r"Server:\s*\n\s*Version:\s*(\S+)", out.stdout)
                self.containerd_version = match.group(1) if match else ""
                return
            time.sleep(0.3)
        raise NodeError(f"containerd not answering on {self.socket} (see {self.workdir / 'logs'})")

    def _ctr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        result = subprocess.run(
            [str(self.bin_dir / "ctr"), "--address", str(self.socket), "--namespace", "k8s.io", *args],
            capture_output=True,
            text=True,
            timeout=600,
        )
        if check and result.returncode != 0:
            raise NodeError(f"ctr {' '.join(args)} failed: {result.stderr.strip()[-1000:]}")
        return result

    def import_binary_image(self, binary: Path, ref: str, *, user: str = "65532:65532") -> None:
        """Imports the static program `binary` as the image `ref` (one layer, entrypoint /<its name>) into
        the node's containerd, where pods find it (imagePullPolicy IfNotPresent or Never)."""
        archive = self.workdir / f"{binary.name}-image.tar"
        archive.write_bytes(binary_image_archive(binary.read_bytes(), binary.name, ref, user=user))
        try:
            self._ctr("images", "import", "--platform", "linux/amd64", str(archive))
        finally:
            archive.unlink()

    def _ensure_pause_image(self) -> None:
        if self._ctr("images", "ls", "-q", f"name=={PAUSE_IMAGE}").stdout.strip():
            return
        archive = self.workdir / "pause-image.tar"
        archive.write_bytes(pause_image_archive((self.bin_dir / "pause").read_bytes()))
        self._ctr("images", "import", "--platform", "linux/amd64", str(archive))
        archive.unlink()

    def _make_cgroup_root(self) -> None:
        """The kubelet wants its cgroup root to exist. A new cpuset cgroup (v1) starts with no CPUs and no
        memory nodes, so it gets its parent's."""
        for hierarchy in _cgroup_hierarchies():
            root = hierarchy / CGROUP_ROOT
            root.mkdir(exist_ok=True)
            for name in ("cpuset.cpus", "cpuset.mems"):
                mine, parent = root / name, hierarchy / name
                if mine.exists() and parent.exists() and not mine.read_text().strip():
                    mine.write_text(parent.read_text().strip())

    def _start_kubelet(self) -> None:
        config = self.workdir / "kubelet-config.yaml"
        config.write_text(
            yaml.safe_dump(
                kubelet_config(
                    node_ip=self.node_ip,
                    port=self.ports["kubelet"],
                    healthz_port=self.ports["kubelet-healthz"],
                    ca_file=self.pki / "ca.crt",
                    serving_cert=self.pki / "kubelet-serving.crt",
                    serving_key=self.pki / "kubelet-serving.key",
                    runtime_socket=self.socket,
                    pod_logs_dir=self.pod_logs,
                    cgroup_v1=cgroup_version() == 1,
                )
            )
        )
        self._spawn(
            "kubelet",
            [
                f"--config={config}",
                f"--kubeconfig={self.workdir / 'kubelet.kubeconfig'}",
                f"--root-dir={self.kubelet_root}",
                f"--hostname-override={NODE_NAME}",
                f"--node-ip={self.node_ip}",
                f"--node-labels={NODE_LABEL}=true",
                "--v=1",
            ],
        )

    def _wait_node_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            self.check_alive()
            try:
                node = self.api("GET", f"/api/v1/nodes/{NODE_NAME}")
            except urllib.error.HTTPError:
                node = {}
            ready = any(
                c.get("type") == "Ready" and c.get("status") == "True"
                for c in (node.get("status") or {}).get("conditions", [])
            )
            if ready:
                # The API server's TaintNodesByCondition admission tainted the new node not-ready; the node
                # lifecycle controller that would lift it is off in the dev cluster (kwok nodes send no
                # heartbeats), so lift it here once the kubelet says Ready.
                taints = [
                    t for t in (node.get("spec") or {}).get("taints") or [] if t["key"] != NOT_READY_TAINT
                ]
                self.api(
                    "PATCH",
                    f"/api/v1/nodes/{NODE_NAME}",
                    {"spec": {"taints": taints or None}},
                    content_type="application/merge-patch+json",
                )
                return
            time.sleep(0.5)
        raise NodeError(
            f"node {NODE_NAME} not Ready after {self.start_timeout:.0f}s (see {self.workdir / 'logs'})"
        )

    def _start_kube_proxy(self) -> None:
        config = self.workdir / "kube-proxy-config.yaml"
        config.write_text(
            yaml.safe_dump(
                kube_proxy_config(
                    kubeconfig=self.workdir / "kube-proxy.kubeconfig",
                    healthz_port=self.ports["proxy-healthz"],
                    metrics_port=self.ports["proxy-metrics"],
                    oom_score_adj=-999 if can_lower_oom_score() else 0,
                )
            )
        )
        self._spawn("kube-proxy", [f"--config={config}", "--v=1"])
        self._wait_http(f"http://127.0.0.1:{self.ports['proxy-healthz']}/healthz", "kube-proxy")

    def _start_coredns(self) -> None:
        for path, obj in dns_objects(self.node_ip, self.ports["dns"]):
            try:
                self.api("POST", path, obj)
            except urllib.error.HTTPError as err:
                if err.code != 409:
                    raise
        conf = self.workdir / "Corefile"
        conf.write_text(
            corefile(
                node_ip=self.node_ip,
                port=self.ports["dns"],
                ready_port=self.ports["dns-ready"],
                kubeconfig=self.workdir / "coredns.kubeconfig",
            )
        )
        self._spawn("coredns", [f"-conf={conf}"])
        self._wait_http(f"http://127.0.0.1:{self.ports['dns-ready']}/ready", "coredns")

    def _start_network_policy(self) -> None:
        """kube-router's network policy controller (RBAC: user posttrain-kube-router), ready once its
        top-level chain is in the filter table."""
        for path, obj in netpol_rbac():
            try:
                self.api("POST", path, obj)
            except urllib.error.HTTPError as err:
                if err.code != 409:
                    raise
        self._spawn(
            NETPOL_BINARY,
            [
                f"--kubeconfig={self.workdir / 'kube-router.kubeconfig'}",
                f"--hostname-override={NODE_NAME}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--enable-ipv6=false",
                "--iptables-sync-period=30s",
                "--v=1",
            ],
        )
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            self.check_alive()
            if ":KUBE-ROUTER-FORWARD " in _run("iptables-save", "-t", "filter").stdout:
                return
            time.sleep(0.5)
        raise NodeError(f"{NETPOL_BINARY} made no KUBE-ROUTER-FORWARD chain (see {self.workdir / 'logs'})")

    # ---------------------------------------------------------------------------------------- helpers

    def _spawn(self, name: str, args: list[str]) -> None:
        log = open(self.workdir / "logs" / f"{name}.log", "ab")  # noqa: SIM115 - handed to the child
        path = os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        env = {**os.environ, "PATH": f"{self.bin_dir}:{path}:/usr/sbin:/sbin"}
        self.processes[name] = subprocess.Popen(
            [str(self.bin_dir / name), *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
        log.close()
        (self.workdir / "pids.json").write_text(json.dumps({n: p.pid for n, p in self.processes.items()}))

    def _wait_http(self, url: str, what: str) -> None:
        deadline = time.monotonic() + self.start_timeout
        last = ""
        while time.monotonic() < deadline:
            self.check_alive()
            try:
                with urllib.request.urlopen(url, timeout=2) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as err:
                last = str(err)
            time.sleep(0.3)
        raise NodeError(f"{what} not healthy at {url} after {self.start_timeout:.0f}s: {last}")


# ----------------------------------------------------------------------------------------- teardown


def _cgroup_hierarchies() -> list[Path]:
    """Every mounted hierarchy: the one cgroup2 tree, or each v1 controller (and the hybrid `unified`)."""
    root = Path("/sys/fs/cgroup")
    if cgroup_version() == 2:
        return [root]
    return [p for p in root.iterdir() if p.is_dir() and not p.is_symlink()]


def _answers(sock: Path) -> bool:
    """Something accepts connections on this Unix socket."""
    if not sock.exists():
        return False
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.settimeout(2)
        try:
            client.connect(str(sock))
        except OSError:
            return False
    return True


def _remove_pod_sandboxes(bin_dir: Path, sock: Path) -> None:
    """Stops and removes every pod sandbox through the CRI (containerd runs each pod's CNI DEL: its IP,
    veth and port mappings go), while containerd still runs."""
    if not sock.exists():
        return
    crictl = [str(bin_dir / "crictl"), f"--runtime-endpoint=unix://{sock}", "--timeout=60s"]
    with contextlib.suppress(subprocess.SubprocessError, OSError):
        pods = subprocess.run(
            [*crictl, "pods", "-q"], capture_output=True, text=True, timeout=90
        ).stdout.split()
        for pod in pods:
            subprocess.run([*crictl, "stopp", pod], capture_output=True, timeout=120)
            subprocess.run([*crictl, "rmp", "-f", pod], capture_output=True, timeout=120)


def _pids_with(needle: str) -> list[int]:
    out = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if needle in cmdline:
            out.append(int(proc.name))
    return out


def _run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), capture_output=True, text=True, input=stdin, timeout=120)


IPTABLES = (("iptables-save", "iptables"), ("ip6tables-save", "ip6tables"))


def chains_before(workdir: Path) -> dict[str, dict[str, list[str]]]:
    """The KUBE-*/CNI-* chains that existed before the node started ({save command: {table: chains}})."""
    path = workdir / "iptables-before.json"
    return json.loads(path.read_text()) if path.exists() else {}


def _remember_chains(workdir: Path) -> None:
    path = workdir / "iptables-before.json"
    if not path.exists():
        # CNI-* chains only: KUBE-* chains are this node's by definition (one kubelet node per host).
        snapshot = {}
        for save, _ in IPTABLES:
            if shutil.which(save):
                chains = node_chains(_run(save).stdout)
                snapshot[save] = {t: [c for c in cs if c.startswith("CNI-")] for t, cs in chains.items()}
        path.write_text(json.dumps(snapshot))


def _iptables_cleanup(workdir: Path) -> None:
    before = chains_before(workdir)
    for save, command in IPTABLES:
        if not shutil.which(save):
            continue
        dump = _run(save).stdout
        for table, chains in node_chains(dump, before.get(save)).items():
            for rule in jump_rules(dump, table, chains):
                _run(command, "-t", table, *_split_rule(rule.replace("-A ", "-D ", 1)))
            for chain in chains:
                _run(command, "-t", table, "-F", chain)
            for chain in chains:
                _run(command, "-t", table, "-X", chain)


def _split_rule(rule: str) -> list[str]:
    import shlex

    return shlex.split(rule)


def cleanup_host(workdir: Path, bin_dir: Path, state: Path = STATE_DIR) -> None:
    """Idempotent: removes everything a node started from `workdir` may have left on the host, also after a
    crash: its processes, pod sandboxes (CNI DEL), containerd shims, mounts, network namespaces, the
    KUBE-*/CNI-* iptables chains, the bridge, the kubelet's cgroups, the CNI cache entries, the
    /var/log/containers links, and the sysctls it changed (restored)."""
    pids_file = workdir / "pids.json"
    if pids_file.exists():
        pids = json.loads(pids_file.read_text())
        # kubelet first (it would restart what we remove), containerd last (the CRI clean-up needs it).
        for name in ("kubelet", "coredns", NETPOL_BINARY, "kube-proxy"):
            if name in pids:
                _kill_group(pids[name])
        _remove_pod_sandboxes(bin_dir, state / "containerd.sock")
        if "containerd" in pids:
            _kill_group(pids["containerd"])
        pids_file.unlink()
    # Whatever still runs from this node: containerd shims (they outlive containerd and carry its socket
    # address), and the node's own programs when the pid file is gone (their flags name the work folder).
    strays = set(_pids_with(str(state)))
    if workdir.exists():
        strays |= {
            pid for pid in _pids_with(str(workdir))
            if Path(_cmd(pid).split(" ")[0]).name in (*NODE_BINARIES, NETPOL_BINARY)
        }
    for pid in strays - {os.getpid()}:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    if (bin_dir / "kube-proxy").exists() and workdir.exists():
        _run(str(bin_dir / "kube-proxy"), "--cleanup")
    mountinfo = Path("/proc/self/mountinfo").read_text()
    for point in mounts_under(mountinfo, [state, workdir]):
        _run("umount", "-l", point)
    netns = Path("/run/netns")
    if netns.is_dir():
        mountinfo = Path("/proc/self/mountinfo").read_text()
        for point in mounts_under(mountinfo, [netns]):
            if Path(point).name.startswith("cni-"):
                _run("umount", "-l", point)
                with contextlib.suppress(OSError):
                    Path(point).unlink()
    _iptables_cleanup(workdir)
    for name in node_ipsets():
        _run("ipset", "destroy", name)
    if Path(f"/sys/class/net/{BRIDGE}").exists():
        _run("ip", "link", "delete", BRIDGE)
    for hierarchy in _cgroup_hierarchies() if Path("/sys/fs/cgroup").exists() else []:
        root = hierarchy / CGROUP_ROOT
        if root.is_dir():
            for sub in sorted(root.rglob("*"), key=lambda p: -len(p.parts)):
                if sub.is_dir():
                    with contextlib.suppress(OSError):
                        sub.rmdir()
            with contextlib.suppress(OSError):
                root.rmdir()
    cni_cache = Path("/var/lib/cni/results")
    if cni_cache.is_dir():
        for entry in cni_cache.glob(f"{CNI_NETWORK}-*"):
            entry.unlink(missing_ok=True)
    containers_log = Path("/var/log/containers")
    if containers_log.is_dir():
        for link in containers_log.iterdir():
            if link.is_symlink() and str(workdir) in os.readlink(link):
                link.unlink()
    saved = workdir / "sysctls.json"
    if saved.exists():
        for key, value in json.loads(saved.read_text()).items():
            with contextlib.suppress(OSError):
                (Path("/proc/sys") / key).write_text(value)
        saved.unlink()
    if state.exists():
        shutil.rmtree(state, ignore_errors=True)


def node_ipsets(listing: str | None = None) -> list[str]:
    """kube-router's ipsets among `ipset list -n` (KUBE-* and inet6:KUBE-*); none where ipset is missing."""
    if listing is None:
        if not shutil.which("ipset"):
            return []
        listing = _run("ipset", "list", "-n").stdout
    return [n for n in listing.split() if n.startswith(IPSET_PREFIXES)]


def _kill_group(pid: int, grace: float = 15.0) -> None:
    stop_pids([pid], group=True, grace=grace, alive=signalable)


def leftovers(workdir: Path, state: Path = STATE_DIR) -> list[str]:
    """What a stopped node would have left behind on this host; empty when `stop()` cleaned up."""
    found = [f"process {pid}" for pid in _pids_with(str(state))]
    for name in ("kubelet", "kube-proxy", "coredns", NETPOL_BINARY, "containerd-shim-runc-v2"):
        found += [f"process {pid} ({name})" for pid in _pids_with(str(workdir)) if name in _cmd(pid)]
    mountinfo = Path("/proc/self/mountinfo").read_text()
    found += [f"mount {p}" for p in mounts_under(mountinfo, [state, workdir])]
    found += [f"mount {p}" for p in mounts_under(mountinfo, [Path("/run/netns")]) if "/cni-" in p]
    if Path("/run/netns").is_dir():
        found += [f"netns {p.name}" for p in Path("/run/netns").iterdir() if p.name.startswith("cni-")]
    before = chains_before(workdir)
    for save, _ in IPTABLES:
        if shutil.which(save):
            for table, chains in node_chains(_run(save).stdout, before.get(save)).items():
                found += [f"{save.split('-')[0]} {table} chain {c}" for c in chains]
    found += [f"ipset {name}" for name in node_ipsets()]
    if Path(f"/sys/class/net/{BRIDGE}").exists():
        found.append(f"link {BRIDGE}")
    for hierarchy in _cgroup_hierarchies():
        if (hierarchy / CGROUP_ROOT).exists():
            found.append(f"cgroup {hierarchy / CGROUP_ROOT}")
    if state.exists():
        found.append(f"directory {state}")
    return found


def _cmd(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""
