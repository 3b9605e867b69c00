"""The RL trainer's trace store in real S3 (SeaweedFS, per-namespace keys as the install gives them): the
trainer's JobTraces writes each iteration's rollouts and uploads traces.sqlite into the job's folder
jobs/<ns>/<name>-<uid8>/; a restarted trainer continues it; `posttrain filter` reads it from the s3:// job
folder with the namespace's keys, and another namespace's keys cannot."""

from __future__ import annotations

import json
import sqlite3

from posttrain.api import traces
from posttrain.api.jobfile import JobFile
from posttrain.cli import main
from posttrain_trainer.rollouts import EpisodeSequence, RolloutResult, RolloutSpec

PREFIX = "jobs/team/crafter-1a2b3c4d/"


def _results(iteration: int) -> list[RolloutResult]:
    out = []
    for index in range(4):
        spec = RolloutSpec(seed=iteration, group=0, index=index, cid=f"crafter-it{iteration}-s{iteration}-r{index}",
                           endpoint="http://policy")  # fmt: skip
        result = RolloutResult(spec=spec, ok=True, reward=float(index % 2), env_return=float(index % 2), turns=2,
                               decision_rewards=[0.0, float(index % 2)])  # fmt: skip
        result.sequences = [EpisodeSequence(prompt_ids=[1, 2], completion_ids=[3, 4], completion_mask=[1, 1])]
        captures = [
            {"messages": [{"role": "system", "content": "play"}, {"role": "user", "content": f"obs {index}"}],
             "reply": {"role": "assistant", "content": "chop"}, "weight_version": iteration},
            {"messages": [{"role": "system", "content": "play"}, {"role": "user", "content": f"obs {index}"},
                          {"role": "assistant", "content": "chop"}, {"role": "user", "content": "wood"}],
             "reply": {"role": "assistant", "content": "place table"}, "weight_version": iteration},
        ]  # fmt: skip
        result.trace = {"messages": traces.conversation(captures), "weight_versions": [iteration, iteration],
                        "steps": [], "episode_tokens": 40}  # fmt: skip
        out.append(result)
    return out


def _job(tenant_s3_server, workdir, prefix: str = PREFIX) -> JobFile:
    return JobFile(
        kind="rl",
        job={"name": "crafter", "namespace": "team", "uid": "1a2b3c4d-0000-0000-0000-000000000000"},
        base_model="tiny",
        model_path="/nonexistent",
        storage={
            **tenant_s3_server.storage(prefix),
            "region": tenant_s3_server.namespace_env("team")["S3_REGION"],
        },
        workdir=str(workdir),
    )


def _use_keys(monkeypatch, env):
    for key, value in env.items():
        monkeypatch.setenv(key, value)


def test_trainer_uploads_the_store_and_filter_reads_it_from_s3(
    tenant_s3_server, monkeypatch, tmp_path, capsys
):
    server = tenant_s3_server
    _use_keys(monkeypatch, server.namespace_env("team"))
    writer = traces.JobTraces(_job(server, tmp_path / "pod1"))
    for iteration in range(2):
        assert writer.add(_results(iteration), kind="train", iteration=iteration) == 4
        uri = writer.upload()
    assert uri == f"s3://{server.bucket}/{PREFIX}traces.sqlite"
    writer.store.close()
    # a restarted trainer (fresh pod, empty workdir) continues the uploaded store instead of replacing it
    again = traces.JobTraces(_job(server, tmp_path / "pod2"))
    again.add(_results(2), kind="eval", iteration=2)
    again.upload()
    again.store.close()
    admin = server.client()
    local = tmp_path / "check.sqlite"
    admin.fget_object(server.bucket, PREFIX + "traces.sqlite", str(local))
    with sqlite3.connect(local) as db:
        assert db.execute("SELECT kind, count(*) FROM session_traces GROUP BY kind ORDER BY kind").fetchall() == [
            ("eval", 4), ("train", 8)]  # fmt: skip
        assert db.execute("SELECT DISTINCT policy_version FROM session_traces ORDER BY 1").fetchall() == [
            ("0",), ("1",), ("2",)]  # fmt: skip

    out = tmp_path / "sft.jsonl"
    job_folder = f"s3://{server.bucket}/{PREFIX}"
    assert (
        main(["filter", "--input", job_folder, "--min-reward", "1", "--limit", "5", "--output", str(out)])
        == 0
    )
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 5 and all(r["metadata"]["total_reward"] == 1.0 for r in records)
    assert records[1]["messages"][-1] == {"role": "assistant", "content": "place table"}
    # rows read until the limit: 3 episodes of reward 1 x 2 user turns, cut at 5
    assert "kept 3 of 6 rollouts -> 5 SFT examples" in capsys.readouterr().err

    # another namespace's keys reach nothing in team's folder
    _use_keys(monkeypatch, server.namespace_env("teamb"))
    assert main(["filter", "--input", job_folder, "--output", str(tmp_path / "b.jsonl")]) == 2
    assert "cannot read" in capsys.readouterr().err and not (tmp_path / "b.jsonl").exists()
    monkeypatch.delenv("S3_ENDPOINT")
    assert main(["filter", "--input", job_folder, "--output", str(tmp_path / "b.jsonl")]) == 2
    assert "S3_ENDPOINT" in capsys.readouterr().err


def test_uploads_between_checkpoints_are_spaced_and_a_forced_one_carries_everything(
    tenant_s3_server, monkeypatch, tmp_path
):
    """The store goes up whole, so between checkpoints a trainer uploads it at most every min_interval_s; a
    forced upload (a checkpoint, the end, a failure) always sends what was added, and nothing new sends
    nothing."""
    server = tenant_s3_server
    _use_keys(monkeypatch, server.namespace_env("team"))
    now = [1000.0]
    prefix = "jobs/team/spaced-1a2b3c4d/"  # a job of its own: the store above would be continued
    writer = traces.JobTraces(_job(server, tmp_path / "pod", prefix), min_interval_s=60.0, clock=lambda: now[0])
    admin = server.client()

    def stored_episodes() -> int:
        local = tmp_path / "check.sqlite"
        admin.fget_object(server.bucket, prefix + "traces.sqlite", str(local))
        with sqlite3.connect(local) as db:
            return db.execute("SELECT count(*) FROM session_traces").fetchone()[0]

    assert writer.upload(force=False) is None  # nothing added yet
    writer.add(_results(0), kind="train", iteration=0)
    assert writer.upload(force=False) is not None  # the first upload is not held back
    assert stored_episodes() == 4
    assert writer.upload(force=True) is None  # nothing new since
    now[0] += 30
    writer.add(_results(1), kind="train", iteration=1)
    assert writer.upload(force=False) is None and stored_episodes() == 4  # 30 s after the last: deferred
    now[0] += 31
    assert writer.upload(force=False) is not None and stored_episodes() == 8  # 61 s after it
    writer.add(_results(2), kind="train", iteration=2)
    assert writer.upload(force=True) is not None and stored_episodes() == 12  # at once when forced
    writer.store.close()
