"""Pure parts of the real dev node: its configurations, the pause image, the steering of pods between the
real node and the kwok GPU nodes, the clean-up's parsing, and the cluster-up ready marker."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

from cryptography import x509
from cryptography.x509.oid import NameOID
from posttrain_dev import devnode
from posttrain_dev.devcluster import (
    GPU_RESOURCE,
    GPU_TAINT,
    DevCluster,
    issue_certificate,
    ready_marker,
    write_certificates,
)

V1_MOUNTS = "tmpfs /sys/fs/cgroup tmpfs rw,relatime,mode=755 0 0\ncgroup /sys/fs/cgroup/cpu cgroup rw 0 0\n"
V2_MOUNTS = "cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid 0 0\n"


def _kubelet_config(cgroup_v1: bool) -> dict:
    return devnode.kubelet_config(
        node_ip="192.0.2.2", port=10250, healthz_port=10248, ca_file=Path("/p/ca.crt"),
        serving_cert=Path("/p/s.crt"), serving_key=Path("/p/s.key"), runtime_socket=Path("/run/x.sock"),
        pod_logs_dir=Path("/w/logs"), cgroup_v1=cgroup_v1,
    )  # fmt: skip


def test_cgroup_version_reads_the_file_system_type_of_sys_fs_cgroup():
    assert devnode.cgroup_version(V1_MOUNTS) == 1
    assert devnode.cgroup_version(V2_MOUNTS) == 2


def test_fail_cgroup_v1_false_is_set_only_on_a_cgroup_v1_host():
    assert _kubelet_config(cgroup_v1=True)["failCgroupV1"] is False
    assert "failCgroupV1" not in _kubelet_config(cgroup_v1=False)


def test_kubelet_uses_the_cluster_dns_and_never_deletes_the_locally_built_images():
    config = _kubelet_config(cgroup_v1=True)
    assert config["clusterDNS"] == [devnode.DNS_SERVICE_IP]
    assert config["containerRuntimeEndpoint"] == "unix:///run/x.sock"
    assert config["cgroupDriver"] == "cgroupfs" and config["cgroupRoot"] == f"/{devnode.CGROUP_ROOT}"
    assert config["imageGCHighThresholdPercent"] == 100
    assert config["authentication"]["anonymous"]["enabled"] is False
    assert config["readOnlyPort"] == 0


def test_kube_proxy_runs_iptables_mode_and_leaves_conntrack_sysctls_alone():
    config = devnode.kube_proxy_config(kubeconfig=Path("/k"), healthz_port=1, metrics_port=2)
    assert config["mode"] == "iptables"
    assert config["clusterCIDR"] == devnode.CLUSTER_CIDR
    assert config["hostnameOverride"] == devnode.NODE_NAME
    assert config["conntrack"]["maxPerCore"] == 0 and config["conntrack"]["min"] == 0


def test_containerd_config_points_the_cri_at_runc_cni_and_the_local_pause_image(tmp_path: Path):
    import tomllib

    text = devnode.containerd_config(
        root=tmp_path / "root",
        state=tmp_path / "state",
        socket_path=tmp_path / "c.sock",
        cni_conf_dir=tmp_path,
    )
    config = tomllib.loads(text)
    assert config["version"] == 3 and config["grpc"]["address"] == str(tmp_path / "c.sock")
    runtime = config["plugins"]["io.containerd.cri.v1.runtime"]
    runc = runtime["containerd"]["runtimes"]["runc"]
    assert runc["runtime_type"] == "io.containerd.runc.v2" and runc["options"]["SystemdCgroup"] is False
    assert runtime["cni"]["conf_dir"] == str(tmp_path)
    images = config["plugins"]["io.containerd.cri.v1.images"]
    assert images["pinned_images"]["sandbox"] == devnode.PAUSE_IMAGE


def test_containerd_reads_registry_hosts_from_the_nodes_state_and_trusts_a_loopback_registry(tmp_path: Path):
    """make e2e pulls the images from a registry on 127.0.0.1 (hack/registry.sh): containerd reads
    <config_path>/<host:port>/hosts.toml, which sends pulls there over plain HTTP."""
    import tomllib

    hosts = devnode.registry_hosts_dir(tmp_path)
    assert hosts == tmp_path / "certs.d" and devnode.registry_hosts_dir() == devnode.STATE_DIR / "certs.d"
    config = tomllib.loads(
        devnode.containerd_config(
            root=tmp_path,
            state=tmp_path,
            socket_path=tmp_path / "s",
            cni_conf_dir=tmp_path,
            registry_hosts_dir=hosts,
        )
    )
    images = config["plugins"]["io.containerd.cri.v1.images"]
    assert images["registry"]["config_path"] == str(hosts)
    assert images["discard_unpacked_layers"] is True  # the snapshots are what pods run from
    toml = tomllib.loads(devnode.registry_hosts_toml("127.0.0.1:5077"))
    assert toml["server"] == "http://127.0.0.1:5077"
    assert toml["host"]["http://127.0.0.1:5077"]["capabilities"] == ["pull", "resolve"]


def test_cni_network_is_one_bridge_with_host_local_ips_and_portmap(tmp_path: Path):
    conf = devnode.cni_conflist(tmp_path)
    bridge, portmap = conf["plugins"]
    assert bridge["type"] == "bridge" and bridge["bridge"] == devnode.BRIDGE and bridge["hairpinMode"] is True
    assert bridge["ipam"]["ranges"] == [[{"subnet": devnode.POD_CIDR}]]
    assert bridge["ipam"]["dataDir"] == str(tmp_path)
    assert portmap["type"] == "portmap"


def test_dns_service_routes_to_coredns_on_the_node():
    objects = dict(devnode.dns_objects("192.0.2.2", 5353))
    service = objects["/api/v1/namespaces/kube-system/services"]
    assert service["spec"]["clusterIP"] == devnode.DNS_SERVICE_IP
    assert {p["targetPort"] for p in service["spec"]["ports"]} == {5353}
    slice_ = objects["/apis/discovery.k8s.io/v1/namespaces/kube-system/endpointslices"]
    assert slice_["metadata"]["labels"]["kubernetes.io/service-name"] == "kube-dns"
    assert slice_["endpoints"][0]["addresses"] == ["192.0.2.2"]
    assert {(p["port"], p["protocol"]) for p in slice_["ports"]} == {(5353, "UDP"), (5353, "TCP")}
    corefile = devnode.corefile(node_ip="192.0.2.2", port=5353, ready_port=8181, kubeconfig=Path("/k"))
    assert "bind 192.0.2.2" in corefile and f"kubernetes {devnode.CLUSTER_DOMAIN}" in corefile


def test_pause_image_is_an_oci_layout_whose_digests_match():
    archive = devnode.pause_image_archive(b"\x7fELF-pause")
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        files = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}  # type: ignore[union-attr]
    index = json.loads(files["index.json"])
    entry = index["manifests"][0]
    assert entry["annotations"]["io.containerd.image.name"] == devnode.PAUSE_IMAGE
    manifest = files[f"blobs/sha256/{entry['digest'].split(':')[1]}"]
    assert hashlib.sha256(manifest).hexdigest() == entry["digest"].split(":")[1]
    layer_ref = json.loads(manifest)["layers"][0]
    layer = files[f"blobs/sha256/{layer_ref['digest'].split(':')[1]}"]
    with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
        member = tar.getmember("pause")
        assert member.mode == 0o755 and tar.extractfile(member).read() == b"\x7fELF-pause"  # type: ignore[union-attr]


IPTABLES = """# Generated by iptables-save
*nat
:PREROUTING ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-SERVICES - [0:0]
:CNI-HOSTPORT-DNAT - [0:0]
:DOCKER - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A PREROUTING -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT
-A PREROUTING -j DOCKER
-A KUBE-SERVICES -j KUBE-MARK-MASQ
COMMIT
*filter
:INPUT ACCEPT [0:0]
:KUBE-FIREWALL - [0:0]
-A INPUT -j KUBE-FIREWALL
COMMIT
"""


def test_cleanup_takes_kube_chains_and_new_cni_chains_with_the_rules_that_jump_to_them():
    """CNI-* chains that another CNI user (buildah, podman) had before the node started stay: the first
    version removed every CNI-* chain on the host, podman's too."""
    assert devnode.node_chains(IPTABLES) == {
        "nat": ["KUBE-SERVICES", "CNI-HOSTPORT-DNAT"],
        "filter": ["KUBE-FIREWALL"],
    }
    kept = devnode.node_chains(IPTABLES, keep={"nat": ["CNI-HOSTPORT-DNAT"]})
    assert kept == {"nat": ["KUBE-SERVICES"], "filter": ["KUBE-FIREWALL"]}
    assert devnode.jump_rules(IPTABLES, "nat", kept["nat"]) == [
        '-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES',
    ]
    assert devnode.jump_rules(IPTABLES, "filter", kept["filter"]) == ["-A INPUT -j KUBE-FIREWALL"]


def test_a_programs_image_runs_it_as_the_given_user():
    archive = devnode.binary_image_archive(b"\x7fELF-netcheck", "netcheck", "localhost/x/netcheck:1", user="65532:65532")
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        files = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}  # type: ignore[union-attr]
    entry = json.loads(files["index.json"])["manifests"][0]
    assert entry["annotations"]["io.containerd.image.name"] == "localhost/x/netcheck:1"
    manifest = json.loads(files[f"blobs/sha256/{entry['digest'].split(':')[1]}"])
    image_config = json.loads(files[f"blobs/sha256/{manifest['config']['digest'].split(':')[1]}"])
    assert image_config["config"] == {"Entrypoint": ["/netcheck"], "User": "65532:65532"}


KUBE_ROUTER_IPTABLES = """*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:KUBE-ROUTER-FORWARD - [0:0]
:KUBE-POD-FW-ABC - [0:0]
:KUBE-NWPLCY-XYZ - [0:0]
-A FORWARD -m comment --comment "kube-router netpol - TEMCG2JMHZYE7H7T" -j KUBE-ROUTER-FORWARD
-A KUBE-ROUTER-FORWARD -d 10.244.0.5/32 -j KUBE-POD-FW-ABC
-A KUBE-POD-FW-ABC -j KUBE-NWPLCY-XYZ
COMMIT
"""


def test_kube_routers_chains_and_ipsets_are_the_nodes_to_remove():
    """The network policy controller's chains are KUBE-* chains (removed with the jumps to them from the
    built-in chains), and its ipsets KUBE-SRC-*/KUBE-DST-* (inet6: for IPv6) go too; other ipsets stay."""
    chains = devnode.node_chains(KUBE_ROUTER_IPTABLES)
    assert chains == {"filter": ["KUBE-ROUTER-FORWARD", "KUBE-POD-FW-ABC", "KUBE-NWPLCY-XYZ"]}
    assert devnode.jump_rules(KUBE_ROUTER_IPTABLES, "filter", chains["filter"]) == [
        '-A FORWARD -m comment --comment "kube-router netpol - TEMCG2JMHZYE7H7T" -j KUBE-ROUTER-FORWARD'
    ]
    listing = "KUBE-SRC-4BW3QFHN5KT7OXKR\nKUBE-DST-VOOZ5OFQD3FHP7V5\ninet6:KUBE-SRC-X\nmy-own-set\n"
    assert devnode.node_ipsets(listing) == ["KUBE-SRC-4BW3QFHN5KT7OXKR", "KUBE-DST-VOOZ5OFQD3FHP7V5", "inet6:KUBE-SRC-X"]


def test_the_enforcer_is_needed_only_where_the_node_enforces_network_policy(tmp_path: Path):
    assert not any(devnode.NETPOL_BINARY in m for m in devnode.missing_prerequisites(tmp_path))
    assert any(devnode.NETPOL_BINARY in m for m in devnode.missing_prerequisites(tmp_path, network_policy=True))
    (path, role), (_, binding) = devnode.netpol_rbac()
    rules = {(r["apiGroups"][0], res): set(r["verbs"]) for r in role["rules"] for res in r["resources"]}
    assert {"list", "watch"} <= rules[("networking.k8s.io", "networkpolicies")] and "get" in rules[("", "nodes")]
    assert binding["subjects"][0]["name"] == "posttrain-kube-router" and path.endswith("/clusterroles")


def test_mounts_under_lists_the_deepest_first_and_nothing_outside():
    info = (
        "1 0 8:1 / / rw - ext4 /dev/vda rw\n"
        "2 1 0:5 / /run/posttrain-node/state/x/rootfs rw - overlay overlay rw\n"
        "3 1 0:6 / /run/posttrain-node rw - tmpfs tmpfs rw\n"
        "4 1 0:7 / /w/node/kubelet/pods/u/volumes/kubernetes.io~projected/t rw - tmpfs tmpfs rw\n"
        "5 1 0:8 / /run/posttrain-nodeX rw - tmpfs tmpfs rw\n"
    )
    assert devnode.mounts_under(info, [Path("/run/posttrain-node"), Path("/w/node")]) == [
        "/w/node/kubelet/pods/u/volumes/kubernetes.io~projected/t",
        "/run/posttrain-node/state/x/rootfs",
        "/run/posttrain-node",
    ]


def test_beside_a_real_node_kwok_nodes_take_only_gpu_pods(tmp_path: Path):
    assert DevCluster(tmp_path).node_manifest(0)["spec"] == {}
    taints = DevCluster(tmp_path, real_node=True).node_manifest(0)["spec"]["taints"]
    assert taints == [GPU_TAINT] and GPU_TAINT["key"] == GPU_RESOURCE and GPU_TAINT["effect"] == "NoSchedule"


def test_with_a_real_node_the_api_server_is_reachable_from_pods_and_authorizes_the_kubelet(tmp_path: Path):
    plain = DevCluster(tmp_path)
    plain.ports.update(apiserver=6443, etcd=2)
    args = plain._apiserver_args()
    assert "--bind-address=127.0.0.1" in args and "--endpoint-reconciler-type=none" in args
    real = DevCluster(tmp_path, real_node=True, host="192.0.2.2")
    real.ports.update(apiserver=6443, etcd=2)
    args = real._apiserver_args()
    assert "--bind-address=192.0.2.2" in args and "--advertise-address=192.0.2.2" in args
    assert "--endpoint-reconciler-type=none" not in args
    assert "--authorization-mode=Node,RBAC" in args
    assert any("ExtendedResourceToleration" in a for a in args if a.startswith("--enable-admission-plugins"))
    assert real.server == "https://192.0.2.2:6443"


def test_issued_certificates_name_the_user_groups_and_serving_addresses(tmp_path: Path):
    write_certificates(tmp_path, server_names=("192.0.2.2",))
    ca = x509.load_pem_x509_certificate((tmp_path / "ca.crt").read_bytes())
    server = x509.load_pem_x509_certificate((tmp_path / "apiserver.crt").read_bytes())
    sans = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "192.0.2.2" in [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)]
    issue_certificate(tmp_path, "kubelet", "system:node:n1", ["system:nodes"])
    kubelet = x509.load_pem_x509_certificate((tmp_path / "kubelet.crt").read_bytes())
    kubelet.verify_directly_issued_by(ca)
    assert kubelet.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "system:node:n1"
    assert [o.value for o in kubelet.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)] == [
        "system:nodes"
    ]
    issue_certificate(tmp_path, "serving", "n1", [], ["192.0.2.2", "n1"])
    serving = x509.load_pem_x509_certificate((tmp_path / "serving.crt").read_bytes())
    names = serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "n1" in names.get_values_for_type(x509.DNSName)


def test_cluster_up_accepts_only_the_ready_marker_of_the_harness_it_started(tmp_path: Path):
    """`cluster-down && cluster-up` once returned at the previous harness's marker, leaving a kubeconfig
    that named the old API server's port."""
    (tmp_path / "ready").write_text(json.dumps({"pid": 111, "seconds": 3.0, "server": "https://127.0.0.1:1"}))
    assert ready_marker(tmp_path, 222) is None
    assert ready_marker(tmp_path, 111) == {"pid": 111, "seconds": 3.0, "server": "https://127.0.0.1:1"}
    (tmp_path / "ready").write_text("12.5\n")  # the old format: no pid, never accepted
    assert ready_marker(tmp_path, 111) is None


def test_oom_score_is_clamped_only_where_no_process_may_lower_it(tmp_path: Path):
    """On the dev machine CAP_SYS_RESOURCE is missing from every process's bounding set (CapBnd
    000001fffeffffff), so runc could not give a pod sandbox the -998 the kubelet asks for and no pod
    started ("can't get final child's PID from pipe")."""
    import tomllib

    without = "Name:\tx\nCapBnd:\t000001fffeffffff\n"
    full = "Name:\tx\nCapBnd:\t000001ffffffffff\n"
    assert not devnode.can_lower_oom_score(without) and devnode.can_lower_oom_score(full)
    args = dict(root=tmp_path, state=tmp_path, socket_path=tmp_path / "s", cni_conf_dir=tmp_path)
    runtime = "io.containerd.cri.v1.runtime"
    clamped = tomllib.loads(devnode.containerd_config(**args, restrict_oom_score_adj=True))
    assert clamped["plugins"][runtime]["restrict_oom_score_adj"] is True
    assert (
        tomllib.loads(devnode.containerd_config(**args))["plugins"][runtime]["restrict_oom_score_adj"]
        is False
    )
