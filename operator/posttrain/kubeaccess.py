"""The CLI's way into a Kubernetes API server: the client from the kube context, and the user-facing
problem for every way talking to it can fail (no context, unreachable server, refused credentials), so a
command prints one line and exits 2 instead of a urllib3 traceback."""

from __future__ import annotations

from typing import Any

from posttrain.errors import Problem, UserError

# One quick retry: urllib3's default (3 retries with backoff) keeps a user waiting on a server that is down.
CLIENT_RETRIES = 1


def has_kube_context() -> bool:
    """Whether a kubeconfig (or an in-cluster service account) is there to try."""
    import os
    from pathlib import Path

    paths = [p for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    if any(Path(p).is_file() for p in paths):
        return True
    if not paths and (Path.home() / ".kube" / "config").is_file():
        return True
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST"))


def load_kube(context: str | None = None) -> tuple[Any, str]:
    """(ApiClient, namespace of the current context). A missing kubeconfig is the user's to fix."""
    import os

    from kubernetes import client, config

    configuration = client.Configuration()
    # read $KUBECONFIG now (the client's default is the value it had when kubernetes was imported)
    config_file = os.environ.get("KUBECONFIG") or None
    try:
        config.load_kube_config(config_file=config_file, context=context, client_configuration=configuration)
    except (config.ConfigException, FileNotFoundError, TypeError) as err:
        try:
            config.load_incluster_config(client_configuration=configuration)
        except config.ConfigException:
            raise UserError(
                Problem(
                    f"no usable kube context: {err}",
                    field="kubeconfig",
                    fix="set KUBECONFIG or run `make cluster-up`; or pass --local to work on this machine",
                )
            ) from None
    configuration.retries = CLIENT_RETRIES
    namespace = "default"
    try:
        contexts, active = config.list_kube_config_contexts(config_file=config_file)
        if context:
            active = next((c for c in contexts if c.get("name") == context), active)
        namespace = (active or {}).get("context", {}).get("namespace") or "default"
    except (config.ConfigException, FileNotFoundError, TypeError):
        pass
    return client.ApiClient(configuration), namespace


def server_of(api: Any) -> str:
    return str(getattr(getattr(api, "configuration", None), "host", "") or "the API server")


def problem_for(err: BaseException) -> Problem | None:
    """The one-line problem for a failure to talk to the API server; None when `err` is something else."""
    try:
        import urllib3.exceptions as u3
    except ImportError:  # pragma: no cover
        return None
    if isinstance(err, u3.MaxRetryError):
        reason = err.reason
        target = f"{err.pool.scheme}://{err.pool.host}:{err.pool.port}" if err.pool is not None else "it"
        why = type(reason).__name__ if reason is not None else "no answer"
        if isinstance(reason, u3.NewConnectionError):
            why = "connection refused or host unreachable"
        elif isinstance(reason, u3.SSLError):
            why = "TLS handshake failed"
        return Problem(
            f"cannot reach the Kubernetes API server at {target} ({why})",
            field="kubeconfig",
            fix="start the cluster (`make cluster-up`) or point KUBECONFIG at a running one; "
            "pass --local for jobs on this machine",
        )
    if isinstance(err, u3.HTTPError):
        return Problem(f"talking to the Kubernetes API server failed: {type(err).__name__}", field="kubeconfig",
                       fix="check KUBECONFIG and that the API server is up")  # fmt: skip
    try:
        from kubernetes.client.exceptions import ApiException
    except ImportError:  # pragma: no cover
        return None
    if isinstance(err, ApiException) and err.status in (401, 403):
        what = "rejected the credentials" if err.status == 401 else "forbids this request"
        return Problem(f"the Kubernetes API server {what} (HTTP {err.status} {err.reason})", field="kubeconfig",
                       fix="use a kube context whose user may read posttrain.dev jobs and pods")  # fmt: skip
    return None
