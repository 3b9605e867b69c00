"""Every status string is bounded by the CRD's own limits before it is written (controller/bounds.py)."""

from __future__ import annotations

from posttrain.controller.bounds import bound_status, event_message, status_schema, truncate


def test_truncate_marks_the_cut() -> None:
    assert truncate("abc", 5) == "abc"
    assert truncate("a" * 10, 8) == "aaaaa..." and len(truncate("a" * 10, 8)) == 8
    assert truncate("abcdef", 2) == "ab"
    assert len(event_message("x" * 5000)) == 1024


def test_status_strings_fit_the_crd_limits() -> None:
    schema = status_schema("RLJob")
    assert schema["properties"]["message"]["maxLength"] == 1024
    long_url = "http://task.example/" + "p" * 3000
    status = {
        "phase": "Verifying",
        "message": f"verifying task app {long_url}: GET /health failed",
        "reason": "VerifyingTaskApp",
        "model": "Qwen/Qwen3-4B",
        "conditions": [
            {"type": "TaskAppVerified", "status": "Unknown", "reason": "R" * 2000, "message": long_url * 20}
        ],
        "observedGeneration": 3,
        "progress": {"step": 4},
    }
    out = bound_status("RLJob", status)
    assert len(out["message"]) == 1024 and out["message"].endswith("...")
    assert out["message"].startswith("verifying task app http://task.example/ppp")
    cond = out["conditions"][0]
    assert len(cond["reason"]) == 1024 and len(cond["message"]) == 32768
    assert (
        out["observedGeneration"] == 3 and out["progress"] == {"step": 4} and out["model"] == "Qwen/Qwen3-4B"
    )
    assert status["message"] != out["message"]  # the input is not modified
    ta = bound_status("TaskApp", {"url": long_url[:2048], "message": "m" * 2000})
    assert ta["url"] == long_url[:2048] and len(ta["message"]) == 1024  # a URL that fits is kept whole
