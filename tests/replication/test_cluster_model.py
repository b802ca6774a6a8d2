"""Hypothesis runs of the simulated cluster (see ``cluster_machine``).

Safe settings must survive every generated history; each historic switch must produce a
counterexample. Runs are derandomized (reproducible) and bounded; the slow soak explores more.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from unittest import mock

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import RuleBasedStateMachine, run_state_machine_as_test

from tests.replication.cluster_machine import (
    ClusterMachine,
    HighWatermarkTruncationMachine,
    IsrOfOneMachine,
    LastReplicaStandingMachine,
    LsoIgnoresTransactionsMachine,
    NoEligibleLeaderReplicasMachine,
    TransactionalClusterMachine,
    UncleanElectionMachine,
)


@contextmanager
def no_harvested_constants() -> Iterator[None]:
    """Keep Hypothesis from drawing the literals it harvests from every non-test module
    imported so far (``HypothesisProvider._maybe_draw_constant``, Hypothesis 6.13x on).
    Stateful runs draw each example's rule-disabling probability as an integer in 0..254,
    which that pool can replace, so the same derandomized run explored other histories
    depending on what else the process had imported (``pytest tests/replication`` alone
    versus ``tests/cluster`` first, or ``make test``) and on any literal anywhere in the
    product code. Not a hash-seed effect: the pool is sorted. A Hypothesis without that
    method runs unpinned (the budgets below leave room for other histories)."""
    try:
        from hypothesis.internal.conjecture.providers import HypothesisProvider
    except ImportError:
        HypothesisProvider = None  # type: ignore[assignment,misc]
    if not hasattr(HypothesisProvider, "_maybe_draw_constant"):
        yield
        return
    with mock.patch.object(HypothesisProvider, "_maybe_draw_constant", lambda *_a, **_k: None):
        yield


def run(machine: type[RuleBasedStateMachine], examples: int, steps: int = 100) -> None:
    with no_harvested_constants():
        run_state_machine_as_test(
            machine,
            settings=settings(
                max_examples=examples,
                stateful_step_count=steps,
                derandomize=True,
                deadline=None,
                database=None,
                # Shrinking a counterexample costs more than finding it; the failure message
                # carries the cluster's event trace instead.
                phases=[Phase.generate],
                suppress_health_check=list(HealthCheck),
            ),
        )


def test_safe_settings_keep_acked_records_and_committed_prefixes() -> None:
    run(ClusterMachine, examples=150)


def test_eligible_leader_replicas_survive_the_last_replica_standing_losing_its_tail() -> None:
    run(LastReplicaStandingMachine, examples=150)


def test_transactions_keep_the_lso_between_log_start_and_hw_and_below_open_ones() -> None:
    run(TransactionalClusterMachine, examples=100)


def test_an_lso_at_the_hw_exposes_open_transactions() -> None:
    with pytest.raises(AssertionError, match="open transaction starts") as failure:
        run(LsoIgnoresTransactionsMachine, examples=200)
    assert "last events:" in str(failure.value)


@pytest.mark.slow
def test_safe_settings_soak() -> None:
    run(ClusterMachine, examples=5_000)


@pytest.mark.parametrize(
    ("machine", "expected"),
    [
        (HighWatermarkTruncationMachine, "acked value"),
        (UncleanElectionMachine, "acked value"),
        (IsrOfOneMachine, "acked value"),
        (NoEligibleLeaderReplicasMachine, "acked value"),
    ],
)
def test_historic_switch_loses_acked_data(
    machine: type[RuleBasedStateMachine], expected: str
) -> None:
    with pytest.raises(AssertionError, match=expected) as failure:
        run(machine, examples=1_500)
    assert "last events:" in str(failure.value)
