"""The null client (harness/workloads/queue/nullclient.py) under the real queue workload:
its histories have the real client's shapes and pass the queue checker."""

from __future__ import annotations

from pathlib import Path

from isrlab.checkers.history import load_history
from isrlab.checkers.queue import check_queue
from isrlab.harness.history import HistoryWriter
from isrlab.harness.interpreter import Interpreter
from isrlab.harness.runner import make_test
from isrlab.harness.workloads.queue.generator import QueueWorkload, queue_test
from isrlab.harness.workloads.queue.nullclient import NullClient
from tests.workload.shapes import check_op


def test_null_client_history_is_valid(tmp_path: Path) -> None:
    test = make_test(
        {
            "name": "null",
            "nemesis": "none",
            "concurrency": 4,
            "time_limit": 0.5,
            "final_time_limit": 5,
            "recovery_time": 0,
            "store": str(tmp_path),
            "seed": 1,
        }
    ).to_test()
    history = HistoryWriter(tmp_path / "history.jsonl")
    Interpreter(
        queue_test(QueueWorkload(test), test), history, NullClient.factory(max_poll_records=7), 4
    ).run()
    history.close()
    ops = load_history(tmp_path / "history.jsonl")
    for op in ops:
        check_op(op)
    sends = [o for o in ops if o["type"] == "ok" and o["f"] == "send"]
    assert len(sends) > 10
    result = check_queue(ops)
    assert result["valid"] is True, result["anomaly_types"]
