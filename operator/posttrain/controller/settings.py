"""Operator settings: environment variables with the prefix POSTTRAIN_ (e.g. POSTTRAIN_TRAINER_IMAGE), or
keyword arguments in tests. Nothing secret lives here: S3 and judge keys are only ever *names* of Secrets."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from posttrain.controller.gpu_types import DEFAULT_GPU_PRODUCTS, GFD_PRODUCT_LABEL

LABEL_JOB = "posttrain.dev/job"
LABEL_ROLE = "posttrain.dev/role"
LABEL_KIND = "posttrain.dev/kind"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "posttrain-operator"
COMPLETION_INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
FINALIZER = "posttrain.dev/finalizer"
ANNOTATION_PREFIX = "posttrain.dev"


class OperatorSettings(BaseSettings):
    """Everything the operator needs that is not in a job's spec. A job's `spec.images` overrides the images."""

    model_config = SettingsConfigDict(env_prefix="POSTTRAIN_", extra="ignore")

    # Images (a job may override each in spec.images).
    trainer_image: str = "posttrain/trainer:dev"
    rollout_image: str = "posttrain/rollout:dev"
    reference_image: str = ""  # empty: the rollout image (same server, --role reference)
    judge_image: str = ""  # empty: the rollout image (same server, --role judge)
    image_pull_policy: str = "IfNotPresent"

    # Where to watch: empty = every namespace; several namespaces separated by commas.
    namespace: str = ""

    # Task-app verification (a TaskApp's spec.verification overrides these per task app).
    verify_timeout_seconds: float = 300.0  # give up (Failed) after this long
    verify_backoff_initial: float = 1.0
    verify_backoff_max: float = 30.0
    verify_request_timeout: float = 10.0
    reverify_period_seconds: float = 60.0  # TaskApp periodic re-verification
    # One check per (URL, Secret resourceVersion) is shared for this long by every job and TaskApp asking
    # (never longer than a TaskApp's period, never longer than the first retry's backoff for a failure).
    verify_cache_seconds: float = 10.0
    # Fair shares of the task-app checks (controller/fairness.py): at most this many at once per namespace,
    # and per (namespace, task-app host).
    check_slots_per_namespace: int = 8
    check_slots_per_host: int = 4
    # Where a task app may be (posttrain.api.urls; docs/secrets-and-urls.md). Every address a task app's
    # host resolves to is checked, by the operator and by the trainer's init container: loopback,
    # link-local, cloud metadata addresses and the API server's are refused unless a network listed here
    # holds them (comma-separated CIDRs, e.g. 127.0.0.0/8 where task apps run on the operator's own host,
    # as in the tests); the API server's own port is refused always. Denied networks are refused even when
    # allowed.
    task_app_allowed_networks: str = ""
    task_app_denied_networks: str = ""
    # The API server's addresses (ip:port, comma-separated). Empty: found at startup from the operator's
    # own connection, KUBERNETES_SERVICE_HOST and the `kubernetes` Service's EndpointSlice (the address
    # behind the ClusterIP); either way the fences deny them and the trainer's init container is told them.
    api_server_addresses: str = ""

    # Object storage: the endpoint and bucket for artifacts; credentials only as a Secret name.
    s3_endpoint: str = "http://minio.posttrain-system.svc:9000"
    s3_bucket: str = "posttrain"
    s3_region: str | None = None
    s3_secret_name: str = "posttrain-s3"  # keys S3_ACCESS_KEY_ID / S3_SECRET_ACCESS_KEY
    base_model_uri: str = "{base}"  # how a base model id becomes the trainer/vLLM model path
    # Namespaces whose models other namespaces may train from (model.source, an s3:// model.base):
    # {"team-a": ["team-b"]} lets team-b use team-a's models, ["*"] every namespace. Without an entry a job
    # naming another namespace's model fails (InvalidSpec). The storage keys must allow the read too
    # (storage_policy.py read_from; docs/storage.md). JSON in POSTTRAIN_SHARED_MODELS.
    shared_models: dict[str, list[str]] = Field(default_factory=dict)

    # Trainer pods patch their job's status.progress/result, and only their own job's (manifests/README.md,
    # "Trainer identity"):
    #  namespace  the ServiceAccount below, with a Role (PATCH on rljobs/status, sftjobs/status) and its
    #             RoleBinding, made by the operator once per namespace; the ValidatingAdmissionPolicy of
    #             manifests/base/trainer-policy.yaml narrows it to the pod's own job. Where the operator
    #             cannot see that policy it uses `job` instead (controller/trainer_identity.py).
    #  job        a ServiceAccount + Role (PATCH on exactly this job's status) + RoleBinding per job, owned
    #             by the job (three more writes per job).
    #  static     the ServiceAccount below, bound by whoever installs posttrain (base/trainer-rbac.yaml).
    trainer_identity: Literal["namespace", "job", "static"] = "namespace"
    trainer_service_account: str = "posttrain-trainer"
    # A trainer pod that fails (not disrupted, not a configuration error) is replaced this many times per
    # node before the job fails (controller/render/trainer_policy.py).
    trainer_retries: int = 3
    # Pods run as this uid/gid (0: the image's own numeric non-root user).
    run_as_user: int = 65532
    master_port: int = 29500
    # Rank 0 of every trainer serves Prometheus metrics on this port (posttrain_trainer/telemetry.py); 0: none.
    trainer_metrics_port: int = 9090
    gpu_resource: str = "nvidia.com/gpu"
    # compute.gpuType chooses nodes: a pod asking for GPUs needs this node label to hold one of the values
    # gpu_products maps the job's gpu_type to (controller/render/gpu.py; docs/how-to/gpu-scheduling.md).
    # POSTTRAIN_GPU_PRODUCTS is JSON, e.g. '{"H100": ["NVIDIA-H100-80GB-HBM3"]}'; it replaces the defaults.
    # An empty label switches the selection off.
    gpu_node_label: str = GFD_PRODUCT_LABEL
    gpu_products: dict[str, list[str]] = Field(default_factory=lambda: dict(DEFAULT_GPU_PRODUCTS))

    # What a tenant's spec.scheduling may ask for (controller/scheduling_policy.py; docs/security.md):
    # comma-separated lists, "*" allows anything. Empty (the defaults): nothing beyond what the operator sets
    # itself (the GPU type's node affinity); a spec asking for more fails with reason InvalidSpec naming the
    # setting to change.
    # PriorityClass names a job or TaskApp may set as priorityClassName (comma-separated; "*": any).
    allowed_priority_classes: str = ""
    # Kueue WorkloadPriorityClass names a job may set as workloadPriorityClassName (comma-separated; "*": any).
    allowed_workload_priority_classes: str = ""
    # Taint keys a toleration may name ("key": any value and effect; "key=value": that value only). A keyless
    # toleration ({operator: Exists}) tolerates every taint: only "*" allows it.
    allowed_tolerations: str = ""
    # Node label keys a nodeSelector may use ("key": any value; "key=value": that value only; "*": any).
    allowed_node_selectors: str = ""
    # Every RLJob/SFTJob must name a Kueue queue (spec.scheduling.queueName): Kueue's quota is not opt-in.
    require_queue: bool = False

    # Requests every container of a job's pods gets for each resource its spec leaves out (JSON, e.g.
    # '{"cpu": "500m", "memory": "1Gi"}'; render/pods.py default_resources): not where the spec sets that
    # resource's limit (Kubernetes then requests the limit). A namespace's ResourceQuota on requests.cpu or
    # requests.memory needs requests on every pod.
    default_requests: dict[str, str] = Field(default_factory=lambda: {"cpu": "100m", "memory": "256Mi"})
    # Limits every container of a job's pods gets for each resource its spec sets neither a request nor a
    # limit of (JSON; empty by default: trainers' and vLLM's memory depends on the model).
    default_limits: dict[str, str] = Field(default_factory=dict)
    # The same two for a TaskApp's pods (its spec.scheduling.resources.requests/limits win).
    task_app_default_requests: dict[str, str] = Field(default_factory=lambda: {"cpu": "100m", "memory": "256Mi"})
    task_app_default_limits: dict[str, str] = Field(default_factory=lambda: {"cpu": "2", "memory": "2Gi"})
    # A TaskApp's spec.replicas above this fails it (InvalidSpec); the CRD's own maximum is 64.
    task_app_max_replicas: int = Field(8, ge=1, le=64)
    # PodDisruptionBudgets (render/disruption.py) keep a voluntary eviction (a node drain) from taking a
    # running job's trainer or rollout pods; Kueue's preemption deletes pods and is not held by them.
    disruption_budgets: bool = True

    # Network fences (render/network.py; docs/security.md "Network"), per namespace, where the cluster's
    # network plugin enforces NetworkPolicies: egress of job and TaskApp pods is limited to DNS, the pods
    # of their own namespace, the pods of egress_namespaces, and egress_allowed_networks minus
    # egress_denied_networks and the API server's addresses; TaskApp pods take traffic only from their
    # namespace's job pods and the operator. Off: no egress policy (ingress fences stay).
    egress_policy: bool = True
    # Networks job and TaskApp pods may reach outside the cluster (S3, a task app or judge elsewhere);
    # comma-separated CIDRs.
    egress_allowed_networks: str = "0.0.0.0/0,::/0"
    # Never reachable, even inside an allowed network: link-local (the cloud metadata address
    # 169.254.169.254), AWS's IPv6 metadata address; add the cluster's pod and Service CIDRs so that only
    # the namespaces below are reachable inside the cluster. The API server's addresses are added always.
    egress_denied_networks: str = "169.254.0.0/16,fe80::/10,fd00:ec2::254/128"
    # Namespaces whose pods job and TaskApp pods may reach (comma-separated), e.g. where MinIO runs.
    egress_namespaces: str = "posttrain-system"
    # The operator's own namespace and pod label (app.kubernetes.io/name): TaskApp pods admit its checks.
    operator_namespace: str = "posttrain-system"
    # The operator's own ServiceAccount (in operator_namespace): the subject of the RoleBinding
    # posttrain-operator-secrets it makes in each opted-in namespace (render/secret_access.py) to read the
    # Secrets jobs name there; it holds no cluster-wide Secret read. Never in its own namespace.
    operator_service_account: str = "posttrain-operator"
    # Whether the operator makes that RoleBinding. Off where the install grants the Secret read itself
    # (overlays/namespaced: a Role per served namespace).
    secrets_binding: bool = True

    # Rollout / reference / judge servers.
    server_port: int = 8000
    # The Secret holding the key every job's rollout token is derived from (controller/token_key.py); its
    # namespace defaults to the operator pod's own.
    token_key_secret: str = "posttrain-token-key"
    token_key_namespace: str = ""
    # [training] report_to = "mlflow" / "wandb": the trainer reads their settings (api/trackers.py ENV_KEYS,
    # each optional) from this Secret of the job's namespace; only for the trackers a job names.
    tracker_secret_name: str = "posttrain-trackers"
    readiness_timeout_seconds: int = 1800  # the trainer initContainer waits this long for the servers
    # /dev/shm of vLLM server and trainer pods (a memory emptyDir; counts against the pod's memory). "" =
    # no size limit.
    shm_size_limit: str = "2Gi"

    # Controller behaviour.
    # A running (or provisioning) job looks for its Secret <job>-config by name this often and makes it
    # again when someone deleted it (the operator may not list or watch Secrets): one GET per active job.
    secret_check_seconds: float = Field(20.0, gt=0)
    resync_seconds: float = 60.0  # re-reconcile every job at least this often even without events
    # A job waiting in a Kueue queue reads its Workload this often (Kueue's admission is not watched).
    queue_poll_seconds: float = 2.0
    # An admitted job in a Kueue queue reads its Workload this often: Kueue's preemption of it is acted on
    # within that (its pods stop; the preempting job waits for the quota until then).
    admitted_poll_seconds: float = 10.0
    # A status change that only rewords messages (pods ready so far) is written at most this often; the
    # phase, reasons and conditions' states are written at once. 30 s: a job that provisions within half a
    # minute (nearly all, on a cluster with room) is written twice, Provisioning and Running.
    status_message_seconds: float = 30.0
    debounce_seconds: float = 0.05  # coalesce bursts of child events into one reconcile
    # Liveness of the API connections (a connection dropped silently, e.g. by a NAT or a proxy, must not
    # freeze the operator's view): a watch silent this long (no event, no bookmark: the API server sends one
    # about every minute) is dropped and resumed; a request waits this long for the API server's answer.
    watch_idle_seconds: float = 90.0
    api_timeout_seconds: float = 30.0
    # Only one operator process acts (controller/leader.py): it holds the Lease <lease_name> in
    # lease_namespace (default: the operator pod's own namespace); others stand by. On in the Deployment.
    leader_election: bool = False
    lease_name: str = "posttrain-operator"
    lease_namespace: str = ""
    lease_seconds: float = 15.0
    # Periodic checkpoints unless a job sets training.checkpoint_every: RL iterations / SFT optimizer steps.
    # A replacement trainer pod resumes from the latest one.
    checkpoint_every_rl: int = 10
    checkpoint_every_sft: int = 200
    # A trainer pod that is deleted (Kueue preempts its job, a node drains) gets SIGTERM and this long to
    # finish its step and save a checkpoint before SIGKILL (posttrain_trainer/preemption.py): its
    # terminationGracePeriodSeconds. Set it above a step plus a checkpoint save of your largest model.
    trainer_termination_grace_seconds: int = Field(300, ge=10)
    # Status messages say why pods are not running (unschedulable, image pull, crash, OOMKilled): the pods of
    # a job still Provisioning after stuck_seconds are listed on each of its passes. watch_pods keeps an
    # index of every job's pods instead (a watch event per pod change, for every job, stuck or not).
    stuck_seconds: float = 15.0
    watch_pods: bool = False
    # Prometheus metrics (controller/metrics.py, docs/monitoring.md) on this port; 0: not served (the
    # Deployment sets 9090, its `metrics` port; off by default so that several operators can run on one host).
    metrics_port: int = 0
    metrics_host: str = "0.0.0.0"  # the Deployment's pod IP; tests bind 127.0.0.1
    count_kopf_requests: bool = False  # benchmark: count kopf's own API requests too (liveness probe)
    extra_env: dict[str, str] = Field(default_factory=dict)  # plain env for every container (no secrets)


    @field_validator("task_app_allowed_networks", "task_app_denied_networks", "egress_allowed_networks",
                     "egress_denied_networks")
    @classmethod
    def _networks(cls, value: str) -> str:
        from posttrain.api.urls import networks

        networks(value)  # a ValueError names the entry that is not a CIDR
        return value

    @field_validator("api_server_addresses")
    @classmethod
    def _endpoints(cls, value: str) -> str:
        from posttrain.api.urls import endpoints

        try:
            endpoints(value)
        except ValueError:
            raise ValueError("api_server_addresses: write ip:port pairs separated by commas") from None
        return value


def load_settings(**overrides: object) -> OperatorSettings:
    return OperatorSettings(**overrides)  # type: ignore[arg-type]
