"""The judge's typed settings (posttrain.api.judge_settings) from every spelling a config uses, the warning for
a judge that does nothing, the operator deploying no judge nothing reads, and the rubric a judge scores
against when the config gives none (the task app's /task_info, posttrain_trainer.task_rubric)."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import httpx
import pytest
from fixtures.jobs import RL_SPEC, job_object
from posttrain.api.config import load_rl, normalized_config
from posttrain.api.judge_settings import JudgeSettings
from posttrain.api.settings import GSPOSettings, settings_for
from posttrain.controller import render
from posttrain.controller.objects import parse_job
from posttrain.controller.render.taskapp import TaskAppTarget
from posttrain.controller.settings import OperatorSettings
from posttrain_trainer.judging import EpisodeJudge
from posttrain_trainer.task_rubric import MAX_BODY_BYTES, MAX_TEXT, judge_rubrics, parse_rubric

ROOT = Path(__file__).resolve().parents[2]
BLEND_EXAMPLE = ROOT / "examples" / "rl_judge_blend.toml"
OPERATOR = OperatorSettings(trainer_image="reg/trainer:1", rollout_image="reg/rollout:1", s3_bucket="bkt")
TARGET = TaskAppTarget(url="http://math.tasks.svc:8000", secret_name="task-key", name=None)
OPTIONS = {"provider": "openai", "model": "gpt-4o-mini", "event": False, "outcome": True}


def example(**edit: Any) -> dict[str, Any]:
    """examples/rl_judge_blend.toml as a dict, with top-level tables replaced (None removes one)."""
    raw = tomllib.loads(BLEND_EXAMPLE.read_text())
    for key, value in edit.items():
        if value is None:
            raw.pop(key, None)
        else:
            raw[key] = value
    return raw


def resolved(raw: dict[str, Any]) -> tuple[JudgeSettings, list[str]]:
    """What the trainer receives (the settings of the loaded config) and validate's warnings."""
    config, warnings = load_rl(copy.deepcopy(raw))
    settings = settings_for("rl", normalized_config(config))
    assert isinstance(settings, GSPOSettings)
    return settings.judge, warnings


def test_judge_reward_blend_alone_blends_and_calls_the_judge():
    judge, warnings = resolved(example())
    assert judge.blend() == {"env": 0.6, "event": 0.0, "outcome": 0.4}
    assert judge.weights_from == "judge.reward_blend"
    assert (judge.enabled, judge.outcome, judge.event) == (True, True, False)
    assert judge.rubric_source == "overrides" and judge.override("outcome") is not None
    assert judge.needs_server and judge.gpus == 1 and judge.timeout_s == 30
    assert not [w for w in warnings if "judge" in w]
    openai, _ = resolved(tomllib.loads((ROOT / "examples" / "rl_judge_openai.toml").read_text()))
    assert openai.blend() == {"env": 0.5, "event": 0.0, "outcome": 0.5} and openai.enabled
    assert not openai.needs_server and openai.gpus == 0


def test_synth_rubric_enabled_with_weights_blends():
    judge_table = {"options": {**OPTIONS, "event": True}}
    rubric = {"enabled": True, "weights": {"env": 0.2, "event": 0.3, "outcome": 0.5}}
    judge, _ = resolved(example(judge=judge_table, rubric=rubric))
    assert judge.blend() == {"env": 0.2, "event": 0.3, "outcome": 0.5} and judge.weights_from == "rubric.weights"
    assert (judge.enabled, judge.outcome, judge.event) == (True, True, True)
    assert judge.rubric_source == "task_info"  # no rubric_overrides: the task app's
    # [rubric] wins over [judge] reward_blend (synth's order); a blend name left out keeps its default
    both, _ = resolved(example(judge={**judge_table, "reward_blend": {"outcome": 1.0}}, rubric=rubric))
    assert both.weights_from == "rubric.weights"
    only, _ = resolved(example(judge={**judge_table, "reward_blend": {"outcome": 1.0}}, rubric=None))
    assert only.blend() == {"env": 1.0, "event": 0.0, "outcome": 1.0}
    # synth's nested [judge.rubric] (enabled) with its weights
    nested, _ = resolved(example(judge={**judge_table, "rubric": rubric}, rubric=None))
    assert nested.blend() == {"env": 0.2, "event": 0.3, "outcome": 0.5} and nested.weights_from == "judge.rubric.weights"


@pytest.mark.parametrize(
    "judge_table, rubric",
    [
        (None, {"enabled": True, "weights": {"env": 0.5, "outcome": 0.5}}),  # [rubric] without [judge]
        ({"enabled": False, "reward_blend": {"env": 0.5, "outcome": 0.5}, "options": OPTIONS}, None),
        ({"reward_blend": {"env": 0.5, "outcome": 0.5}, "options": {"provider": "openai"}}, None),  # no model
        ({"reward_blend": {"env": 0.5, "outcome": 0.5}, "options": {"model": "m"}}, None),  # no provider
    ],
    ids=["rubric-without-judge", "judge-disabled", "options-without-model", "options-without-provider"],
)
def test_no_judge_blends_nothing(judge_table, rubric):
    judge, _ = resolved(example(judge=judge_table, rubric=rubric))
    assert judge.blend() == {"env": 1.0, "event": 0.0, "outcome": 0.0}
    assert not judge.configured and not judge.enabled and not judge.needs_server


@pytest.mark.parametrize(
    "judge_table, rubric, says",
    [
        ({"options": OPTIONS}, None, "set [judge] reward_blend"),
        ({"options": OPTIONS}, {"weights": {"env": 0.5, "outcome": 0.5}}, "enabled is not true"),
        ({"options": OPTIONS, "reward_blend": {"env": 1.0}}, None, "judge.reward_blend gives outcome and event weight 0"),
        ({"options": {**OPTIONS, "outcome": False, "event": True}, "reward_blend": {"env": 0.5, "outcome": 0.5}},
         None, "judge.options.outcome = false where judge.reward_blend gives weight"),
    ],
    ids=["no-blend", "rubric-not-enabled", "zero-weights", "switch-off"],
)  # fmt: skip
def test_a_judge_that_does_nothing_is_a_warning_naming_the_keys(judge_table, rubric, says):
    judge, warnings = resolved(example(judge=judge_table, rubric=rubric))
    assert judge.configured and judge.idle and not judge.enabled and not judge.needs_server
    [warning] = [w for w in warnings if "does nothing" in w]
    assert says in warning and "no judge is called and none is deployed" in warning, warning


def test_validate_and_convert_print_the_idle_judge_warning(tmp_path):
    raw = BLEND_EXAMPLE.read_text().replace("reward_blend = { env = 0.6, outcome = 0.4 }", "reward_blend = { env = 1 }")
    path = tmp_path / "idle.toml"
    path.write_text(raw)
    for args in (["validate", "--config", str(path)],
                 ["convert", "--config", str(path), "--task-app", "math", "--api-key-secret", "k", "-o", str(tmp_path / "o.yaml")]):  # fmt: skip
        out = subprocess.run([sys.executable, "-m", "posttrain.cli", *args], capture_output=True, text=True, cwd=ROOT)
        text = out.stdout + out.stderr
        assert "does nothing: judge.reward_blend gives outcome and event weight 0" in text, (args, text)


def rljob(**judge: Any):
    spec = {**RL_SPEC, "judge": judge}
    return parse_job(job_object("RLJob", spec, name="jr", namespace="team-a"))


def gpus(children: list[dict]) -> int:
    return sum(
        int(c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu", 0))
        for child in children
        if child["kind"] in ("Deployment", "Job")
        for c in child["spec"]["template"]["spec"]["containers"]
    )


def test_the_operator_deploys_no_judge_that_nothing_reads():
    options = {"provider": "vllm", "model": "Qwen/Qwen3-0.6B", "gpus": 2}
    read = render.render_rljob(rljob(options=options, rewardBlend={"env": 0.5, "outcome": 0.5}), OPERATOR, TARGET)
    roles = [c["metadata"]["labels"]["posttrain.dev/role"] for c in read.children if c["kind"] == "Deployment"]
    assert "judge" in roles and read.jobfile.endpoints.judges
    for idle in (rljob(options=options),  # no blend
                 rljob(options=options, rewardBlend={"env": 1.0}),  # weight 0
                 rljob(options={**options, "outcome": False, "event": True}, rewardBlend={"outcome": 1.0}),
                 rljob(options={**options, "extras": {"base_url": "http://judge.example/v1"}},  # its own URL
                       rewardBlend={"outcome": 1.0}, apiKeySecretRef={"name": "k"})):  # fmt: skip
        out = render.render_rljob(idle, OPERATOR, TARGET)
        assert not [c for c in out.children if c["metadata"]["labels"]["posttrain.dev/role"] == "judge"]
        assert out.jobfile.endpoints.judges == {}
        assert gpus(out.children) == gpus(read.children) - 2  # the judge's GPUs are not asked for
    # ReST-EM never calls a judge
    restem = {**RL_SPEC, "algorithm": {"type": "online", "method": "restem", "variety": "restem"},
              "judge": {"options": options, "rewardBlend": {"outcome": 1.0}}}  # fmt: skip
    out = render.render_rljob(parse_job(job_object("RLJob", restem, name="rs", namespace="team-a")), OPERATOR, TARGET)
    assert not [c for c in out.children if c["metadata"]["labels"]["posttrain.dev/role"] == "judge"]


# -- the task app's rubric ----------------------------------------------------------------------------

MATH_RUBRIC = {  # the shape of examples/taskapps/math/app.py's RUBRIC (synth's TaskInfo.rubric)
    "outcome": {"name": "correct_answer", "criteria": [
        {"id": "last_number_correct", "description": "The last number equals the result.", "weight": 1.0}]},
    "events": None,
}  # fmt: skip


def task_app(reply: Any, *, status: int = 200, seed_reply: Any = None, raw: bytes | None = None):
    calls: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(str(request.url))
        assert request.headers.get("X-API-Key") == "key"
        if raw is not None:
            return httpx.Response(status, content=raw)
        body = seed_reply if "seed=" in str(request.url) else reply
        return httpx.Response(status, json=body)

    return httpx.MockTransport(handler), calls


def judged(options: dict[str, Any], blend: dict[str, float]) -> JudgeSettings:
    judge, _ = resolved(example(judge={"options": options, "reward_blend": blend}))
    assert judge.enabled
    return judge


def test_without_overrides_the_judge_scores_against_the_task_apps_rubric():
    settings = judged(OPTIONS, {"env": 0.0, "outcome": 1.0})
    transport, calls = task_app({"taskset": {"id": "math", "rubric": MATH_RUBRIC}})
    rubrics = judge_rubrics(settings, task_url="http://task:8000", headers={"X-API-Key": "key"}, seed=3,
                            transport=transport)  # fmt: skip
    assert calls == ["http://task:8000/task_info"]
    assert rubrics.sources == {"outcome": "task_info"} and rubrics.note is None
    outcome = rubrics.for_client()["outcome"]
    assert outcome["goal_text"] == "correct_answer" and outcome["criteria"][0]["id"] == "last_number_correct"
    record = rubrics.record()
    assert record["source"] == "task_info" and record["outcome"]["rubric"]["criteria"][0]["weight"] == 1.0
    judge = EpisodeJudge.from_settings(settings, rubrics=rubrics)
    assert judge is not None and judge.rubrics.rubrics["outcome"] is not None
    # no taskset-wide rubric: the first training seed's TaskInfo
    transport, calls = task_app({"taskset": {"id": "math"}}, seed_reply={"rubric": MATH_RUBRIC})
    rubrics = judge_rubrics(settings, task_url="http://task:8000", headers={"X-API-Key": "key"}, seed=3,
                            transport=transport)  # fmt: skip
    assert calls[-1] == "http://task:8000/task_info?seed=3" and rubrics.sources == {"outcome": "task_info"}


def test_overrides_win_and_the_task_app_is_not_asked():
    overrides = {"outcome": {"goal_text": "mine", "criteria": [{"id": "c", "weight": 1.0}]}}
    settings = judged({**OPTIONS, "rubric_overrides": overrides}, {"outcome": 1.0})
    transport, calls = task_app({"taskset": {"rubric": MATH_RUBRIC}})
    rubrics = judge_rubrics(settings, task_url="http://task:8000", headers={}, seed=0, transport=transport)
    assert calls == [] and rubrics.sources == {"outcome": "overrides"}
    assert rubrics.for_client()["outcome"]["goal_text"] == "mine" and rubrics.record()["source"] == "overrides"


@pytest.mark.parametrize(
    "reply, status, raw, says",
    [
        ({"taskset": {"rubric": {"outcome": {"criteria": [{"id": "x", "weight": -1}]}}}}, 200, None,
         "does not fit the rubric shape at outcome.criteria.0.weight"),
        ({"taskset": {}}, 500, None, "HTTP 500"),
        (None, 200, b"<html>secret-token-abc</html>", "did not reply with JSON"),
        (None, 200, b"[" + b"1," * MAX_BODY_BYTES + b"1]", f"more than {MAX_BODY_BYTES} bytes"),
        ({"taskset": {}}, 200, None, None),  # no rubric anywhere: the generic prompt, nothing wrong
    ],
    ids=["bad-shape", "http-error", "not-json", "too-big", "none"],
)  # fmt: skip
def test_an_untrusted_task_app_reply_gives_no_rubric_and_is_never_echoed(reply, status, raw, says):
    settings = judged(OPTIONS, {"outcome": 1.0})
    transport, _ = task_app(reply, status=status, raw=raw, seed_reply=reply)
    rubrics = judge_rubrics(settings, task_url="http://task:8000", headers={"X-API-Key": "key"}, seed=0,
                            transport=transport)  # fmt: skip
    assert rubrics.sources == {"outcome": "none"} and rubrics.rubrics == {"outcome": None}
    assert rubrics.note == says or (says and says in (rubrics.note or "")), rubrics.note
    assert "secret-token" not in json.dumps(rubrics.record())


def test_task_app_rubric_text_is_capped():
    long = {"outcome": {"name": "n" * 10_000, "criteria": [{"id": f"c{i}", "description": "d" * 10_000}
                                                             for i in range(500)]}}  # fmt: skip
    parsed = parse_rubric({"taskset": {"rubric": long}})
    assert parsed is not None and parsed.outcome is not None
    assert len(parsed.outcome.criteria) == 64 and len(parsed.outcome.criteria[0].description) == MAX_TEXT
    assert len(parsed.outcome.override().goal_text or "") <= MAX_TEXT
