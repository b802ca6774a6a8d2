"""A netem qdisc on a simulated host's egress: what one packet meets on its way out.

`Netem.parse(behaviour)` reads the ``start-packet`` behaviour of `nemeses.packet` (``{"delay":
"50ms", "jitter": "10ms", "loss": "20%", "duplicate": "10%", "reorder": "25%", "corrupt":
"1%"}``, any subset) through that module's own `netem_args`, so the real nemesis and the
simulated one accept and refuse the same behaviours (unknown keys, an empty behaviour, a
reorder without a delay getting netem_args' 10 ms). Values are read as tc reads them: a time
is a number with ``s``/``sec``/``ms``/``msec``/``us``/``usec`` (a bare number is in
microseconds), a percentage a number with or without ``%``. What the model cannot do is
refused with a `NemesisError` saying so: ``rate`` (netem's bandwidth limit: the simulated
network has no bandwidth, no queue at an interface and no congestion window to meet it) and
correlations (``"loss": "20% 25%"``).

`Netem.packet(rng, stats)` is one packet through the qdisc, in netem_enqueue's order: a
duplicate draw, a loss draw (a duplicated packet survives one loss: netem counts copies), a
corruption draw (a corrupted copy fails the receiver's checksum and is dropped there: a loss
to TCP), then either a reorder (netem sends a reordered packet at once, without the delay) or
the delay, drawn from a normal distribution of mean ``delay`` and deviation ``jitter`` (tc is
asked for ``distribution normal``) and clipped at 0. A copy that survives a duplicate goes
through the qdisc once more (netem re-enqueues it with duplication off) and the packet
arrives with the first good copy; TCP discards the other. It returns the delay the qdisc adds
to the packet, or None when no copy got through. Each probability that is 0 draws nothing.
"""

from __future__ import annotations

import collections
import random
from typing import Any

from isrlab.nemeses.base import NemesisError
from isrlab.nemeses.packet import KNOWN, netem_args

#: payload bytes of one packet: a 1500-byte Ethernet MTU less the IP and TCP headers and
#: the TCP timestamps option (20 + 20 + 12), Linux's MSS on such a link
PACKET = 1448

_TIME_UNITS = {
    "s": 1.0,
    "sec": 1.0,
    "secs": 1.0,
    "ms": 1e-3,
    "msec": 1e-3,
    "msecs": 1e-3,
    "us": 1e-6,
    "usec": 1e-6,
    "usecs": 1e-6,
    "": 1e-6,  # tc: a bare number is in microseconds
}


def parse_time(text: str) -> float:
    """A tc time (``"50ms"``, ``"1.5s"``, ``"200us"``, ``"300"`` = 300 us) in seconds."""
    s = text.strip().lower()
    number = s.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = s[len(number) :]
    try:
        value = float(number)
    except ValueError:
        value = -1.0
    if unit not in _TIME_UNITS or value < 0:
        raise NemesisError(f"netem: {text!r} is not a time (50ms, 1s, 200us)")
    return value * _TIME_UNITS[unit]


def parse_percent(text: str) -> float:
    """A tc percentage (``"20%"`` or ``"20"``) as a probability in [0, 1]."""
    s = text.strip()
    try:
        value = float(s[:-1] if s.endswith("%") else s)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 100:
        if " " in s:
            raise NemesisError(
                f"netem: {text!r}: correlations are not modelled by the simulator; "
                "give one percentage"
            )
        raise NemesisError(f"netem: {text!r} is not a percentage (20%)")
    return value / 100


class Netem:
    """One netem qdisc (see the module docstring): ``delay`` and ``jitter`` in seconds, the
    probabilities ``loss``, ``duplicate``, ``reorder``, ``corrupt``, and the ``behaviour``
    it was parsed from."""

    __slots__ = ("behaviour", "corrupt", "delay", "duplicate", "jitter", "loss", "reorder")

    def __init__(
        self,
        *,
        delay: float = 0.0,
        jitter: float = 0.0,
        loss: float = 0.0,
        duplicate: float = 0.0,
        reorder: float = 0.0,
        corrupt: float = 0.0,
        behaviour: dict[str, Any] | None = None,
    ) -> None:
        self.delay = delay
        self.jitter = jitter
        self.loss = loss
        self.duplicate = duplicate
        self.reorder = reorder
        self.corrupt = corrupt
        self.behaviour = dict(behaviour or {})

    @classmethod
    def parse(cls, behaviour: dict[str, Any]) -> Netem:
        """The qdisc `nemeses.packet` would ask tc for (its `netem_args`); NemesisError for
        what the real nemesis refuses and for what the simulator cannot model."""
        args = netem_args(dict(behaviour))
        values: dict[str, float] = {}
        i = 0
        while i < len(args):
            key, text = args[i], args[i + 1]
            i += 2
            if key == "rate":
                raise NemesisError(
                    "netem rate is not modelled by the simulator (its network has no bandwidth "
                    "and no congestion window); leave 'rate' out of the behaviour"
                )
            if key == "delay":
                values["delay"] = parse_time(text)
                if i < len(args) and args[i] not in KNOWN:  # jitter, distribution normal
                    values["jitter"] = parse_time(args[i])
                    i += 3
            else:
                values[key] = parse_percent(text)
        return cls(behaviour=behaviour, **values)

    def __repr__(self) -> str:
        return f"<Netem {self.behaviour}>"

    def packet(self, rng: random.Random, stats: collections.Counter[str]) -> float | None:
        """One packet through the qdisc: the delay it adds, or None if no copy got through."""
        dup = self.duplicate and rng.random() < self.duplicate
        lost = self.loss and rng.random() < self.loss
        if dup:
            stats["netem_duplicate"] += 1
            if not lost:  # the copy goes through the qdisc once more, duplication off
                first = self._copy(rng, stats)
                again = None
                if self.loss and rng.random() < self.loss:
                    stats["netem_loss"] += 1
                else:
                    again = self._copy(rng, stats)
                if first is None:
                    return again
                return first if again is None else min(first, again)
        elif lost:
            stats["netem_loss"] += 1
            return None
        return self._copy(rng, stats)

    def _copy(self, rng: random.Random, stats: collections.Counter[str]) -> float | None:
        """One copy after the loss draw: corrupted (None), reordered (0) or delayed."""
        if self.corrupt and rng.random() < self.corrupt:
            stats["netem_corrupt"] += 1
            return None
        if self.reorder and rng.random() < self.reorder:
            stats["netem_reorder"] += 1
            return 0.0
        if self.jitter:
            return max(0.0, rng.gauss(self.delay, self.jitter))
        return self.delay


__all__ = ["PACKET", "Netem", "parse_percent", "parse_time"]
