"""docs/architecture.md's "The path of one setting" stays true: every module, function and class it names in
backticks exists, and the trainer's read it quotes is in rl.py."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOC = (REPO / "docs" / "architecture.md").read_text()
SECTION = DOC[DOC.index("## The path of one setting") : DOC.index("## Where each concern lives")]


def _resolve(dotted: str) -> object:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            fields = getattr(obj, "model_fields", {})  # a pydantic model's field is no class attribute
            obj = fields[attr] if attr in fields else getattr(obj, attr)
        return obj
    raise ImportError(dotted)


def test_every_named_object_exists():
    names = set(re.findall(r"`((?:posttrain|posttrain_trainer)\.[\w.]+)", SECTION))
    assert len(names) >= 12
    for name in sorted(names):
        _resolve(name)  # raises when the doc names something that is not there


def test_the_quoted_reads_are_the_code():
    rl = (REPO / "trainer_image" / "posttrain_trainer" / "rl.py").read_text()
    assert "policy = replicas.expand(self.job.endpoints.policy)" in rl
    assert "plan_rollouts(self.run_tag, at, seeds, cfg.group_size, policy)" in rl
    assert "self.cfg = cfg = rl_settings(job)" in rl
    assert "settings=self.cfg.rollout" in rl
    settings = (REPO / "operator" / "posttrain" / "api" / "settings.py").read_text()
    assert 'group_size: Annotated[GroupSize, _pick("group_size")]' in settings
    assert "group_size: GroupSize = Field(" in (REPO / "operator" / "posttrain" / "api" / "sections.py").read_text()
