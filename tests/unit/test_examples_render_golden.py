"""Every example job renders to the same children, byte for byte, as it did before the trainer settings moved
into posttrain.api.settings: the golden file tests/golden/examples_render.json was captured from
main before that change. The job file (job.json in the job's Secret) gained one key, `settings` (the typed
trainer settings); everything else in it is compared as it was. The local runner's job config is compared too.

Regenerate (only for a deliberate change of the rendered output): python tests/unit/test_examples_render_golden.py"""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden" / "examples_render.json"
NEW_JOBFILE_KEYS = ("settings",)  # the typed settings, newer than the golden file


def _examples() -> list[Path]:
    return sorted([*ROOT.glob("examples/*.toml"), *ROOT.glob("examples/demo/*.toml")])


def _render(resource: dict[str, Any]) -> dict[str, Any]:
    from fixtures.jobs import UID, job_object
    from posttrain.controller import render
    from posttrain.controller.objects import parse_job
    from posttrain.controller.render.taskapp import TaskAppTarget
    from posttrain.controller.settings import OperatorSettings

    settings = OperatorSettings(trainer_image="reg/trainer:1", rollout_image="reg/rollout:1", s3_bucket="bkt")
    target = TaskAppTarget(url="http://math.tasks.svc:8000", secret_name="task-key", name=None)
    job = parse_job(job_object(resource["kind"], resource["spec"], name="ex", namespace="default", uid=UID))
    out = render.render_job(job, settings, target if job.is_rl else None)
    secret = dict(out.secret)
    secret["data"] = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    return {"children": out.children, "secret": secret}


def render_all() -> dict[str, Any]:
    from posttrain.api.config import normalized_config
    from posttrain.api.convert import load, toml_to_cr

    out: dict[str, Any] = {}
    for path in _examples():
        text = path.read_text()
        name = str(path.relative_to(ROOT))
        resource, _ = toml_to_cr(text, file=name, task_url="http://math.tasks.svc:8000",
                                 dataset="s3://bkt/data/train.jsonl", env={})  # fmt: skip
        _, config, _ = load(text, file=name)
        out[name] = {"render": _render(resource), "local_config": normalized_config(config)}
    for path in sorted(ROOT.glob("examples/crs/*.yaml")):
        resource = yaml.safe_load(path.read_text())
        if resource.get("kind") in ("RLJob", "SFTJob"):
            out[str(path.relative_to(ROOT))] = {"render": _render(resource)}
    return json.loads(json.dumps(out, sort_keys=True, default=str))


def _without_new_keys(case: dict[str, Any]) -> dict[str, Any]:
    secret = case["render"]["secret"]
    jobfile = json.loads(secret["data"]["job.json"])
    for key in NEW_JOBFILE_KEYS:
        jobfile.pop(key, None)
    secret["data"]["job.json"] = json.dumps(jobfile, indent=2, sort_keys=True)
    return case


def test_every_example_renders_as_before() -> None:
    golden = json.loads(GOLDEN.read_text())
    now = render_all()
    assert sorted(now) == sorted(golden)
    for name in golden:
        assert _without_new_keys(now[name]) == golden[name], name
        # byte-identical: the job file text, less the new keys, is the text main wrote
        assert now[name]["render"]["secret"]["data"]["job.json"] == golden[name]["render"]["secret"]["data"]["job.json"]


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "tests"))
    cases = {name: _without_new_keys(case) for name, case in render_all().items()}
    GOLDEN.write_text(json.dumps(cases, indent=1, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN}")
