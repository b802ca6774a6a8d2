"""Subscribe mode: rebalances explain skips and re-reads, and `committed-offset-regression`.

Hand-written histories for each rule of checkers/queue/group.py and the rebalance resets
of `QueueAnalysis._op_checks` (docs/anomalies.md, docs/history-format.md), then simulated
consumer groups (pipeline/fixtures/subscribe.py): clean ones are valid, a planted
regression is found; the native screen, the fast loader and the per-key checks agree
with the checker on all of them.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import orjson
import pytest
import typer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from isrlab.checkers.cli import check_command
from isrlab.checkers.history import HistoryError, validate, write_history
from isrlab.checkers.queue import check_queue, keys_of, merge_results, project_key, screen
from isrlab.checkers.queue.load import QueueFile, load_queue
from isrlab.pipeline.fixtures.subscribe import simulate_subscribe
from tests.checkers.hist import H

K = "t0/0"
REGRESSION = "committed-offset-regression"


def reb(
    gen: int,
    assigned: list[str] = (),  # type: ignore[assignment]
    revoked: list[str] = (),  # type: ignore[assignment]
    committed: dict[str, int | None] | None = None,
) -> dict[str, Any]:
    out: dict[str, Any] = {"generation": gen, "assigned": list(assigned), "revoked": list(revoked)}
    if committed is not None:
        out["committed"] = committed
    return out


def commit(h: H, p: int, offsets: dict[str, int], typ: str = "ok", **extra: Any) -> int:
    h.invoke(p, "commit", [["commit", offsets]])
    return h.complete(p, typ, "commit", [["commit", offsets]], **extra)


def subscribe(h: H, p: int, keys: list[str] | None = None) -> int:
    h.invoke(p, "subscribe", keys or [K])
    return h.complete(p, "ok", "subscribe", keys or [K])


def sent(h: H, n: int, key: str = K) -> None:
    for i in range(n):
        h.send(9, key, i, i)


def pairs(lo: int, hi: int) -> list[list[int]]:
    return [[o, o] for o in range(lo, hi)]


def check(ops: list[dict[str, Any]], **opts: Any) -> dict[str, Any]:
    """The checker's results, which the screen, the per-key checks and the file loader
    must give too."""
    want = check_queue(ops, screen=False, **opts)
    assert check_queue(ops, **opts) == want
    return want


def types(ops: list[dict[str, Any]]) -> list[str]:
    return check(ops)["anomaly_types"]


def drain(h: H, n: int, key: str = K) -> None:
    h.assign(50, [key])
    h.poll(50, {key: pairs(0, n)})


# -- rule 1: positions are judged within one continuous assignment --------------------------


def moving_group(*, with_rebalances: bool) -> H:
    """Process 1 reads 0-1 of K, loses it to process 2 (which reads 2-5 and commits 6), then
    gets it back and reads from 6; later an eager rebalance hands it K again and it
    re-reads from the committed offset 6."""
    h = H()
    sent(h, 9)
    subscribe(h, 1)
    subscribe(h, 2)

    def r(*a: Any, **kw: Any) -> dict[str, Any]:
        return {"rebalance": reb(*a, **kw)} if with_rebalances else {}

    h.poll(1, {K: pairs(0, 2)}, **r(1, [K], [], {K: None}))
    h.poll(2, {K: pairs(2, 6)}, **r(2, [K], [], {K: 2}))
    commit(h, 2, {K: 6})
    h.poll(1, {}, **r(3, [], [K]))
    h.poll(2, {}, **r(4, [], [K]))
    h.poll(1, {K: pairs(6, 8)}, **r(4, [K], [], {K: 6}))
    h.poll(1, {K: pairs(6, 9)}, **r(5, [K], [K], {K: 6}))
    drain(h, 9)
    return h


def test_a_clean_subscribe_history_with_rebalances_is_valid() -> None:
    r = check(moving_group(with_rebalances=True).ops)
    assert r["valid"] is True and r["anomaly_types"] == [], r["anomaly_types"]
    assert r["stats"]["subscribe_mode"] is True
    assert r["stats"]["rebalances"] == 6 and r["stats"]["commits"] == 1


def test_without_rebalances_the_same_moves_are_reported_and_allowed_as_in_jepsen() -> None:
    # No history of rebalances: nothing explains the moves, which are reported, but a
    # subscribe-mode history that records none is judged as Jepsen does (allowed).
    r = check(moving_group(with_rebalances=False).ops)
    assert {"poll-skip", "nonmonotonic-poll"} <= set(r["anomaly_types"])
    assert r["valid"] is True
    assert r["not_allowed"] == []


def test_a_skip_no_rebalance_explains_is_a_poll_skip() -> None:
    h = H()
    sent(h, 6)
    subscribe(h, 1)
    h.poll(1, {K: pairs(0, 2)}, rebalance=reb(1, [K], [], {K: None}))
    h.poll(1, {K: pairs(4, 6)})  # skips 2-3, and no rebalance moved K
    drain(h, 6)
    r = check(h.ops)
    assert r["anomaly_types"] == ["poll-skip"]
    assert r["not_allowed"] == ["poll-skip"] and r["valid"] is False
    ex = r["anomalies"]["poll-skip"]["examples"][0]
    assert ex["offsets"] == [1, 4] and ex["skipped"] == [2, 3]


def test_a_rebalance_of_another_key_explains_nothing() -> None:
    h = H()
    sent(h, 6)
    sent(h, 1, "t0/1")
    subscribe(h, 1, [K, "t0/1"])
    h.poll(1, {K: pairs(0, 3)}, rebalance=reb(1, [K], []))
    h.poll(1, {K: pairs(1, 3)}, rebalance=reb(2, ["t0/1"], []))  # goes back in K
    drain(h, 6)
    h.assign(50, ["t0/1"])
    h.poll(50, {"t0/1": pairs(0, 1)})
    r = check(h.ops)
    assert r["anomaly_types"] == ["nonmonotonic-poll"] and r["valid"] is False


def test_reads_within_the_op_of_a_rebalance_may_go_back() -> None:
    """An eager rebalance in the middle of an op: the key's reads restart at the committed
    offset inside the op (Jepsen's rebalanced keys). Without the rebalance the same op is
    an int-nonmonotonic-poll."""

    def history(with_rebalance: bool) -> list[dict[str, Any]]:
        h = H()
        sent(h, 5)
        subscribe(h, 1)
        h.poll(1, {K: pairs(0, 2)}, rebalance=reb(1, [K], []))
        commit(h, 1, {K: 1})
        extra = {"rebalance": reb(2, [K], [K], {K: 1})} if with_rebalance else {}
        h.txn(1, [["poll", {K: pairs(2, 4)}], ["poll", {K: pairs(1, 5)}]], **extra)
        drain(h, 5)
        return h.ops

    assert types(history(True)) == []
    assert types(history(False)) == ["int-nonmonotonic-poll"]


@pytest.mark.parametrize("leaves", [False, True])
def test_an_assign_keeps_the_keys_it_names(leaves: bool) -> None:
    """assign after subscribe: K stays (the client resumes it where the process was), so
    going back is still a nonmonotonic-poll, also when the assign left the group and its
    completion carries the revocation."""

    def history(resume_at: int) -> list[dict[str, Any]]:
        h = H()
        sent(h, 5)
        subscribe(h, 1)
        h.poll(1, {K: pairs(0, 3)}, rebalance=reb(1, [K], []))
        h.invoke(1, "assign", [K])
        h.complete(1, "ok", "assign", [K], **({"rebalance": reb(1, [], [K])} if leaves else {}))
        h.poll(1, {K: pairs(resume_at, 5)})
        drain(h, 5)
        return h.ops

    assert check(history(1))["not_allowed"] == ["nonmonotonic-poll"]
    assert types(history(3)) == []


# -- rule 2: committed-offset-regression --------------------------------------------------


def regression_by_fetch(*, fetched: int | None, concurrent: bool = False) -> H:
    """Process 1 commits 4 of K; process 2, assigned K in a later rebalance, fetches the
    group's committed offset as `fetched`. concurrent: process 2's op is invoked before
    the commit completes."""
    h = H()
    sent(h, 6)
    subscribe(h, 1)
    subscribe(h, 2)
    h.poll(1, {K: pairs(0, 4)}, rebalance=reb(1, [K], [], {K: None}))
    h.invoke(1, "commit", [["commit", {K: 4}]])
    if concurrent:
        h.invoke(2, "poll", [["poll"]])
        h.complete(1, "ok", "commit", [["commit", {K: 4}]])
    else:
        h.complete(1, "ok", "commit", [["commit", {K: 4}]])
        h.invoke(2, "poll", [["poll"]])
    start = 0 if fetched is None else fetched
    h.complete(
        2, "ok", "poll", [["poll", {K: pairs(start, 6)}]], rebalance=reb(2, [K], [], {K: fetched})
    )
    drain(h, 6)
    return h


def test_a_fetched_committed_offset_below_an_earlier_commit_is_a_regression() -> None:
    r = check(regression_by_fetch(fetched=2).ops)
    assert r["anomaly_types"] == [REGRESSION] and r["valid"] is False
    (ex,) = r["anomalies"][REGRESSION]["examples"]
    assert ex["key"] == K and ex["offset"] == 2 and ex["committed_offset"] == 4
    assert ex["observed_by"] == "offset-fetch" and ex["generation"] == 2
    assert ex["ops"] == [19, 21]
    assert ex["explanation"] == (
        "op 19 (process 1, ok commit) committed offset 4 for key 't0/0' and completed before "
        "op 21 (process 2, ok poll) was invoked; yet in that op's rebalance (generation 2) the "
        "client found the group's committed offset of 't0/0' to be 2: the group's committed "
        "offset went backwards"
    )


def test_a_vanished_committed_offset_is_a_regression() -> None:
    r = check(regression_by_fetch(fetched=None).ops)
    (ex,) = r["anomalies"][REGRESSION]["examples"]
    assert ex["offset"] is None and ex["offsets"] == [4]
    assert "the client found no committed offset of 't0/0' in the group:" in ex["explanation"]


def test_the_committed_offset_itself_or_higher_is_fine() -> None:
    assert types(regression_by_fetch(fetched=4).ops) == []
    assert types(regression_by_fetch(fetched=5).ops) == []


def test_a_fetch_concurrent_with_the_commit_is_no_regression() -> None:
    # The poll was invoked before the commit completed: the fetch may precede the commit.
    assert types(regression_by_fetch(fetched=2, concurrent=True).ops) == []


def regression_by_first_poll(*, assign_between: bool = False, commit_late: bool = False) -> H:
    """Process 1 commits 4; process 2's op 'a' carries a rebalance assigning K (no
    committed field); its next poll starts K at offset 2. assign_between: process 2
    assigns K explicitly before that poll. commit_late: the commit completes after op 'a'
    was invoked (but before the poll)."""
    h = H()
    sent(h, 6)
    subscribe(h, 1)
    subscribe(h, 2)
    h.poll(1, {K: pairs(0, 4)}, rebalance=reb(1, [K], []))
    h.invoke(1, "commit", [["commit", {K: 4}]])
    if commit_late:
        h.invoke(2, "poll", [["poll"]])
        h.complete(1, "ok", "commit", [["commit", {K: 4}]])
    else:
        h.complete(1, "ok", "commit", [["commit", {K: 4}]])
        h.invoke(2, "poll", [["poll"]])
    h.complete(2, "ok", "poll", [["poll", {}]], rebalance=reb(2, [K], []))
    if assign_between:
        h.assign(2, [K])
    h.poll(2, {K: pairs(2, 6)})
    drain(h, 6)
    return h


def test_a_member_starting_below_an_earlier_commit_is_a_regression() -> None:
    r = check(regression_by_first_poll().ops)
    assert r["anomaly_types"] == [REGRESSION] and r["valid"] is False
    (ex,) = r["anomalies"][REGRESSION]["examples"]
    assert ex["observed_by"] == "first-poll" and ex["ops"] == [19, 21, 23]
    assert ex["offset"] == 2 and ex["committed_offset"] == 4 and ex["generation"] == 2
    assert ex["explanation"] == (
        "op 19 (process 1, ok commit) committed offset 4 for key 't0/0' and completed before "
        "op 21 (process 2, ok poll) was invoked, whose rebalance (generation 2) assigned "
        "'t0/0' to process 2; the first record that process then read of 't0/0', in op 23 "
        "(process 2, ok poll), was at offset 2, so the member started below the group's "
        "committed offset: the group's committed offset went backwards"
    )


def test_a_first_poll_is_judged_against_commits_before_the_rebalance_op() -> None:
    # The committed offset was fetched during op 'a', maybe before the commit completed.
    assert types(regression_by_first_poll(commit_late=True).ops) == []


def test_an_explicit_assign_resets_where_the_member_starts() -> None:
    assert types(regression_by_first_poll(assign_between=True).ops) == []


def test_only_the_first_read_after_the_rebalance_counts() -> None:
    h = regression_by_first_poll()
    # the same history with the member starting at 4 and reading 4-5, then the drain
    ok = H()
    ok.ops = copy.deepcopy(h.ops)
    for op in ok.ops:
        if op["index"] == 23:
            op["value"] = [["poll", {K: pairs(4, 6)}]]
    assert types(ok.ops) == []


def test_reads_in_the_op_of_an_eager_rebalance_may_precede_it() -> None:
    """K revoked and assigned again in an op that reads K: its first read may be from
    before the rebalance (here the continuation 2-3, then 6-7 from the new start), so it
    is not where the member started."""
    h = H()
    sent(h, 8)
    subscribe(h, 1)
    subscribe(h, 2)
    h.poll(1, {K: pairs(0, 2)}, rebalance=reb(1, [K], []))
    commit(h, 2, {K: 6})
    h.poll(1, {K: [*pairs(2, 4), *pairs(6, 8)]}, rebalance=reb(2, [K], [K]))
    drain(h, 8)
    h.poll(2, {K: pairs(4, 6)})
    assert types(h.ops) == []


def test_a_revoked_key_read_later_is_not_where_the_member_started() -> None:
    h = H()
    sent(h, 6)
    subscribe(h, 1)
    subscribe(h, 2)
    h.poll(1, {K: pairs(0, 4)}, rebalance=reb(1, [K], []))
    commit(h, 1, {K: 4})
    h.poll(2, {}, rebalance=reb(2, [K], []))
    h.poll(2, {}, rebalance=reb(3, [], [K]))
    h.poll(2, {K: pairs(2, 6)})  # records fetched before the revocation, say
    drain(h, 6)
    assert types(h.ops) == []


def test_an_ok_commit_going_back_is_reported_once_the_group_is_seen_there() -> None:
    h = H()
    sent(h, 6)
    subscribe(h, 1)
    subscribe(h, 2)
    h.poll(1, {K: pairs(0, 4)}, rebalance=reb(1, [K], []))
    commit(h, 1, {K: 4})
    commit(h, 1, {K: 2})  # the group is told to go back: not an anomaly by itself
    drain(h, 6)
    assert types(h.ops) == []
    h.poll(2, {K: pairs(2, 6)}, rebalance=reb(2, [K], [], {K: 2}))
    r = check(h.ops)
    (ex,) = r["anomalies"][REGRESSION]["examples"]
    assert ex["lower_commit"] == 21 and ex["ops"] == [19, 27]
    assert ex["explanation"].endswith(
        "(the lower offset is what op 21 (process 1, ok commit) committed after op 19 "
        "(process 1, ok commit) had completed)"
    )


def test_failed_and_unknown_commits_promise_nothing() -> None:
    for typ in ("fail", "info"):
        h = H()
        sent(h, 6)
        subscribe(h, 1)
        subscribe(h, 2)
        h.poll(1, {K: pairs(0, 4)}, rebalance=reb(1, [K], []))
        commit(h, 1, {K: 4}, typ=typ)
        h.poll(2, {K: pairs(2, 6)}, rebalance=reb(2, [K], [], {K: 2}))
        drain(h, 6)
        assert types(h.ops) == [], typ


def test_commits_beyond_what_was_sent_are_not_an_anomaly() -> None:
    h = H()
    sent(h, 2)
    subscribe(h, 1)
    h.poll(1, {K: pairs(0, 2)}, rebalance=reb(1, [K], []))
    commit(h, 1, {K: 1000})
    drain(h, 2)
    assert types(h.ops) == []


# -- history shapes ---------------------------------------------------------------------


def test_a_commit_inside_a_transaction_is_still_refused() -> None:
    h = H()
    h.invoke(1, "txn", [["poll"], ["commit", {K: 1}]])
    h.complete(1, "ok", "txn", [["poll", {}], ["commit", {K: 1}]])
    with pytest.raises(HistoryError, match="unknown micro-op 'commit'"):
        check_queue(h.ops)


@pytest.mark.parametrize(
    ("field", "message"),
    [
        ([1], "rebalance must be an object"),
        ({"generation": "2", "assigned": [K]}, "generation must be an integer"),
        ({"generation": 2, "assigned": K}, "'assigned' must be a list of keys"),
        ({"generation": 2, "revoked": [[K]]}, "'revoked' keys must be scalars"),
        ({"generation": 2, "committed": {K: "4"}}, "committed offset of 't0/0' must be"),
        ({"generation": 2, "committed": [4]}, "committed must be an object"),
    ],
)
def test_a_malformed_rebalance_is_a_clear_error(field: Any, message: str, tmp_path: Path) -> None:
    h = H()
    sent(h, 1)
    h.poll(1, {K: pairs(0, 1)}, rebalance=field)
    with pytest.raises(HistoryError, match=message) as e:
        check_queue(h.ops)
    assert e.value.line == 4
    path = tmp_path / "history.jsonl"
    write_history(h.ops, path)
    with pytest.raises(HistoryError, match=message):
        check_queue(QueueFile(path))


@pytest.mark.parametrize("value", [[["commit", {K: "4"}]], [["poll", {}]], [["commit"]], {"k": 1}])
def test_a_malformed_commit_is_a_clear_error(value: Any) -> None:
    h = H()
    sent(h, 1)
    h.invoke(1, "commit", value)
    h.complete(1, "ok", "commit", value)
    with pytest.raises(HistoryError, match="commit") as e:
        check_queue(h.ops)
    assert e.value.line == 4


# -- the other paths agree -------------------------------------------------------------


def agree(ops: list[dict[str, Any]], tmp_path: Path) -> dict[str, Any]:
    """Results of the checker, which every other path must give too: the screen (which
    hands any commit or rebalance to the checker), the fast file loader, and per-key
    checks merged."""
    validate(ops)
    want = check_queue(ops, screen=False)
    got = screen.screen_ops(ops)
    assert got.stats is None and got.needs_checker == "consumer-group commits or rebalances"
    assert check_queue(ops) == want
    path = tmp_path / "history.jsonl"
    write_history(ops, path)
    loaded = load_queue(path)
    assert not isinstance(loaded, list)  # the fast path took it
    assert check_queue(loaded) == want
    assert check_queue(QueueFile(path)) == want
    per_key = merge_results(check_queue(project_key(ops, k)) for k in keys_of(ops))
    assert per_key["valid"] == want["valid"]
    assert per_key["anomaly_types"] == want["anomaly_types"]
    for name, a in want["anomalies"].items():
        assert per_key["anomalies"][name]["count"] == a["count"], name
    return want


def test_every_path_agrees_on_the_hand_written_histories(tmp_path: Path) -> None:
    for h in (
        moving_group(with_rebalances=True),
        regression_by_fetch(fetched=2),
        regression_by_fetch(fetched=None),
        regression_by_first_poll(),
        regression_by_first_poll(assign_between=True),
    ):
        agree(h.ops, tmp_path)


def test_simulated_groups_are_valid_and_a_planted_regression_is_found(tmp_path: Path) -> None:
    moved = first_polls = 0
    for seed in range(6):
        ops = simulate_subscribe(1500, seed=seed)
        r = agree(ops, tmp_path)
        assert r["valid"] is True and r["anomaly_types"] == [], (seed, r["anomaly_types"])
        assert r["stats"]["rebalances"] > 5 and r["stats"]["commits"] > 5
        # The moves rebalances explain are there: without the rebalance fields, they are
        # skips and re-reads.
        bare = [{k: v for k, v in op.items() if k != "rebalance"} for op in ops]
        moved += bool({"poll-skip", "nonmonotonic-poll"} & set(check_queue(bare)["anomaly_types"]))
        for fetch in (True, False):
            bad = simulate_subscribe(1500, seed=seed, regression=True, fetch_committed=fetch)
            r = agree(bad, tmp_path)
            first_polls += not fetch and REGRESSION in r["anomaly_types"]
            if fetch or REGRESSION in r["anomaly_types"]:
                assert r["anomaly_types"] == [REGRESSION], (seed, fetch, r["anomaly_types"])
                how = "offset-fetch" if fetch else "first-poll"
                assert r["anomalies"][REGRESSION]["examples"][0]["observed_by"] == how
    assert moved >= 5
    assert first_polls >= 4  # a member's reads may all fall in its eager rebalance's op


@given(
    seed=st.integers(0, 2**32 - 1),
    n_ops=st.integers(50, 800),
    processes=st.integers(1, 5),
    keys=st.integers(1, 5),
    fail_rate=st.sampled_from([0.0, 0.1]),
    info_rate=st.sampled_from([0.0, 0.05]),
    crash_rate=st.sampled_from([0.0, 0.03]),
    fetch=st.booleans(),
)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_simulated_consumer_groups_are_always_valid(
    seed: int,
    n_ops: int,
    processes: int,
    keys: int,
    fail_rate: float,
    info_rate: float,
    crash_rate: float,
    fetch: bool,
) -> None:
    ops = simulate_subscribe(
        n_ops,
        seed=seed,
        processes=processes,
        keys=keys,
        fail_rate=fail_rate,
        info_rate=info_rate,
        crash_rate=crash_rate,
        fetch_committed=fetch,
    )
    r = check_queue(ops)
    assert r["anomaly_types"] == [], r["anomalies"]


def test_the_worked_example_of_docs_anomalies_md_gives_the_results_shown() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs/anomalies.md").read_text()
    section = doc.split("### A committed-offset regression", 1)[1].split("\n### ", 1)[0]
    blocks = section.split("```")
    history = [orjson.loads(line) for line in blocks[1].strip().splitlines()]
    shown = orjson.loads(blocks[3].removeprefix("json"))
    assert check(history) == shown


def test_isrlab_check_prints_explains_and_draws_the_regression(tmp_path: Path) -> None:
    app = typer.Typer()
    app.command()(check_command)
    path = tmp_path / "history.jsonl"
    write_history(regression_by_fetch(fetched=2).ops, path)
    text = CliRunner().invoke(app, [str(path), "--workload", "queue"])
    assert text.exit_code == 1
    assert REGRESSION in text.stdout and "INVALID" in text.stdout
    out = tmp_path / "out"
    res = CliRunner().invoke(app, [str(path), "--workload", "queue", "--json", "--out", str(out)])
    assert res.exit_code == 1
    results = orjson.loads(res.stdout)
    assert results == orjson.loads((out / "results.json").read_bytes())
    assert results["anomalies"][REGRESSION]["count"] == 1 and results["valid"] is False
    summary = (out / "summary.txt").read_text()
    assert f"{REGRESSION}: 1  (not allowed)" in summary
    assert "the group's committed offset went backwards" in summary
    drawn = (out / "offsets-t0_0.svg").read_text()
    assert "commit (ok)" in drawn and "fetched committed (ok)" in drawn
    # allowed on request, like any other name
    res = CliRunner().invoke(app, [str(path), "-w", "queue", "--json", "--allow", REGRESSION])
    assert res.exit_code == 0 and orjson.loads(res.stdout)["anomaly_types"] == [REGRESSION]
