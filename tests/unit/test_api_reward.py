"""posttrain.api.reward.blend_reward: synth's formula, with missing scores counting 0."""

from __future__ import annotations

import pytest
from posttrain.api.reward import blend_reward

WEIGHTS = {"env": 0.5, "event": 0.2, "outcome": 0.3}


def test_env_only_by_default():
    assert blend_reward(2.0) == 2.0
    assert blend_reward(1.0, outcome_score=0.9, event_scores=[1.0]) == 1.0


def test_weighted_sum_of_return_events_and_outcome():
    assert blend_reward(1.0, 0.5, [1.0, None, 0.5], WEIGHTS) == pytest.approx(0.5 + 0.2 * 1.5 + 0.3 * 0.5)
    assert blend_reward(1.0, 0.5, 0.25, WEIGHTS) == pytest.approx(0.5 + 0.2 * 0.25 + 0.3 * 0.5)


def test_missing_scores_count_zero_and_partial_weights_keep_the_defaults():
    assert blend_reward(2.0, None, None, WEIGHTS) == pytest.approx(1.0)
    assert blend_reward(1.0, None, None, {"env": 0, "outcome": 1}) == 0.0
    assert blend_reward(3.0, 1.0, None, {"outcome": 2}) == pytest.approx(3.0 + 2.0)
