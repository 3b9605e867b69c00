"""model.source across namespaces on the real control plane: a job naming another namespace's model fails
(InvalidSpec, before anything is made) unless that namespace shares its models with the job's namespace
(POSTTRAIN_SHARED_MODELS; docs/storage.md)."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from fixtures.operator_env import operator_env
from fixtures.operator_process import rljob_manifest

pytestmark = [pytest.mark.cluster]

BASE = "posttrain/tiny-random-qwen2"


def _from(name: str, url: str, source: str) -> dict[str, Any]:
    body = rljob_manifest(name, url)
    body["spec"]["model"] = {"source": source, "trainerMode": "full"}
    return body


def test_another_namespaces_model_is_refused_unless_shared(cluster: Any, namespace: str, tmp_path: Path,
                                                           math_taskapp: Any) -> None:  # fmt: skip
    shared = json.dumps({"sharer": [namespace], "public": ["*"], "other": ["someone-else"]})
    with operator_env(cluster, namespace, tmp_path / "operator.log",
                      settings={"POSTTRAIN_SHARED_MODELS": shared}) as env:  # fmt: skip
        env.secret("task-key", math_taskapp.api_key)
        refused = {
            "by-id": f"rl:{BASE}:other.math.ab12cd34",
            "by-uri": "s3://posttrain/jobs/other/math-ab12cd34/final/",
            "by-dotdot": f"s3://posttrain/jobs/{namespace}/../other/math-ab12cd34/final/",
        }
        for name, source in refused.items():
            env.create("rljobs", _from(name, math_taskapp.url, source))
        allowed = {
            "own": f"rl:{BASE}:{namespace}.math.ab12cd34",
            "shared": f"rl:{BASE}:sharer.math.ab12cd34",
            "public": "s3://posttrain/jobs/public/math-ab12cd34/final/",
        }
        for name, source in allowed.items():
            env.create("rljobs", _from(name, math_taskapp.url, source))

        for name in refused:
            status = env.wait_phase("rljobs", name, "Failed", timeout=30)
            assert status["reason"] == "InvalidSpec", status
            assert status["message"].startswith("spec.model.source:"), status["message"]
            assert "other" in status["message"], status["message"]
            assert not any(env.children(name).values()), name  # nothing was made for it
        assert "does not share its models with namespace" in env.status("rljobs", "by-id")["message"]

        for name in allowed:
            env.wait_phase("rljobs", name, "Running", timeout=60)
            (secret,) = env.children(name)["Secret"]
            jobfile = json.loads(base64.b64decode(secret.data["job.json"]))
            owner = "public" if name == "public" else ("sharer" if name == "shared" else namespace)
            assert jobfile["model_path"].startswith(f"s3://posttrain/jobs/{owner}/math-"), jobfile["model_path"]
