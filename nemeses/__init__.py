"""isrlab nemeses: faults injected into a running cluster, Jepsen-style, over SSH.

One module per fault: ``partition`` (route black-holing and iptables DROP, with shapes),
``process`` (pause and kill -9 of brokers), ``clock`` (bump and strobe of a broker's wall
clock through an offset file, or ``date -s``; ``clockshim`` is the in-process half),
``packet`` (tc netem). ``compose`` puts them behind one ``Nemesis.invoke(op)``, draws the
schedule of ops, and heals everything. ``base`` holds what they share (targets).

Use from a runner::

    nem = nemeses.build(test["nemesis"], db, test)        # fails early if a kind cannot work
    ops = nemeses.schedule(test["nemesis"], test["nemesis_interval"], test["seed"],
                           targets=test.get("nemesis_targets"), keys=test["keys"])
    with nemeses.healing(nem):                             # heals on the way out, also on abort
        for op in ops:                                     # {"type": "sleep"} or an invoke
            ...  completion = nem.invoke(op)
        for op in nemeses.final_ops(test["nemesis"]):
            nem.invoke(op)
"""

from isrlab.nemeses.base import TARGETS, NemesisError
from isrlab.nemeses.compose import (
    DEFAULT_TARGETS,
    KINDS,
    Nemesis,
    build,
    final_ops,
    heal_all,
    healing,
    parse_kinds,
    schedule,
)
from isrlab.nemeses.packet import PacketFaultsUnavailable
from isrlab.nemeses.partition import SHAPES, grudge

__all__ = [
    "DEFAULT_TARGETS",
    "KINDS",
    "SHAPES",
    "TARGETS",
    "Nemesis",
    "NemesisError",
    "PacketFaultsUnavailable",
    "build",
    "final_ops",
    "grudge",
    "heal_all",
    "healing",
    "parse_kinds",
    "schedule",
]
