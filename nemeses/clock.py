"""Clock faults on brokers: bump (one jump) and strobe (flip back and forth), then reset.

How a node's clock moves depends on ``db.clock_via_file(node)``:

offset file (default; embedded nodes, which share one kernel clock, and real hosts alike)
    the broker follows the wall-clock offset in ``db.clock_offset_file(node)`` (see
    ``nemeses.clockshim``: libfaketime's idea, inside CPython); this module writes the offset
    there (``+12.345`` seconds, ``+0.000`` to reset). Only the wall clock moves, as with
    ``date -s``.
``date -s`` (``clock_mode: date``, real hosts only)
    the node's system clock is stepped by the delta (``date -s @<epoch>``); the deltas applied
    are remembered and reset steps back by their sum, or lets chrony/ntpdate step it right when
    one is installed.

``start-clock`` values: ``{"mode": "bump", "target": T, "delta_ms": D}`` moves each target's clock
by D ms (random in +-``max_skew_ms`` when absent; each node its own when ``"per_node": true``);
``{"mode": "strobe", "target": T, "delta_ms": D, "period_ms": P}`` flips the targets between
+D and 0 every P ms in a background thread until ``stop-clock``. Completions:
``{"mode", "target", "offsets": {node: seconds}}``. ``stop-clock`` and ``heal()`` put every clock
back (offset 0) and stop a strobe.
"""

from __future__ import annotations

import random
import shlex
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from isrlab.nemeses.base import ClusterDB, NemesisError, resolve_targets

DEFAULT_MAX_SKEW_MS = 60_000


class ClockFault:
    kind = "clock"

    def __init__(self, db: ClusterDB, rng: random.Random) -> None:
        self.db = db
        self.rng = rng
        self.max_skew_ms = int(db.test.get("clock_max_skew_ms") or DEFAULT_MAX_SKEW_MS)
        self.offsets: dict[str, float] = {}  # seconds, as last set
        self._date_applied: dict[str, float] = {}  # date -s mode: steps not yet undone
        self._strobe_stop = threading.Event()
        self._strobe: threading.Thread | None = None
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ one node

    def set_offset(self, node: str, seconds: float) -> None:
        """Make ``node``'s broker see wall time shifted by ``seconds`` from true time."""
        with self._lock:
            if self.db.clock_via_file(node):
                path = shlex.quote(self.db.clock_offset_file(node))
                # write then rename: the broker must never read a half-written file
                self.db.remote(node).exec(
                    f"printf '%s\\n' {seconds:+.3f} > {path}.tmp && mv -f {path}.tmp {path}"
                )
            else:
                step = seconds - self._date_applied.get(node, 0.0)
                if step:
                    self.db.remote(node).exec(
                        f"date -u -s @$(python3 -c 'import time; print(time.time() + {step!r})') "
                        ">/dev/null"
                    )
                self._date_applied[node] = seconds
            self.offsets[node] = seconds

    def reset_node(self, node: str) -> None:
        if self.db.clock_via_file(node):
            self.set_offset(node, 0.0)
            return
        applied = self._date_applied.get(node, 0.0)
        r = self.db.remote(node)
        synced = r.exec(
            "(command -v chronyc >/dev/null && chronyc -a makestep >/dev/null) || "
            "(command -v ntpdate >/dev/null && ntpdate -u -b pool.ntp.org >/dev/null)",
            check=False,
        ).ok
        if synced:
            with self._lock:
                self._date_applied[node] = 0.0
                self.offsets[node] = 0.0
        elif applied:
            self.set_offset(node, 0.0)

    # ------------------------------------------------------------------ fault

    def _delta_ms(self, value: dict[str, Any]) -> float:
        if value.get("delta_ms") is not None:
            return float(value["delta_ms"])
        return float(self.rng.randint(-self.max_skew_ms, self.max_skew_ms))

    def start(self, value: Any) -> dict[str, Any]:
        value = dict(value or {})
        mode = str(value.get("mode", "bump"))
        target = str(value.get("target", "one"))
        nodes = resolve_targets(target, self.db, self.rng, value.get("key"))
        if mode == "bump":
            offsets = {}
            delta = self._delta_ms(value)
            for n in nodes:
                d = self._delta_ms({}) if value.get("per_node") else delta
                offsets[n] = self.offsets.get(n, 0.0) + d / 1000.0
            self._each(lambda n: self.set_offset(n, offsets[n]), nodes)
            return {"mode": mode, "target": target, "offsets": offsets}
        if mode == "strobe":
            delta_s = self._delta_ms(value) / 1000.0
            period_s = float(value.get("period_ms", 500)) / 1000.0
            self._stop_strobe()
            self._strobe_stop = threading.Event()
            self._strobe = threading.Thread(
                target=self._strobe_loop,
                args=(nodes, delta_s, period_s, self._strobe_stop),
                name="clock-strobe",
                daemon=True,
            )
            self._strobe.start()
            return {
                "mode": mode,
                "target": target,
                "offsets": dict.fromkeys(nodes, delta_s),
                "period_ms": period_s * 1000,
            }
        raise NemesisError(f"unknown clock mode {mode!r}; use bump or strobe")

    def _strobe_loop(
        self, nodes: list[str], delta_s: float, period_s: float, stop: threading.Event
    ) -> None:
        high = True
        while not stop.is_set():
            try:
                offset = delta_s if high else 0.0
                self._each(lambda n, off=offset: self.set_offset(n, off), nodes)
            except Exception:
                pass  # a node unreachable mid-strobe: keep strobing the others, heal resets all
            high = not high
            stop.wait(period_s)

    def _stop_strobe(self) -> None:
        self._strobe_stop.set()
        if self._strobe is not None:
            self._strobe.join(timeout=30)
            self._strobe = None

    def _each(self, fn: Any, nodes: list[str]) -> None:
        if nodes:
            with ThreadPoolExecutor(max_workers=len(nodes)) as ex:
                list(ex.map(fn, nodes))

    def current_offset(self, node: str) -> float:
        """The offset ``node`` runs with now (read from its offset file in file mode)."""
        if not self.db.clock_via_file(node):
            return self._date_applied.get(node, 0.0)
        res = self.db.remote(node).exec(
            f"cat {self.db.clock_offset_file(node)} 2>/dev/null", check=False
        )
        try:
            return float(res.stdout.strip() or 0)
        except ValueError:
            return float("nan")  # garbage in the file: report it skewed, reset rewrites it

    def stop(self, value: Any = None) -> dict[str, Any]:
        self._stop_strobe()
        names = self.db.names
        with ThreadPoolExecutor(max_workers=len(names)) as ex:
            before = list(ex.map(self.current_offset, names))
        skewed = sorted(n for n, off in zip(names, before, strict=True) if off != 0.0)
        self._each(self.reset_node, names)
        return {"nodes": skewed, "offsets": dict.fromkeys(names, 0.0)}

    def heal(self) -> list[str]:
        return list(self.stop()["nodes"])
