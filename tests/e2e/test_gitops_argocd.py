"""GitOps for real (`make e2e-gitops`): a real Argo CD (application-controller + repo-server, redis, a git
repository served over git://; tests/fixtures/argocd.py) syncs a git folder of posttrain custom resources
into the real control plane, where the real operator runs them and kwok plays the pods.

The folder holds what a user commits: a TaskApp and two RLJobs written by `posttrain convert`. The
Application, its AppProject and the argocd-cm settings are the ones manifests/argocd ships (only the
repository URL, path and namespace edited, as a user does). The job phases are driven the way the operator
tests drive them (the trainer's result written into status, the trainer pod ended through kwok), and every
health verdict below is Argo CD's own: its Lua runtime running manifests/argocd/health/*.lua on the live
objects, read from Application.status. Checked:
- Argo CD applies the TaskApp first (sync wave) and the jobs once it is Healthy, i.e. verified;
- a job shows Progressing while it runs and Healthy with its fine-tuned model at Succeeded;
- a job whose trainer fails shows Degraded with the operator's message;
- the Application stays Synced (one sync per commit, never OutOfSync) while the operator writes status and
  finalizers and the API server fills CRD defaults;
- deleting a job's file from git prunes the job, and the garbage collector its children;
- a job edited in place in git is refused (its spec is immutable) and Argo CD says so; reverted, Synced.
Each of it in three apply/diff modes (MODES). tests/fixtures/argocd.py prints the summary as the session's
last line, in a fixed format."""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from fixtures.argocd import (
    ARGOCD_NAMESPACE,
    ArgoCDHandle,
    GitOpsResult,
    apply,
    kubectl,
    shipped_argocd_manifests,
)
from fixtures.operator_process import (
    GROUP,
    VERSION,
    OperatorProcess,
    api_client_of,
    complete_trainer,
    ensure_crds,
)
from kubernetes import client
from kubernetes.client.rest import ApiException
from posttrain.api.exitcodes import EXIT_CONFIG_ERROR

pytestmark = [pytest.mark.cluster, pytest.mark.argocd]

REPO = Path(__file__).resolve().parents[2]
SECRET = "math-task-app-key"
GOOD, BAD = "math-gspo", "math-gspo-fails"
# How Argo CD applies and diffs: as shipped (server-side apply, so its structured-merge diff), its default
# (client-side apply and the three-way diff against last-applied-configuration), and server-side diff
# (a dry-run apply on the API server, so admission and CRD defaulting are in the comparison).
MODES = ["shipped", "client-side-apply", "server-side-diff"]
OPERATOR_ENV = {
    "POSTTRAIN_VERIFY_TIMEOUT_SECONDS": "20",
    "POSTTRAIN_VERIFY_BACKOFF_INITIAL": "0.5",
    "POSTTRAIN_VERIFY_BACKOFF_MAX": "2",
    "POSTTRAIN_VERIFY_REQUEST_TIMEOUT": "2",
    "POSTTRAIN_RESYNC_SECONDS": "5",
    "POSTTRAIN_S3_ENDPOINT": "http://127.0.0.1:9",
    "POSTTRAIN_TASK_APP_ALLOWED_NETWORKS": "127.0.0.0/8,::1/128",  # the task app runs on 127.0.0.1
}


def wait_for(fn: Callable[[], Any], timeout: float, what: str, on_timeout: Callable[[], str] = str) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; last={last!r}\n{on_timeout()}")


def converted_rljob(name: str, workdir: Path) -> str:
    """`posttrain convert` of the demo GSPO TOML (on GPUs, for the kwok nodes), naming the TaskApp `math`."""
    toml = workdir / f"{name}.toml"
    toml.write_text(
        (REPO / "examples/demo/rl.toml").read_text().replace('gpu_type = "CPU"', 'gpu_type = "H100"')
    )
    proc = subprocess.run(
        [sys.executable, "-m", "posttrain.cli", "convert", "-c", str(toml), "--name", name,
         "--task-app", "math", "--api-key-secret", SECRET],
        capture_output=True, text=True, cwd=REPO, check=True,
    )  # fmt: skip
    return proc.stdout


def taskapp_yaml(url: str) -> str:
    """The TaskApp a user writes for a task app that runs outside the cluster. It leaves out what the CRD
    defaults (port, replicas, the Secret key, the other verification timings): the API server fills those
    in, and Argo CD must still call the object Synced. Wave -1: applied, and Healthy, before the jobs."""
    return yaml.safe_dump(
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "TaskApp",
            "metadata": {"name": "math", "annotations": {"argocd.argoproj.io/sync-wave": "-1"}},
            "spec": {
                "url": url,
                "apiKeySecretRef": {"name": SECRET},
                "verification": {"timeoutSeconds": 120},
            },
        },
        sort_keys=False,
    )


class ApplicationWatch:
    """Polls the Application in a thread and keeps every observation: sync status per revision, health,
    sync history, and Argo CD's health of each resource."""

    def __init__(self, co: client.CustomObjectsApi, name: str):
        self.co = co
        self.name = name
        self.seen: list[dict[str, Any]] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def get(self) -> dict[str, Any]:
        return self.co.get_namespaced_custom_object(
            "argoproj.io", "v1alpha1", ARGOCD_NAMESPACE, "applications", self.name
        )

    def snapshot(self) -> dict[str, Any]:
        status = self.get().get("status") or {}
        resources = {
            (r["kind"], r["name"]): {
                "sync": r.get("status"),
                "health": (r.get("health") or {}).get("status"),
                "message": (r.get("health") or {}).get("message"),
            }
            for r in status.get("resources") or []
        }
        return {
            "t": time.monotonic(),
            "wall": time.time(),
            "revision": (status.get("sync") or {}).get("revision"),
            "sync": (status.get("sync") or {}).get("status"),
            "health": (status.get("health") or {}).get("status"),
            "operation": (status.get("operationState") or {}).get("phase"),
            "operation_message": (status.get("operationState") or {}).get("message") or "",
            "operation_revision": ((status.get("operationState") or {}).get("syncResult") or {}).get(
                "revision"
            ),
            "history": [h.get("revision") for h in status.get("history") or []],
            "conditions": [(c.get("type"), c.get("message")) for c in status.get("conditions") or []],
            "resources": resources,
        }

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.seen.append(self.snapshot())
            except Exception as exc:  # noqa: BLE001 - recorded, the assertions read them
                self.errors.append(repr(exc))
            self._stop.wait(0.5)

    def __enter__(self) -> ApplicationWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def latest(self) -> dict[str, Any]:
        return self.seen[-1] if self.seen else {}

    def until(
        self, predicate: Callable[[dict[str, Any]], bool], timeout: float, what: str, logs: Callable[[], str]
    ):
        def check() -> dict[str, Any] | None:
            snap = self.latest()
            return snap if snap and predicate(snap) else None

        return wait_for(check, timeout, f"Application {what}", lambda: f"{self.latest()}\n{logs()}")

    def first_synced(self) -> dict[str, float]:
        """revision -> wall time Argo CD was first seen calling it Synced."""
        out: dict[str, float] = {}
        for snap in self.seen:
            if snap["sync"] == "Synced":
                out.setdefault(snap["revision"], snap["wall"])
        return out

    def resyncs(self, core: client.CoreV1Api) -> tuple[list[tuple[str, float]], list[tuple[str, float]]]:
        """Automated syncs Argo CD started again at a revision it had already synced, from the Application's
        Events (self-heal syncs of single resources are not in status.history): (those after it had
        called that revision Synced, i.e. drift; those before, while its cache had not yet seen what the
        first sync created)."""
        uid = self.get()["metadata"]["uid"]
        started: dict[str, list[float]] = {}
        for event in core.list_namespaced_event(
            ARGOCD_NAMESPACE, field_selector=f"involvedObject.uid={uid}"
        ).items:
            found = re.search(r"Initiated automated sync to '([0-9a-f]{40})'", event.message or "")
            if event.reason == "OperationStarted" and found:
                when = event.last_timestamp or event.event_time or event.first_timestamp
                started.setdefault(found[1], []).extend([when.timestamp()] * (event.count or 1))
        synced = self.first_synced()
        after, before = [], []
        for revision, times in started.items():
            for when in sorted(times)[1:]:
                # Event times have a resolution of one second.
                late = revision in synced and when > synced[revision] + 1.0
                (after if late else before).append((revision[:8], when))
        return after, before

    def out_of_sync_after_synced(self) -> list[dict[str, Any]]:
        """Observations where a revision that had been Synced was no longer Synced."""
        synced: set[str] = set()
        bad = []
        for snap in self.seen:
            if snap["sync"] == "Synced":
                synced.add(snap["revision"])
            elif snap["revision"] in synced:
                bad.append(snap)
        return bad


def resource(snap: dict[str, Any], kind: str, name: str) -> dict[str, Any]:
    return snap["resources"].get((kind, name)) or {}


def configure(app: dict[str, Any], mode: str) -> None:
    options = app["spec"]["syncPolicy"]["syncOptions"]
    assert "ServerSideApply=true" in options
    if mode == "client-side-apply":
        options.remove("ServerSideApply=true")
    elif mode == "server-side-diff":
        app["metadata"].setdefault("annotations", {})["argocd.argoproj.io/compare-options"] = (
            "ServerSideDiff=true"
        )


@pytest.mark.parametrize("mode", MODES)
def test_argocd_syncs_jobs_from_git(
    cluster: Any,
    namespace: str,
    math_taskapp: Any,
    argocd: ArgoCDHandle,
    gitops_results: list[GitOpsResult],
    tmp_path: Path,
    mode: str,
):
    began = time.monotonic()
    folder = namespace  # one folder of the repository per test
    kcfg = Path(cluster.kubeconfig)
    api = api_client_of(cluster)
    ensure_crds(api)
    co, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    git, server = argocd.git, argocd.argocd
    logs = server.logs

    # Secrets never go to git: the key is created in the namespace, the objects name it.
    core.create_namespaced_secret(
        namespace,
        client.V1Secret(
            metadata=client.V1ObjectMeta(name=SECRET, labels={"posttrain.dev/use": "task-app-key"}),
            string_data={"ENVIRONMENT_API_KEY": math_taskapp.api_key},
        ),
    )
    operator = OperatorProcess(kcfg, tmp_path / "operator.log", namespace=namespace, env=OPERATOR_ENV).start()

    # The Application and AppProject as shipped, pointed at this repository and namespace.
    shipped = shipped_argocd_manifests()
    project = next(d for d in shipped if d["kind"] == "AppProject")
    app = next(d for d in shipped if d["kind"] == "Application" and d["metadata"]["name"] == "posttrain-jobs")
    assert app["spec"]["project"] == project["metadata"]["name"]
    project["spec"]["sourceRepos"] = [git.url]
    for dest in project["spec"]["destinations"]:
        dest["namespace"] = namespace
    app["spec"]["source"].update(repoURL=git.url, path=folder)
    configure(app, mode)
    app["spec"]["destination"]["namespace"] = namespace
    assert app["spec"]["syncPolicy"]["automated"]["prune"] is True, "the shipped Application must prune"

    first = git.commit(
        {
            f"{folder}/taskapp-math.yaml": taskapp_yaml(math_taskapp.url),
            f"{folder}/{GOOD}.yaml": converted_rljob(GOOD, tmp_path),
            f"{folder}/{BAD}.yaml": converted_rljob(BAD, tmp_path),
        },
        "a task app and two GSPO jobs",
    )
    names = {("TaskApp", "math"), ("RLJob", GOOD), ("RLJob", BAD)}

    def rljob(name: str) -> dict[str, Any] | None:
        try:
            return co.get_namespaced_custom_object(GROUP, VERSION, namespace, "rljobs", name)
        except ApiException as err:
            if err.status == 404:
                return None
            raise

    def phase(name: str) -> str | None:
        return ((rljob(name) or {}).get("status") or {}).get("phase")

    def everything() -> str:
        return f"{logs()}\n--- operator:\n{operator.log_tail()}"

    try:
        apply(kcfg, [project], "posttrain")
        synced_at = time.monotonic()
        apply(kcfg, [app], "posttrain")
        with ApplicationWatch(co, app["metadata"]["name"]) as watch:
            # 1. The first sync: all three objects from git, Synced.
            snap = watch.until(
                lambda s: (
                    s["revision"] == first
                    and s["sync"] == "Synced"
                    and s["operation"] == "Succeeded"
                    and names <= {k for k, r in s["resources"].items() if r["sync"] == "Synced"}
                ),
                240,
                f"Synced at {first[:8]}",
                everything,
            )
            sync_seconds = time.monotonic() - synced_at
            compared_before = server.comparisons()
            synced_objects = len(snap["resources"])
            assert set(snap["resources"]) == names, snap["resources"]
            # Wave -1 first: Argo CD created the jobs only after the TaskApp was verified (Healthy).
            taskapp = co.get_namespaced_custom_object(GROUP, VERSION, namespace, "taskapps", "math")
            verified = next(c for c in taskapp["status"]["conditions"] if c["type"] == "Verified")
            assert verified["status"] == "True", taskapp["status"]
            for name in (GOOD, BAD):
                created = (rljob(name) or {})["metadata"]["creationTimestamp"]
                assert created >= verified["lastTransitionTime"], (name, created, verified)
            # The API server filled the CRD's defaults that git leaves out; Argo CD still says Synced.
            spec = taskapp["spec"]
            assert spec["port"] == 8000 and spec["apiKeySecretRef"]["key"] == "ENVIRONMENT_API_KEY", spec
            assert spec["verification"]["periodSeconds"] == 60, spec

            # 2. Both jobs run (kwok pods): Argo CD says Progressing, with the operator's phase.
            for name in (GOOD, BAD):
                wait_for(lambda n=name: phase(n) == "Running", 120, f"{name} Running", everything)
            watch.until(
                lambda s: (
                    all(
                        resource(s, "RLJob", n).get("health") == "Progressing"
                        and (resource(s, "RLJob", n).get("message") or "").startswith("Running")
                        for n in (GOOD, BAD)
                    )
                    and resource(s, "TaskApp", "math").get("health") == "Healthy"
                    and s["health"] == "Progressing"
                ),
                240,
                "jobs Progressing (Running)",
                everything,
            )

            # 3. The trainer of the first job reports its model and exits 0: Healthy, with the model.
            uid = rljob(GOOD)["metadata"]["uid"]
            model = f"rl:HuggingFaceTB/SmolLM2-135M-Instruct:{namespace}.{GOOD}.{uid.replace('-', '')[:8]}"
            result = {"fineTunedModel": model, "artifacts": {"model": f"s3://posttrain/jobs/{GOOD}/final/"}}
            co.patch_namespaced_custom_object_status(
                GROUP, VERSION, namespace, "rljobs", GOOD, {"status": {"result": result}}
            )
            assert complete_trainer(api, namespace, f"{GOOD}-trainer", succeed=True) >= 1
            wait_for(lambda: phase(GOOD) == "Succeeded", 120, f"{GOOD} Succeeded", everything)
            watch.until(
                lambda s: resource(s, "RLJob", GOOD).get("health") == "Healthy",
                240,
                f"{GOOD} Healthy",
                everything,
            )
            assert resource(watch.latest(), "RLJob", GOOD)["message"] == f"Succeeded: {model}"

            # 4. The second job's trainer fails with a config error (a retryable exit is retried by the Job's
            # backoffLimit first): Degraded, with the operator's message.
            assert complete_trainer(api, namespace, f"{BAD}-trainer", exit_code=EXIT_CONFIG_ERROR) >= 1
            wait_for(lambda: phase(BAD) == "Failed", 120, f"{BAD} Failed", everything)
            failed_message = rljob(BAD)["status"]["message"]
            assert failed_message, rljob(BAD)["status"]
            snap = watch.until(
                lambda s: resource(s, "RLJob", BAD).get("health") == "Degraded" and s["health"] == "Degraded",
                240,
                f"{BAD} Degraded",
                everything,
            )
            assert resource(snap, "RLJob", BAD)["message"] == failed_message, (snap, failed_message)
            assert resource(snap, "RLJob", GOOD)["health"] == "Healthy", snap

            # Until now one commit, one sync, and Synced throughout: status writes, finalizers and
            # defaults never made Argo CD see a difference (and self-heal never had to re-apply),
            # over several full comparisons while the operator was writing.
            assert watch.latest()["history"] == [first], watch.latest()
            assert not watch.out_of_sync_after_synced(), watch.out_of_sync_after_synced()[:3]
            assert not watch.resyncs(core)[0], watch.resyncs(core)
            compared = wait_for(
                lambda: (n := server.comparisons() - compared_before) >= 3 and n,
                240,
                "3 comparisons",
                everything,
            )
            assert not watch.out_of_sync_after_synced(), watch.out_of_sync_after_synced()[:3]

            # 5. The failed job's file leaves git: Argo CD prunes the job, the garbage collector its children.
            children_before = children(api, namespace, BAD)
            assert children_before, "the failed job had no children to prune"
            second = git.commit({f"{folder}/{BAD}.yaml": None}, "drop the failed job")
            snap = watch.until(
                lambda s: (
                    s["revision"] == second
                    and s["sync"] == "Synced"
                    and s["operation"] == "Succeeded"
                    and ("RLJob", BAD) not in s["resources"]
                    and s["health"] == "Healthy"
                ),
                180,
                f"Synced at {second[:8]} without {BAD}, Healthy",
                everything,
            )
            wait_for(lambda: rljob(BAD) is None, 60, f"{BAD} deleted", everything)
            wait_for(lambda: not children(api, namespace, BAD), 90, f"{BAD}'s children deleted", everything)
            assert rljob(GOOD) is not None and phase(GOOD) == "Succeeded"
            assert resource(snap, "RLJob", GOOD)["health"] == "Healthy", snap

            # 6. Editing a job in git in place (same name, new learning rate) is refused by the CRD's
            # immutability rule; the job is untouched. (A new TOML is a new job: convert without --name
            # names it from its content.)
            converted = (git.work / folder / f"{GOOD}.yaml").read_text()
            assert "learningRate: 0.0002" in converted
            edited = git.commit(
                {f"{folder}/{GOOD}.yaml": converted.replace("learningRate: 0.0002", "learningRate: 0.0003")},
                "edit a running job in place",
            )
            if mode == "server-side-diff":
                # The diff is a dry-run apply, which the API server refuses: the comparison fails (sync
                # Unknown, the refusal as a ComparisonError). At the next comparison Argo CD reuses the
                # diff it cached for the previous commit (server-side diff keeps its cache past the
                # reconciliation timeout) and reports Synced although git and the cluster differ. This is
                # why the shipped Application sets ServerSideDiff=false.
                errored = watch.until(
                    lambda s: (
                        s["revision"] == edited
                        and s["sync"] == "Unknown"
                        and any("spec.training is immutable" in (m or "") for _, m in s["conditions"])
                    ),
                    240,
                    f"the comparison at {edited[:8]} failing",
                    everything,
                )
                refused = next(m for _, m in errored["conditions"] if "immutable" in (m or ""))
                watch.until(
                    lambda s: s["revision"] == edited and s["sync"] == "Synced",
                    120,
                    "a stale Synced",
                    everything,
                )
                outcome = "reported Synced after a failed comparison (stale server-side diff cache)"
            else:
                # The sync fails and Argo CD retries, saying why; back to the converted YAML in git, the
                # next retry takes that commit (retry.refresh) and the Application is Synced again.
                snap = watch.until(
                    lambda s: (
                        s["revision"] == edited
                        and s["sync"] == "OutOfSync"
                        and "spec.training is immutable" in s["operation_message"]
                    ),
                    240,
                    f"the in-place edit at {edited[:8]} refused",
                    everything,
                )
                refused = snap["operation_message"]
                outcome = "OutOfSync, sync refused"
            assert rljob(GOOD)["spec"]["training"]["learningRate"] == 0.0002
            restored = git.commit({f"{folder}/{GOOD}.yaml": converted}, "back to the converted job")
            watch.until(
                # Synced by a sync of the restored commit: in the modes where the edit was refused, only
                # a retry that took the newest commit (retry.refresh) can do that, since git at the
                # restored commit equals the cluster and no new automated sync starts.
                lambda s: (
                    s["revision"] == restored
                    and s["sync"] == "Synced"
                    and (mode == "server-side-diff" or s["operation_revision"] == restored)
                    and s["operation"] == "Succeeded"
                ),
                240,
                f"Synced at {restored[:8]}",
                everything,
            )
            time.sleep(15)  # at least one more full comparison (10 s) over the final state

        history = watch.latest()["history"]
        # One sync per commit that changed what the cluster should hold (the server-side diff never saw
        # the edit, so nothing had to be synced back).
        want = [first, second] if mode == "server-side-diff" else [first, second, restored]
        assert history == want, history
        drifted = watch.out_of_sync_after_synced()
        assert not drifted, drifted[:3]
        healed, early = watch.resyncs(core)
        assert not healed, f"self-heal re-applied after Synced: {healed}"
        assert not watch.errors, watch.errors[:3]
        pruned = sorted({k for k, _ in children_before})
        gitops_results.append(
            GitOpsResult(
                mode=mode,
                objects=synced_objects,
                sync_seconds=sync_seconds,
                comparisons=compared,
                observations=len(watch.seen),
                pruned=pruned,
                early_resyncs=len(early),
                edit=f"{outcome}: {re.search(r'spec[.]training is immutable[^(]*', refused)[0].strip()}",
                seconds=time.monotonic() - began,
            )
        )
    finally:
        kubectl(
            kcfg,
            "delete",
            "application",
            "-n",
            ARGOCD_NAMESPACE,
            app["metadata"]["name"],
            "--ignore-not-found",
            "--wait=true",
            check=False,
        )
        kubectl(
            kcfg,
            "delete",
            "appproject",
            "-n",
            ARGOCD_NAMESPACE,
            project["metadata"]["name"],
            "--ignore-not-found",
            check=False,
        )
        # Delete the jobs while the operator runs, so that it removes its finalizer.
        for plural in ("rljobs", "taskapps"):
            with contextlib.suppress(ApiException):
                co.delete_collection_namespaced_custom_object(GROUP, VERSION, namespace, plural)
        with contextlib.suppress(AssertionError):
            wait_for(
                lambda: (
                    not any(
                        co.list_namespaced_custom_object(GROUP, VERSION, namespace, p)["items"]
                        for p in ("rljobs", "taskapps")
                    )
                ),
                30,
                "jobs deleted",
            )
        operator.stop()


def children(api: client.ApiClient, namespace: str, job: str) -> list[tuple[str, str]]:
    """(kind, name) of every object labelled as the job's child."""
    found = []
    lists = {
        "deployments": client.AppsV1Api(api).list_namespaced_deployment,
        "jobs": client.BatchV1Api(api).list_namespaced_job,
        "services": client.CoreV1Api(api).list_namespaced_service,
        "configmaps": client.CoreV1Api(api).list_namespaced_config_map,
        "pods": client.CoreV1Api(api).list_namespaced_pod,
        "serviceaccounts": client.CoreV1Api(api).list_namespaced_service_account,
        "roles": client.RbacAuthorizationV1Api(api).list_namespaced_role,
        "rolebindings": client.RbacAuthorizationV1Api(api).list_namespaced_role_binding,
    }
    for kind, fn in lists.items():
        for item in fn(namespace, label_selector=f"posttrain.dev/job={job}").items:
            found.append((kind, item.metadata.name))
    return found
