"""Capture ids are signed with the job's rollout token (posttrain_trainer.rollouts.make_cid,
posttrain_rollout.captures.signed_cid): unguessable without the token, and the only cids a rollout server
with a token captures under; another pod's calls under a made-up or another job's cid are served, not
captured. The signature leaves the seeding's run-independent tail in place (posttrain_rollout.seeding)."""

from __future__ import annotations

import asyncio

from posttrain_rollout import seeding
from posttrain_rollout.captures import signed_cid
from posttrain_trainer.rollouts import make_cid
from test_rollout_proxy import make


def test_make_cid_signs_with_the_token_and_only_that_token_verifies(monkeypatch) -> None:
    monkeypatch.delenv("POSTTRAIN_ROLLOUT_TOKEN", raising=False)
    plain = make_cid("job-1234abcd", 3, 17, 5)
    assert plain == "trace_job-1234abcd-it3-s17-r5"
    monkeypatch.setenv("POSTTRAIN_ROLLOUT_TOKEN", "tok-A")
    cid = make_cid("job-1234abcd", 3, 17, 5)
    assert cid.startswith("trace_job-1234abcd-m") and cid.endswith("-it3-s17-r5") and cid != plain
    assert signed_cid("tok-A", cid)
    assert not signed_cid("tok-B", cid) and not signed_cid("tok-A", plain)
    assert not signed_cid("tok-A", cid.replace("-r5", "-r6"))  # the mac covers the whole cid
    assert not signed_cid("tok-A", cid.replace("job-1234abcd", "job-9999abcd"))
    monkeypatch.setenv("POSTTRAIN_ROLLOUT_TOKEN", "tok-B")
    assert make_cid("job-1234abcd", 3, 17, 5) != cid  # another job's token: another, unguessable id
    assert seeding.call_key(cid) == seeding.call_key(plain) == "it3-s17-r5"  # same seeds on a rerun


def test_a_server_with_a_token_captures_only_signed_cids_or_token_holders(tmp_path, monkeypatch) -> None:
    calls: list = []
    monkeypatch.setenv("POSTTRAIN_ROLLOUT_TOKEN", "tok-A")
    mine = make_cid("job-a", 0, 1, 0)
    monkeypatch.setenv("POSTTRAIN_ROLLOUT_TOKEN", "tok-B")
    theirs = make_cid("job-a", 0, 1, 0)  # the same ids signed with another job's token
    good = {"Authorization": "Bearer tok-A"}
    chat = {"messages": [{"role": "user", "content": "x"}]}

    async def scenario() -> dict[str, int]:
        proxy, http = make(calls, run_dir=tmp_path, token="tok-A")
        codes = {}
        for name, cid, headers in (("signed", mine, {}), ("forged", theirs, {}), ("guessed", "trace_job-a-it0-s1-r0", {}),
                                   ("bearer", "eval-1", good)):  # fmt: skip
            served = await http.post(f"/v1/chat/completions?cid={cid}", json=chat, headers=headers)
            assert served.status_code == 200, name  # generation stays open
            codes[name] = (await http.get(f"/v1/captures/{cid}", headers=good)).status_code
        codes["unsigned"] = proxy.unsigned_cids
        await http.aclose()
        return codes

    codes = asyncio.run(scenario())
    assert codes == {"signed": 200, "forged": 404, "guessed": 404, "bearer": 200, "unsigned": 2}
    # the refused ones reached vLLM without capture options (no token ids asked for)
    assert [c[1].get("return_token_ids") for c in calls] == [True, None, None, True]
