"""Linearizability checking of register and key-value histories, Porcupine-style.

``check(model, ops, timeout_s)`` takes op dicts (history format v1) and a :class:`Model`
(built-ins in :mod:`checkers.linear.models`: ``REGISTER``, ``CAS_REGISTER``, ``KV``) and returns
a :class:`LinearizabilityResult` whose ``verdict`` is ``"ok"``, ``"illegal"`` or ``"unknown"``
(timeout), with per-partition results and counterexamples.  :mod:`checkers.linear.api` turns
that into the spec's results dict and writes the HTML visualisation.
"""

from isrlab.checkers.linear.checker import (
    LinearizabilityResult,
    PartitionResult,
    check,
    check_operations,
)
from isrlab.checkers.linear.model import UNKNOWN, Model, Operation
from isrlab.checkers.linear.models import CAS_REGISTER, KV, KV_UNPARTITIONED, MODELS, REGISTER

__all__ = [
    "CAS_REGISTER",
    "KV",
    "KV_UNPARTITIONED",
    "MODELS",
    "REGISTER",
    "UNKNOWN",
    "LinearizabilityResult",
    "Model",
    "Operation",
    "PartitionResult",
    "check",
    "check_operations",
]
