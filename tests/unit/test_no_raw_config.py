"""The trainer and the rollout server read typed settings only (job.settings, resolved once by
posttrain.api.jobfile.build_jobfile), never the TOML-shaped config: no `job.config`, no `job.record` read, no
`section(config, ...)`, `config.get(...)`, `config[...]` or `isinstance(..., dict)` walk over it. The job file's
`record` (the normalised config) travels for the record only: artifacts.py writes it to config.json and
manifest.json, and that is the one use allowed."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
IMAGES = [*(REPO / "trainer_image").rglob("*.py"), *(REPO / "rollout_image").rglob("*.py")]
# the TOML's top-level tables
TABLES = ("(training|rollout|policy|judge|rubric|model|hyperparameters|evaluation|algorithm|data|vllm|reference"
          "|compute|services|job)")  # fmt: skip
RAW_READS = [
    re.compile(r"\bjob\.(config|record)\b"),  # the job file's config (record): also self.job.record
    re.compile(r"\bjob\.section\("),
    re.compile(r"(?<![\w.])_?section\(\s*config\b"),
    re.compile(r"\bconfig\.get\("),
    re.compile(rf"\bconfig\[\s*[\"']{TABLES}[\"']"),
    re.compile(r"isinstance\(\s*config\b"),
    re.compile(r"\bfrom_config\("),
]
# (file, the line's text) -> why it is not a read of the job's config
ALLOWED = {
    ("trainer_image/posttrain_trainer/artifacts.py",
     'config_path.write_text(json.dumps(job.record, indent=2, default=str))  # for the record: nothing reads it'):
        "the config.json artifact: the record, written as it is",
    ("trainer_image/posttrain_trainer/artifacts.py", '"config": job.record,'):
        "manifest.json keeps the record",
    ("rollout_image/posttrain_rollout/vllm_args.py",
     'parser = TOOL_CALL_PARSERS.get(str(config.get("model_type") if isinstance(config, dict) else ""))'):
        "the model's own config.json (its model_type), not the job's config",
}  # fmt: skip


def raw_reads(files: list[Path]) -> list[str]:
    out = []
    for path in files:
        rel = str(path.relative_to(REPO))
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0] if not line.lstrip().startswith(("'", '"')) else line
            text = line.strip()
            if (rel, text) in ALLOWED or text.startswith("#"):
                continue
            if any(p.search(code) for p in RAW_READS):
                out.append(f"{rel}:{number}: {text}")
    return out


def test_no_image_reads_the_raw_config():
    found = raw_reads(IMAGES)
    assert found == [], "reads of the TOML-shaped config (read job.settings instead):\n" + "\n".join(found)


def test_the_allowed_lines_still_exist():
    """An allowance whose line is gone is stale (and could hide a new read written the same way)."""
    texts = {(str(p.relative_to(REPO)), line.strip()) for p in IMAGES for line in p.read_text().splitlines()}
    assert [key for key in ALLOWED if key not in texts] == []


def test_the_grep_catches_each_kind_of_read(tmp_path):
    sample = tmp_path / "sample.py"
    reads = ['keep = job.config["training"]', "mode = job.section('model')", 'x = section(config, "rollout")',
             'y = config.get("training") or {}', 'z = StepRewardSettings.from_config(config)',
             'w = json.loads(job.record["policy"])', "if isinstance(config, dict):"]  # fmt: skip
    sample.write_text("\n".join(reads) + "\nok = job.settings.rollout.max_turns\n")
    original = REPO
    try:
        globals()["REPO"] = tmp_path
        assert len(raw_reads([sample])) == len(reads)
    finally:
        globals()["REPO"] = original
