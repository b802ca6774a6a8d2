"""Op shape checks for queue-workload histories, straight from docs/history-format.md."""

from __future__ import annotations

from typing import Any

from isrlab.checkers.queue import codec

SPEC_FIELDS = {
    "index",
    "time",
    "process",
    "type",
    "f",
    "value",
    "key",
    "error",
    "node",
    "watermarks",
    "producer",
}


def _is_key(k: Any) -> bool:
    return isinstance(k, str) and "/" in k and k.rsplit("/", 1)[1].isdigit()


def check_op(op: dict[str, Any]) -> None:
    """Raise AssertionError when an op does not have the spec's shape."""
    assert set(op) <= SPEC_FIELDS, f"unknown fields {set(op) - SPEC_FIELDS} in {op}"
    assert isinstance(op["index"], int) and isinstance(op["time"], int)
    t, f, v = op["type"], op["f"], op.get("value")
    if op["process"] == "nemesis":
        assert t == "info" and isinstance(f, str)
        return
    assert isinstance(op["process"], int)
    assert t in ("invoke", "ok", "fail", "info")
    if f in ("send", "poll", "txn"):
        assert isinstance(v, list) and v, op
        # The codec the checker reads with decodes it to what encodes it back.
        assert [codec.encode(m) for m in codec.decode_value(v)] == v, op
        for mop in v:
            assert mop[0] in ("send", "poll"), op
            if mop[0] == "send":
                assert len(mop) == 3 and _is_key(mop[1]), op
                if t == "invoke":
                    assert isinstance(mop[2], int), op
                elif isinstance(mop[2], list):
                    off, val = mop[2]
                    assert off is None or (isinstance(off, int) and off >= 0), op
                    assert isinstance(val, int), op
                else:
                    assert isinstance(mop[2], int), op
            elif t == "invoke":
                assert mop == ["poll"], op
            else:
                assert len(mop) == 2 and isinstance(mop[1], dict), op
                for k, pairs in mop[1].items():
                    assert _is_key(k), op
                    for off, val in pairs:
                        assert isinstance(off, int) and off >= 0, op
                        assert isinstance(val, int), op  # the workload sends ints only
        if f == "send":
            assert all(m[0] == "send" for m in v), op
        if f == "poll":
            assert all(m[0] == "poll" for m in v), op
    elif f in ("assign", "subscribe"):
        assert isinstance(v, list) and all(_is_key(k) for k in v), op
    elif f == "crash":
        assert v is None and t in ("invoke", "info"), op
    else:
        raise AssertionError(f"unknown f in {op}")
    if "watermarks" in op:
        assert t != "invoke"
        for k, wm in op["watermarks"].items():
            assert _is_key(k) and set(wm) == {"low", "high"}, op
            assert 0 <= wm["low"] <= wm["high"], op
    if "producer" in op:
        p = op["producer"]
        assert set(p) == {"id", "epoch", "idempotent", "transactional_id"}, op
        assert isinstance(p["idempotent"], bool)
