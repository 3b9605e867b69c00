"""Pure: the locked-down shape of every pod the operator renders. Each pod runs as a non-root user with no
privilege escalation, no Linux capabilities and the runtime's default seccomp profile, i.e. what the
`restricted` Pod Security Standard demands, so a job runs in a namespace that enforces it. posttrain's
own programs (trainer, rollout/reference/judge servers, the trainer's init containers) also get a
read-only root filesystem: everything they write goes to an emptyDir at /tmp (HOME points there; the
images keep their caches under /tmp) or to the trainer's /workspace. A task app is someone else's
program, so its root filesystem stays writable."""

from __future__ import annotations

from typing import Any

SCRATCH_VOLUME = "tmp"
SCRATCH_MOUNT = "/tmp"


def pod_security_context(run_as_user: int) -> dict[str, Any]:
    """`run_as_user` 0 keeps the image's own (numeric, non-root) user; otherwise user, group and the
    emptyDirs' group are that id."""
    ctx: dict[str, Any] = {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
    if run_as_user:
        ctx.update(runAsUser=run_as_user, runAsGroup=run_as_user, fsGroup=run_as_user)
    return ctx


def container_security_context(*, read_only_root: bool) -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "privileged": False,
        "readOnlyRootFilesystem": read_only_root,
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def scratch_volume() -> dict[str, Any]:
    return {"name": SCRATCH_VOLUME, "emptyDir": {}}


def scratch_mount() -> dict[str, Any]:
    return {"name": SCRATCH_VOLUME, "mountPath": SCRATCH_MOUNT}


def scratch_env() -> list[dict[str, str]]:
    """HOME on the writable scratch volume (libraries put caches under ~/.cache, ~/.config)."""
    return [{"name": "HOME", "value": SCRATCH_MOUNT}]


def lock_down(
    pod_spec: dict[str, Any], *, run_as_user: int, read_only_root: bool, token: bool
) -> dict[str, Any]:
    """`pod_spec` with the security contexts on every container and init container, the scratch volume
    mounted where the root filesystem is read-only, and the ServiceAccount token mounted only when the pod
    calls the API server (`token`)."""
    out = dict(pod_spec)
    out["securityContext"] = pod_security_context(run_as_user)
    out["automountServiceAccountToken"] = token
    for key in ("initContainers", "containers"):
        if key not in out:
            continue
        containers = []
        for container in out[key]:
            c = dict(container)
            c["securityContext"] = container_security_context(read_only_root=read_only_root)
            if read_only_root:
                mounts = list(c.get("volumeMounts") or [])
                if not any(m.get("mountPath") == SCRATCH_MOUNT for m in mounts):
                    mounts.append(scratch_mount())
                c["volumeMounts"] = mounts
                env = [e for e in c.get("env") or [] if e.get("name") != "HOME"]
                c["env"] = [*env, *scratch_env()]
            containers.append(c)
        out[key] = containers
    if read_only_root:
        volumes = list(out.get("volumes") or [])
        if not any(v.get("name") == SCRATCH_VOLUME for v in volumes):
            volumes.append(scratch_volume())
        out["volumes"] = volumes
    return out
