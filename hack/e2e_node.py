"""`make e2e`: the product's cluster path end to end on the dev control plane with a real kubelet node, the
way a user runs it. Needs root, `make k8s-bins node-bins images` (make e2e builds them first).

 1. the control plane + the real node (posttrain_dev.devcluster, real_node=True) in .cluster-e2e/; the images
    `make images` built go through a registry, as a user's cluster gets them: Debian's docker-registry on
    127.0.0.1 (hack/registry.sh start), `buildah push` to it (hack/registry.sh push), and the node's
    containerd told to pull from it over plain HTTP (hosts.toml in its registry config_path);
 2. `kubectl apply --server-side -k` an overlay of manifests/overlays/dev-node whose `images:` names that
    registry (the install guide's override; every pod pulls, imagePullPolicy Always): CRDs, RBAC, the
    operator Deployment, MinIO, the jobs namespace and the math TaskApp by image; waits for all of them and
    the TaskApp verified;
 3. the tiny test model is uploaded to s3://posttrain/models/<base id>/ (POSTTRAIN_BASE_MODEL_URI);
 4. hack/e2e/rl.toml -> `posttrain convert` -> `kubectl apply`; follows `kubectl get rljobs` through
    Verifying -> Provisioning -> Running -> Succeeded; after the first checkpoint it SIGKILLs the trainer's
    container (crictl stop -t 0) and checks the replacement pod logs the step it resumed at;
 5. checks the trainer patched status.progress as the trainer ServiceAccount, held to its own job, downloads the fine-tuned model
    from the printed S3 URI and loads it with transformers;
 6. an RLJob whose Secret holds a wrong key reaches Failed, and no trainer Job or pod is ever created;
 7. examples/demo/sft.toml (its dataset uploaded to S3) -> convert -> apply -> Succeeded;
 8. deleting the RLJob removes every pod; the cluster is stopped and the host checked for leftovers.
The last line printed is the summary `e2e: RLJob <name> Succeeded in <s> s on node <node> (...)`.
Exit 0 when every check holds, 1 otherwise (the failing check is printed, the cluster kept with --keep)."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "operator"))

from posttrain.localhost import free_port  # noqa: E402
from posttrain_dev import devnode  # noqa: E402
from posttrain_dev.devcluster import DevCluster, kubectl_path  # noqa: E402

NS = "posttrain-jobs"
RL_NAME = "e2e-rl"
WRONG_NAME = "e2e-wrong-key"
SFT_NAME = "e2e-sft"
BUCKET = "posttrain"
S3_KEYS = ("posttrain-dev", "posttrain-dev-only")  # MinIO's root pair (dev overlay, throwaway): the admin's
TINY_BASE = "posttrain/tiny-random-qwen2"
IMAGE_TAG = os.environ.get("POSTTRAIN_IMAGE_TAG", "dev")  # what `make images` built (hack/build-images.sh)
T0 = time.monotonic()


class E2EError(AssertionError):
    pass


# The registry's blobs live beside the other caches, outside the clone and outside the cluster's folder (which
# every start clears): a later run pushes only the layers that changed.
REGISTRY_DIR = devnode.cache_dir() / "registry"


def say(message: str) -> None:
    print(f"[{time.monotonic() - T0:7.1f}s] {message}", flush=True)


class Kube:
    def __init__(self, kubeconfig: Path) -> None:
        self.kubeconfig = kubeconfig

    def run(self, *args: str, check: bool = True, stdin: str | None = None, timeout: float = 300) -> str:
        proc = subprocess.run(
            [kubectl_path(), f"--kubeconfig={self.kubeconfig}", *args],
            capture_output=True, text=True, input=stdin, timeout=timeout,
        )  # fmt: skip
        if check and proc.returncode != 0:
            raise E2EError(f"kubectl {' '.join(args)} failed: {proc.stderr.strip()[-2000:]}")
        return proc.stdout

    def json(self, *args: str) -> dict:
        return json.loads(self.run(*args, "-o", "json"))


def wait(predicate, timeout: float, what: str, interval: float = 2.0):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise E2EError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def posttrain(*args: str, env: dict | None = None) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "posttrain.cli", *args], capture_output=True, text=True, cwd=REPO,
        env={**os.environ, **(env or {})}, timeout=300,
    )  # fmt: skip
    if proc.returncode != 0:
        raise E2EError(f"posttrain {' '.join(args)} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return proc.stdout


# ------------------------------------------------------------------------------------------------ steps


def serve_images(registry_dir: Path) -> str:
    """Starts the e2e's registry on 127.0.0.1, pushes the images `make images` built to it and points the
    node's containerd at it; returns the registry's host:port/posttrain."""
    t = time.monotonic()
    script = str(REPO / "hack" / "registry.sh")
    started = subprocess.run(
        ["bash", script, "start", str(registry_dir), str(free_port())], check=True,
        capture_output=True, text=True,
    )  # fmt: skip
    address = started.stdout.strip().splitlines()[-1]
    say(f"docker-registry on {address} ({registry_dir}) in {time.monotonic() - t:.0f} s")
    t = time.monotonic()
    registry = f"{address}/posttrain"
    subprocess.run(["bash", script, "push", registry, IMAGE_TAG], check=True)
    say(f"images pushed to {registry} in {time.monotonic() - t:.0f} s")
    hosts = devnode.registry_hosts_dir() / address / "hosts.toml"
    hosts.parent.mkdir(parents=True, exist_ok=True)
    hosts.write_text(devnode.registry_hosts_toml(address))
    say(f"the node's containerd pulls {address} over HTTP ({hosts})")
    return registry


def registry_overlay(workdir: Path, registry: str) -> Path:
    """An overlay of dev-node that takes every image from the registry, as docs/how-to/cluster-install.md
    shows a user: its `images:` only (base/kustomizeconfig/images.yaml carries them into the operator's
    trainer/rollout settings and the TaskApp), and every pull asks the registry (imagePullPolicy Always:
    the node's containerd keeps images between runs, and the tag `dev` moves with each build)."""
    workdir.mkdir(parents=True, exist_ok=True)
    base = os.path.relpath(REPO / "manifests" / "overlays" / "dev-node", workdir)  # kustomize: no absolute
    images = [
        (f"posttrain/{n}", f"{registry}/{n}") for n in ("operator", "trainer", "rollout", "taskapp-math")
    ]
    images.append(("localhost/posttrain/minio", f"{registry}/minio"))
    always = [
        {"op": "replace", "path": "/spec/template/spec/containers/0/imagePullPolicy", "value": "Always"}
    ]
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [base],
        "images": [{"name": name, "newName": new, "newTag": IMAGE_TAG} for name, new in images],
        "patches": [
            {"target": {"kind": kind, "name": name}, "patch": json.dumps(always)}
            for kind, name in (("StatefulSet", "minio"), ("Job", "minio-tenants"))
        ]
        + [
            {
                "patch": json.dumps({
                    "apiVersion": "apps/v1", "kind": "Deployment",
                    "metadata": {"name": "posttrain-operator", "namespace": "posttrain-system"},
                    "spec": {"template": {"spec": {"containers": [{
                        "name": "operator", "imagePullPolicy": "Always",
                        "env": [{"name": "POSTTRAIN_IMAGE_PULL_POLICY", "value": "Always"}],
                    }]}}},
                })
            }
        ],
    }  # fmt: skip
    (workdir / "kustomization.yaml").write_text(json.dumps(kustomization, indent=2))
    return workdir


def install(kube: Kube, overlay_dir: Path) -> None:
    overlay = str(overlay_dir)
    for attempt in range(3):  # the ClusterKopfPeering object waits for its CRD, applied in the same call
        out = subprocess.run(
            [kubectl_path(), f"--kubeconfig={kube.kubeconfig}", "apply", "--server-side", "-k", overlay],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        if out.returncode == 0:
            break
        if attempt == 2:
            raise E2EError(f"kubectl apply -k {overlay} failed: {out.stderr[-2000:]}")
        time.sleep(3)
    say(f"kubectl apply --server-side -k {overlay} (manifests/overlays/dev-node, images from the registry)")
    kube.run(
        "-n", "posttrain-system", "rollout", "status", "statefulset/minio", "--timeout=600s", timeout=620
    )
    kube.run("-n", "posttrain-system", "rollout", "status", "deployment/posttrain-operator", "--timeout=600s",
             timeout=620)  # fmt: skip
    # each jobs namespace's MinIO user (jobs/<namespace>/ only): its jobs hold no other keys
    kube.run("-n", "posttrain-system", "wait", "--for=condition=complete", "job/minio-tenants", "--timeout=600s",
             timeout=620)  # fmt: skip
    say("MinIO (with a user per jobs namespace) and the operator are ready")
    wait(
        lambda: (kube.json("-n", NS, "get", "taskapps", "math").get("status") or {}).get("verified"),
        600, "TaskApp math verified",
    )  # fmt: skip
    say("TaskApp math deployed by the operator and verified")


def s3_client(kube: Kube):
    from minio import Minio

    svc = kube.json("-n", "posttrain-system", "get", "service", "minio")
    # The host reaches Service IPs through kube-proxy's rules, as pods do.
    return Minio(
        f"{svc['spec']['clusterIP']}:9000", access_key=S3_KEYS[0], secret_key=S3_KEYS[1], secure=False
    )


def upload_dir(client, local: Path, prefix: str) -> int:
    if not client.bucket_exists(BUCKET):
        client.make_bucket(BUCKET)
    n = 0
    for path in sorted(local.rglob("*")):
        if path.is_file():
            client.fput_object(BUCKET, f"{prefix}{path.relative_to(local)}", str(path))
            n += 1
    return n


def upload_models(kube: Kube) -> None:
    from posttrain.modelzoo import build_tiny_model, convert_smollm2

    client = s3_client(kube)
    # vLLM's CPU attention rejects head_dim 16, so the head_dim-32 variant of the tiny model (hidden 128).
    tiny = build_tiny_model(REPO / ".models" / "tiny-random-qwen2-hd32", hidden_size=128)
    n = upload_dir(client, tiny, f"models/{TINY_BASE}/")
    smol = convert_smollm2(REPO / ".models" / "smollm2-135m-instruct")
    m = upload_dir(client, smol, "models/HuggingFaceTB/SmolLM2-135M-Instruct/")
    say(f"models uploaded to s3://{BUCKET}/models/ ({n} + {m} files)")


def job_pods(kube: Kube, job: str, role: str | None = None) -> list[dict]:
    selector = f"posttrain.dev/job={job}" + (f",posttrain.dev/role={role}" if role else "")
    return kube.json("-n", NS, "get", "pods", "-l", selector)["items"]


MANIFEST_TYPES = ", ".join([
    "application/vnd.oci.image.manifest.v1+json", "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.oci.image.index.v1+json", "application/vnd.docker.distribution.manifest.list.v2+json",
])  # fmt: skip


def registry_digest(registry: str, image: str) -> str:
    """The manifest digest the registry serves for `image` (host:port/repo:tag), from its v2 API."""
    import httpx

    host, _, rest = image.partition("/")
    repo, _, tag = rest.rpartition(":")
    response = httpx.head(f"http://{host}/v2/{repo}/manifests/{tag}", headers={"Accept": MANIFEST_TYPES})
    if response.status_code != 200 or not response.headers.get("Docker-Content-Digest"):
        raise E2EError(f"{registry} does not serve {image} (HTTP {response.status_code})")
    return response.headers["Docker-Content-Digest"]


def check_pulled_from(kube: Kube, registry: str) -> int:
    """Every container of the operator's and the jobs' pods names an image of the registry and ran exactly
    the manifest the registry serves for it (the digest of its imageID): the node pulled it, nothing was
    imported. (A container status' `image` may show another name of the same image in the node's store,
    so the spec's name is the one checked.) Returns the number of containers checked."""
    checked, digests = 0, {}
    for namespace in ("posttrain-system", NS):
        for pod in kube.json("-n", namespace, "get", "pods")["items"]:
            images = {c["name"]: c["image"] for c in pod["spec"].get("containers", [])}
            for status in (pod.get("status") or {}).get("containerStatuses") or []:
                where = f"{namespace}/{pod['metadata']['name']} container {status.get('name')}"
                image, image_id = images.get(status.get("name"), ""), status.get("imageID", "")
                if not image.startswith(f"{registry}/"):
                    raise E2EError(f"{where} runs {image}, not an image of {registry}")
                if image not in digests:
                    digests[image] = registry_digest(registry, image)
                if not image_id.endswith("@" + digests[image]):
                    raise E2EError(
                        f"{where} ran {image_id or 'no image yet'}; {registry} serves {digests[image]}"
                    )
                checked += 1
    if not checked:
        raise E2EError("no running container to check the images of")
    say(f"{checked} containers ran the images {registry} serves ({len(digests)} images, by digest)")
    return checked


def apply_rl(kube: Kube, workdir: Path, name: str, secret: str) -> float:
    out = workdir / f"{name}.yaml"
    posttrain("convert", "--config", str(REPO / "hack" / "e2e" / "rl.toml"), "--name", name, "--namespace", NS,
              "--task-app", "math", "--api-key-secret", secret, "--output", str(out))  # fmt: skip
    kube.run("apply", "--server-side", "-f", str(out))
    say(f"posttrain convert hack/e2e/rl.toml -> {out.name}; kubectl apply (RLJob {name})")
    return time.monotonic()


def follow_rl(kube: Kube, started: float) -> dict:
    """Polls the RLJob like `kubectl get rljobs -w`; kills the trainer after the first checkpoint."""
    phases: list[str] = []
    killed: dict = {}
    deadline = time.monotonic() + 3600
    while time.monotonic() < deadline:
        job = kube.json("-n", NS, "get", "rljobs", RL_NAME)
        status = job.get("status") or {}
        phase = status.get("phase") or "Pending"
        if not phases or phases[-1] != phase:
            phases.append(phase)
            print(kube.run("-n", NS, "get", "rljobs", RL_NAME, "--no-headers").rstrip(), flush=True)
            say(f"phase {phase}" + (f": {status.get('message')}" if status.get("message") else ""))
        if phase == "Failed":
            raise E2EError(f"RLJob {RL_NAME} Failed: {status.get('reason')}: {status.get('message')}")
        if phase == "Succeeded":
            return {"job": job, "phases": phases, "seconds": time.monotonic() - started, **killed}
        step = int((status.get("progress") or {}).get("step") or 0)
        if (
            not killed
            and phase == "Running"
            and 1 <= step < int((status.get("progress") or {}).get("total") or 99)
        ):
            killed = kill_trainer(kube, step)
        time.sleep(0.5)  # a fast CPU runs the tiny model's iterations in a few seconds each
    raise E2EError(f"RLJob {RL_NAME} did not finish within an hour (phases {phases})")


def kill_trainer(kube: Kube, step: int) -> dict:
    pods = [p for p in job_pods(kube, RL_NAME, "trainer") if p["status"].get("phase") == "Running"]
    if not pods:
        return {}
    pod = pods[0]
    container = next(
        c["containerID"] for c in pod["status"]["containerStatuses"] if c["name"] == "trainer"
    ).split("://", 1)[1]
    crictl = [
        str(REPO / "bin" / "crictl"),
        f"--runtime-endpoint=unix://{devnode.STATE_DIR / 'containerd.sock'}",
    ]
    subprocess.run([*crictl, "stop", "--timeout", "0", container], check=True, capture_output=True)
    say(f"killed the trainer container of pod {pod['metadata']['name']} (SIGKILL) at step {step}")
    return {"killed_pod": pod["metadata"]["uid"], "killed_at": step}


def resumed_step(kube: Kube, killed_uid: str) -> int:
    """The replacement trainer pod's log line `event {"event": "resumed", "step": k, ...}`."""
    pods = [p for p in job_pods(kube, RL_NAME, "trainer") if p["metadata"]["uid"] != killed_uid]
    if not pods:
        raise E2EError("no replacement trainer pod was created after the kill")
    logs = kube.run("-n", NS, "logs", pods[0]["metadata"]["name"], "-c", "trainer")
    match = re.search(r'"event":\s*"resumed".*?"step":\s*(\d+)', logs)
    if not match:
        raise E2EError(f"the replacement trainer did not log a resume:\n{logs[-3000:]}")
    line = next(ln for ln in logs.splitlines() if '"resumed"' in ln)
    say(f"replacement pod {pods[0]['metadata']['name']} logged: {line.strip()[:200]}")
    return int(match.group(1))


def check_trainer_identity(kube: Kube, job: dict) -> None:
    """status.progress came from the trainer, as the namespace's ServiceAccount posttrain-trainer, which
    the admission policy posttrain-trainer-own-job lets patch this job's status and no other's (checked
    with a server-side dry run as that ServiceAccount from the trainer's pod: the pod name is what the
    policy reads from a pod-bound token)."""
    progress = (job.get("status") or {}).get("progress") or {}
    if not progress.get("step"):
        raise E2EError(f"status.progress was never written: {job.get('status')}")
    sa = "posttrain-trainer"
    trainer_job = kube.json("-n", NS, "get", "jobs", f"{RL_NAME}-trainer")
    if trainer_job["spec"]["template"]["spec"]["serviceAccountName"] != sa:
        raise E2EError("the trainer pods do not run as the namespace's trainer ServiceAccount")
    user = f"system:serviceaccount:{NS}:{sa}"
    pod = job_pods(kube, RL_NAME, "trainer")[0]["metadata"]["name"]

    def may_patch(from_pod: str) -> str:
        # A PATCH request of its own (kubectl patch GETs the object first, which the Role does not allow),
        # impersonating the ServiceAccount with the pod name a pod-bound token carries.
        from kubernetes import client, config
        from kubernetes.client.rest import ApiException
        from posttrain.api.resources import GROUP, VERSION

        api = config.new_client_from_config(config_file=str(kube.kubeconfig))
        api.set_default_header("Impersonate-User", user)
        api.set_default_header("Impersonate-Extra-authentication.kubernetes.io%2Fpod-name", from_pod)
        body = {"status": {"progress": {"step": 1}}}
        try:
            client.CustomObjectsApi(api).patch_namespaced_custom_object_status(
                GROUP, VERSION, NS, "rljobs", RL_NAME, body, dry_run="All"
            )
        except ApiException as err:
            return f"HTTP {err.status}: {str(err.body)[-300:]}"
        finally:
            api.close()
        return "yes"

    # its own trainer pod may; another job's trainer pod (e2e-other's) may not
    can, other = may_patch(pod), may_patch("e2e-other-trainer-0-bcdfg")
    if can != "yes" or "a trainer may patch only its own job" not in other:
        raise E2EError(f"{user}: patch from its own pod {pod} {can!r}, from another job's pod {other!r}")
    managers = {m.get("manager") for m in job["metadata"].get("managedFields", [])
                if m.get("subresource") == "status" and "f:progress" in json.dumps(m.get("fieldsV1", {}))}  # fmt: skip
    for pod in job_pods(kube, RL_NAME, "trainer"):
        logs = kube.run("-n", NS, "logs", pod["metadata"]["name"], "-c", "trainer", check=False)
        if "status patch failed" in logs:
            raise E2EError(f"trainer pod {pod['metadata']['name']} could not patch status:\n{logs[-2000:]}")
    say(
        f"status.progress (step {progress['step']}/{progress.get('total')}) written by {sorted(managers)} as {user}"
    )


def check_model_loads(kube: Kube, job: dict, workdir: Path) -> str:
    status = job["status"]
    uri = (status.get("artifacts") or {}).get("model") or ""
    if not status.get("fineTunedModel") or not uri.startswith(f"s3://{BUCKET}/"):
        raise E2EError(f"no fineTunedModel/model artifact in status: {status}")
    client = s3_client(kube)
    prefix = uri[len(f"s3://{BUCKET}/") :]
    local = workdir / "final"
    for obj in client.list_objects(BUCKET, prefix=prefix, recursive=True):
        client.fget_object(BUCKET, obj.object_name, str(local / obj.object_name[len(prefix) :]))
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(local)
    AutoTokenizer.from_pretrained(local)
    say(f"{uri} loads with transformers ({type(model).__name__}, {model.num_parameters()} parameters)")
    return str(status["fineTunedModel"])


def wrong_key_job(kube: Kube, workdir: Path) -> None:
    secret = kube.run("-n", NS, "create", "secret", "generic", "e2e-wrong-key", "--dry-run=client", "-o", "yaml",
                      "--from-literal=ENVIRONMENT_API_KEY=sk_env_wrong_0000")  # fmt: skip
    kube.run("apply", "-f", "-", stdin=secret)
    kube.run("-n", NS, "label", "--overwrite", "secret", "e2e-wrong-key", "posttrain.dev/use=task-app-key")
    apply_rl(kube, workdir, WRONG_NAME, "e2e-wrong-key")
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        children = kube.json("-n", NS, "get", "jobs,pods", "-l", f"posttrain.dev/job={WRONG_NAME}")["items"]
        trainers = [c for c in children if c["metadata"]["labels"].get("posttrain.dev/role") == "trainer"]
        if trainers:
            raise E2EError(
                f"a trainer was created for the wrong-key job: {[c['metadata']['name'] for c in trainers]}"
            )
        status = kube.json("-n", NS, "get", "rljobs", WRONG_NAME).get("status") or {}
        if status.get("phase") == "Failed":
            say(
                f"RLJob {WRONG_NAME} Failed ({status.get('reason')}: {status.get('message')}); no trainer Job or pod"
            )
            if status.get("reason") != "TaskAppVerificationFailed":
                raise E2EError(f"wrong-key job failed for another reason: {status}")
            return
        if status.get("phase") in ("Running", "Succeeded"):
            raise E2EError(f"wrong-key job reached {status['phase']}")
        time.sleep(1)
    raise E2EError("the wrong-key job did not reach Failed in 600 s")


def sft_job(kube: Kube, workdir: Path) -> str:
    data = REPO / "examples" / "demo" / "sft_warmup.jsonl"
    client = s3_client(kube)
    key = f"jobs/{NS}/datasets/{SFT_NAME}/train.jsonl"  # the namespace's folder: its jobs read no other
    if not client.bucket_exists(BUCKET):
        client.make_bucket(BUCKET)
    client.fput_object(BUCKET, key, str(data))
    out = workdir / f"{SFT_NAME}.yaml"
    posttrain("convert", "--config", str(REPO / "examples" / "demo" / "sft.toml"), "--type", "sft", "--name", SFT_NAME,
              "--namespace", NS, "--dataset", f"s3://{BUCKET}/{key}", "--output", str(out))  # fmt: skip
    kube.run("apply", "--server-side", "-f", str(out))
    say(
        f"posttrain convert examples/demo/sft.toml (dataset s3://{BUCKET}/{key}); kubectl apply (SFTJob {SFT_NAME})"
    )
    phases: list[str] = []

    def done():
        status = kube.json("-n", NS, "get", "sftjobs", SFT_NAME).get("status") or {}
        phase = status.get("phase") or "Pending"
        if not phases or phases[-1] != phase:
            phases.append(phase)
            say(f"SFTJob phase {phase}" + (f": {status.get('message')}" if status.get("message") else ""))
        if phase == "Failed":
            raise E2EError(f"SFTJob failed: {status}")
        return status if phase == "Succeeded" else None

    status = wait(done, 1800, "the SFTJob to succeed")
    say(
        f"SFTJob {SFT_NAME} Succeeded: fineTunedModel={status.get('fineTunedModel')} (phases {' -> '.join(phases)})"
    )
    return str(status.get("fineTunedModel"))


def delete_removes_pods(kube: Kube) -> None:
    kube.run("-n", NS, "delete", "rljob", RL_NAME, "--wait=true", "--timeout=300s", timeout=320)
    wait(lambda: not job_pods(kube, RL_NAME), 300, f"every pod of {RL_NAME} to go")
    say(f"kubectl delete rljob {RL_NAME}: every pod of the job is gone")


# ------------------------------------------------------------------------------------------------ main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", default=str(REPO / ".cluster-e2e"), help="the cluster's work folder")
    parser.add_argument("--keep", action="store_true", help="leave the cluster running when a check fails")
    parser.add_argument(
        "--kubeconfig",
        help="run against this running cluster with the real node (make cluster-up REAL_NODE=1) instead of "
        "starting one; it is left running",
    )
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="posttrain-e2e-"))
    cluster = (
        None if args.kubeconfig else DevCluster(Path(args.dir).resolve(), real_node=True, start_timeout=120)
    )
    summary = ""
    ok = False
    try:
        t = time.monotonic()
        if cluster is not None:
            cluster.start()
            say(f"control plane + real node {devnode.NODE_NAME} ready in {time.monotonic() - t:.0f} s "
                f"(API server {cluster.server})")  # fmt: skip
        kube = Kube(cluster.kubeconfig if cluster is not None else Path(args.kubeconfig).resolve())
        runtime = kube.run(
            "get", "node", devnode.NODE_NAME, "-o", "jsonpath={.status.nodeInfo.containerRuntimeVersion}"
        )
        registry = serve_images(REGISTRY_DIR)
        install(kube, registry_overlay(Path(args.dir).resolve() / "overlay", registry))
        for kind, name in (
            ("rljob", RL_NAME),
            ("rljob", WRONG_NAME),
            ("sftjob", SFT_NAME),
        ):  # an earlier run's
            kube.run("-n", NS, "delete", kind, name, "--ignore-not-found", "--wait=true", timeout=300)
        upload_models(kube)
        started = apply_rl(kube, workdir, RL_NAME, "math-task-app-key")
        result = follow_rl(kube, started)
        # In first-seen order: the trainer's replacement pod after the kill shows Provisioning again while it
        # starts, then Running.
        order = [
            p
            for p in dict.fromkeys(result["phases"])
            if p in ("Verifying", "Provisioning", "Running", "Succeeded")
        ]
        # A job that names a Verified TaskApp trusts its condition and skips its own Verifying pass (the
        # operator writes no status for a check that passes at once); one that verifies shows it first.
        if [p for p in order if p != "Verifying"] != ["Provisioning", "Running", "Succeeded"] or (
            "Verifying" in order and order[0] != "Verifying"
        ):
            raise E2EError(f"phases seen: {result['phases']}")
        if "killed_pod" not in result:
            raise E2EError("the trainer finished before it could be killed after its first checkpoint")
        resumed = resumed_step(kube, result["killed_pod"])
        job = result["job"]
        nodes = {p["spec"].get("nodeName") for p in job_pods(kube, RL_NAME)}
        check_trainer_identity(kube, job)
        pulled = check_pulled_from(kube, registry)
        fine_tuned = check_model_loads(kube, job, workdir)
        wrong_key_job(kube, workdir)
        sft_job(kube, workdir)
        delete_removes_pods(kube)
        summary = (
            f"e2e: RLJob {RL_NAME} Succeeded in {result['seconds']:.0f} s on node {','.join(sorted(nodes))} "
            f"({runtime}); fineTunedModel={fine_tuned}; resumed at step {resumed} "
            f"after trainer kill; wrong-key job Failed without trainer; {pulled} containers from {registry}"
        )
        ok = True
    except (E2EError, devnode.NodeError, subprocess.SubprocessError, OSError) as err:
        print(f"e2e FAILED: {err}", file=sys.stderr, flush=True)
    finally:
        subprocess.run(["bash", str(REPO / "hack" / "registry.sh"), "stop", str(REGISTRY_DIR)])
        if cluster is None:
            pass
        elif args.keep and not ok:
            say(f"cluster kept: export KUBECONFIG={cluster.kubeconfig}; stop it with "
                f"`PYTHONPATH=hack python -m posttrain_dev.devcluster down --dir {args.dir}`")  # fmt: skip
        else:
            cluster.stop()
            left = devnode.leftovers(Path(args.dir).resolve() / "node")
            say("cluster stopped; host checked: " + ("; ".join(left) if left else "nothing left behind"))
            ok = ok and not left
        say(f"total {time.monotonic() - T0:.0f} s")
    if summary:
        print(summary, flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
