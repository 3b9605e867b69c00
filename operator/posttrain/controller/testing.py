"""Run `posttrain operator` as a real subprocess (tests and the benchmark): start, wait until its liveness
endpoint answers, read its counters, stop (SIGTERM) or kill (SIGKILL, to test restarts)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class OperatorProcess:
    def __init__(
        self,
        kubeconfig: str | Path,
        log_path: str | Path,
        *,
        namespace: str | None = None,
        env: dict[str, str] | None = None,
        verbose: bool = False,
    ):
        self.kubeconfig = str(kubeconfig)
        self.log_path = Path(log_path)
        self.namespace = namespace
        self.env = env or {}
        self.verbose = verbose
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0

    def start(self, timeout: float = 60.0) -> OperatorProcess:
        self.port = free_port()
        cmd = [sys.executable, "-m", "posttrain.cli", "operator", "--kubeconfig", self.kubeconfig]
        cmd += ["--liveness", f"http://127.0.0.1:{self.port}/healthz"]
        if self.namespace:
            cmd += ["--namespace", self.namespace]
        if self.verbose:
            cmd.append("--verbose")
        env = {**os.environ, "KUBECONFIG": self.kubeconfig, **self.env}
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"operator exited with {self.proc.returncode}; log: {self.log_tail()}")
            try:
                self.probe()
                return self
            except OSError:
                time.sleep(0.2)
        raise TimeoutError(f"operator not live after {timeout}s; log: {self.log_tail()}")

    def probe(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=5) as response:
            return json.loads(response.read() or b"{}")

    def counters(self) -> dict[str, Any]:
        return dict(self.probe().get("posttrain") or {})

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def kill(self) -> None:
        """SIGKILL: no cleanup at all, like a node dying under the operator."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self, timeout: float = 15.0) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def __enter__(self) -> OperatorProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# ------------------------------------------------------------------------------ cluster helpers (tests, bench)
REPO = Path(__file__).resolve().parents[3]
GROUP = "posttrain.dev"
VERSION = "v1alpha1"
KINDS = {"RLJob": ("rljobs", "rlj"), "SFTJob": ("sftjobs", "sftj"), "TaskApp": ("taskapps", "ta")}


def kubeconfig_of(cluster: Any) -> str:
    """The kubeconfig path from issue 3's `cluster` fixture (an object, a dict or a tuple)."""
    for attr in ("kubeconfig", "kubeconfig_path"):
        if hasattr(cluster, attr):
            return str(getattr(cluster, attr))
        if isinstance(cluster, dict) and attr in cluster:
            return str(cluster[attr])
    if isinstance(cluster, tuple | list):
        return str(cluster[0])
    return str(cluster)


def api_client_of(cluster: Any) -> Any:
    from kubernetes import client, config

    for attr in ("api", "api_client", "client"):
        value = getattr(cluster, attr, None)
        if isinstance(value, client.ApiClient):
            return value
    if isinstance(cluster, tuple | list) and len(cluster) > 1 and isinstance(cluster[1], client.ApiClient):
        return cluster[1]
    return config.new_client_from_config(config_file=kubeconfig_of(cluster))


def _minimal_crd(kind: str) -> dict[str, Any]:
    plural, short = KINDS[kind]
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"kind": kind, "plural": plural, "singular": kind.lower(), "shortNames": [short]},
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "schema": {
                        "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
                    },
                }
            ],
        },
    }


def ensure_crds(api: Any, timeout: float = 30.0) -> str:
    """Install the CRDs if the cluster lacks them: the generated ones in crds/ (issue 2), or, only while
    that directory does not exist yet, minimal schemaless ones. Returns which were used."""
    import yaml
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    ext = client.ApiextensionsV1Api(api)
    have = {c.metadata.name for c in ext.list_custom_resource_definition().items}
    wanted = [f"{plural}.{GROUP}" for plural, _ in KINDS.values()]
    if all(name in have for name in wanted):
        return "present"
    crd_dir = REPO / "crds"
    docs: list[dict[str, Any]] = []
    source = "crds/"
    if crd_dir.is_dir() and list(crd_dir.glob("*.yaml")):
        for path in sorted(crd_dir.glob("*.yaml")):
            docs += [
                d
                for d in yaml.safe_load_all(path.read_text())
                if d and d.get("kind") == "CustomResourceDefinition"
            ]
    else:
        source = "minimal (crds/ missing)"
        docs = [_minimal_crd(kind) for kind in KINDS]
    for doc in docs:
        if doc["metadata"]["name"] in have:
            continue
        try:
            ext.create_custom_resource_definition(doc)
        except ApiException as err:
            if err.status != 409:
                raise
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        established = 0
        for name in wanted:
            crd = ext.read_custom_resource_definition(name)
            conds = {c.type: c.status for c in (crd.status.conditions or [])}
            established += conds.get("Established") == "True"
        if established == len(wanted):
            time.sleep(1.0)  # discovery catches up
            return source
        time.sleep(0.2)
    raise TimeoutError("CRDs not established")


KWOK_EXIT_ANNOTATION = "posttrain.dev/kwok-exit"  # issue 3's kwok stages end a running pod with this code


def complete_trainer(
    api: Any, namespace: str, job_name: str, *, succeed: bool = True, timeout: float = 30
) -> int:
    """Drive the trainer Job's pods to exit (0 or 1) through the devcluster's kwok stage annotation."""
    from kubernetes import client

    core = client.CoreV1Api(api)
    deadline = time.monotonic() + timeout
    while True:
        pods = core.list_namespaced_pod(
            namespace, label_selector=f"batch.kubernetes.io/job-name={job_name}"
        ).items
        running = [p for p in pods if p.status.phase == "Running"]
        if running or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    for pod in running:
        core.patch_namespaced_pod(
            pod.metadata.name,
            namespace,
            {"metadata": {"annotations": {KWOK_EXIT_ANNOTATION: "0" if succeed else "1"}}},
        )
    return len(running)


def add_gpu_nodes(cluster: Any, count: int, start: int = 100) -> None:
    """Extra kwok GPU nodes on issue 3's DevCluster (the session cluster has 4 x 8 GPUs)."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    dev = getattr(cluster, "devcluster", cluster)
    core = client.CoreV1Api(api_client_of(cluster))
    names = []
    for index in range(start, start + count):
        manifest = dev.node_manifest(index)
        names.append(manifest["metadata"]["name"])
        try:
            core.create_node(manifest)
        except ApiException as err:
            if err.status != 409:
                raise
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        nodes = [core.read_node(n) for n in names]
        ready = [
            n
            for n in nodes
            if any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or [])
        ]
        for node in ready:
            if node.spec.taints:
                core.patch_node(node.metadata.name, {"spec": {"taints": None}})
        if len(ready) == len(names):
            return
        time.sleep(0.3)
    raise TimeoutError("extra kwok nodes not Ready")


def rljob_manifest(name: str, url: str, secret: str = "task-key", **spec: Any) -> dict[str, Any]:
    """A small GSPO RLJob of 2 GPUs (1 rollout, 1 trainer) against the task app at `url` (its key in Secret
    `secret`); extra keyword arguments are merged into spec."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "RLJob",
        "metadata": {"name": name},
        "spec": {
            "taskApp": {"url": url, "apiKeySecretRef": {"name": secret, "key": "ENVIRONMENT_API_KEY"}},
            "model": {"base": "posttrain/tiny-random-qwen2", "trainerMode": "full"},
            "algorithm": {"type": "online", "method": "policy_gradient", "variety": "gspo"},
            "compute": {
                "gpuType": "H100",
                "gpuCount": 2,
                "topology": {"gpusForVllm": 1, "gpusForTraining": 1, "tensorParallel": 1},
            },
            "rollout": {
                "envName": "math",
                "policyName": "math-single-step",
                "maxTurns": 1,
                "episodesPerBatch": 4,
                "maxConcurrentRollouts": 4,
            },
            "training": {
                "numEpochs": 1,
                "iterationsPerEpoch": 2,
                "maxTurns": 1,
                "batchSize": 4,
                "groupSize": 2,
                "learningRate": 0.0001,
            },
            "originalToml": '[algorithm]\ntype = "online"\n',
            **spec,
        },
    }
