"""Pure: the names of a job's children and the roles its pods play. A child is `<job>-<role>`, a valid
DNS-1035 label (long job names keep a hash of the whole name); every child carries its role in the label
posttrain.dev/role."""

from __future__ import annotations

import hashlib
import re

ROLE_TRAINER = "trainer"
ROLE_ROLLOUT = "rollout"
ROLE_REFERENCE = "reference"
ROLE_JUDGE = "judge"
ROLE_CONFIG = "config"
ROLE_TASK_APP = "task-app"
ROLE_NETWORK = "network"
ROLE_ACCESS = "operator-access"  # the operator's own read of a namespace's Secrets
SERVER_ROLES = (ROLE_ROLLOUT, ROLE_REFERENCE, ROLE_JUDGE)
NAME_MAX = 63
# Indexed Job pods are named (and hostnamed) <job>-<index>: keep room for the index.
TRAINER_NAME_MAX = 57


def child_name(job_name: str, suffix: str, max_len: int = NAME_MAX) -> str:
    """`<job>-<suffix>`, a valid DNS-1035 label of at most max_len characters (long names get a hash)."""
    base = job_name if re.match(r"^[a-z]", job_name) else f"j-{job_name}"
    name = f"{base}-{suffix}"
    if len(name) <= max_len:
        return name
    digest = hashlib.sha256(job_name.encode()).hexdigest()[:6]
    keep = max_len - len(suffix) - len(digest) - 2
    return f"{base[:keep].rstrip('-')}-{digest}-{suffix}"


def trainer_name(job_name: str) -> str:
    return child_name(job_name, ROLE_TRAINER, max_len=TRAINER_NAME_MAX)


def rollout_name(job_name: str) -> str:
    return child_name(job_name, ROLE_ROLLOUT)


def reference_name(job_name: str) -> str:
    return child_name(job_name, ROLE_REFERENCE)


def judge_name(job_name: str) -> str:
    return child_name(job_name, ROLE_JUDGE)


def config_name(job_name: str) -> str:
    """The job's Secret: its job file, its TOML and (RLJob) its rollout token (render/jobfile.py)."""
    return child_name(job_name, ROLE_CONFIG)


def task_app_name(task_app_name: str) -> str:
    """The Deployment and Service of a TaskApp deployed from an image."""
    return child_name(task_app_name, ROLE_TASK_APP)


def service_url(name: str, namespace: str, port: int) -> str:
    return f"http://{name}.{namespace}.svc:{port}"
