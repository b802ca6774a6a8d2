"""Targeted schedules: faults that watch the cluster and go for the sequences known to lose data.

Random schedules rarely line up the dangerous sequences (the published matrix needed 150-s runs
and shortened timers before min ISR 1 or unclean election lost anything). Each fault here reads
the partition's state znode in ZooKeeper (leader, ISR, leader epoch: ``db.partition_state``,
what the controller last wrote), waits for the state it needs, and only then strikes. Each is a
``start-<kind>`` / ``stop-<kind>`` pair like any fault; the completion records what was seen and
done, so a run's history says which sequence happened.

``isr-squeeze`` (``{"key", "to": "min" | "leader", "then": "kill" | "isolate" | "power",
"wait_s"}``)
    SIGSTOP in-sync followers of the key's partition, one more than the ISR may lose (``to``
    ``min``: down to min.insync.replicas; ``leader``: every follower), wait (up to ``wait_s``,
    default three times replica.lag.time.max.ms) until the state znode shows the ISR shrunk to
    that size, then fail the leader (kill -9; cut it off from every node; or ``power``: kill -9
    and its files cut back to their last fsync, the ``power`` nemesis's cut) and SIGCONT the
    followers. With the ISR at its smallest the leader acknowledges writes nobody else holds:
    min ISR 1 ("ISR of one") and unclean election lose them when it fails; the safe settings
    keep the partition offline or elect only a replica that has them. With ``power`` the
    leader, last ISR member, loses its unflushed tail (KIP-966's "last replica standing"):
    without eligible leader replicas it is elected again when it returns and its followers
    truncate to it; with them a follower that left the ISR when it fell below min ISR leads.
    ``stop`` starts the killed leader again or heals the isolation.
``leader-flap`` (``{"key", "gap_ms", "follower": "restart" | "cut" | "diverge"}``)
    Two leader changes in quick succession. ``restart`` (the default; KIP-279's scenario):
    kill -9 the leader, wait for the controller to elect another (the state znode's leader
    changes), restart one follower (kill -9 and start) right away, wait ``gap_ms`` (default
    500), and kill -9 the second leader too, while the restarted follower truncates against
    leaders that keep changing. ``cut`` (KIP-101's scenario 1 under a live workload): with
    leader A and in-sync followers B and C, cut B and C off from each other only (both ways,
    black-hole routes as the ``partition`` nemesis makes them; both still reach A, ZooKeeper
    and the controller), kill -9 A, wait until the state znode names the next leader (B, say:
    the first assigned live ISR member), wait ``gap_ms`` and kill -9 B. C, following B
    without reaching it, stays in the ISR (B would drop it only after
    replica.lag.time.max.ms; dead, it never does), and the controller elects it once B's
    ZooKeeper session ends. Pre-KIP-101 (``replica.truncation.mode=high-watermark``) C cut its
    log back to its own high watermark when it began following B; that HW lags A's by up to
    a fetch round trip (a follower learns the HW in the next fetch response, which the leader
    parks until new data or replica.fetch.wait.max.ms), so records A had acknowledged are
    gone from the new leader and, once A and B follow it, from every replica. With leader
    epochs C truncates only on B's answer to OffsetsForLeaderEpoch, which never comes: it
    leads with everything it had. The completion names the ``cut`` pair, the ``leaders`` and
    ``epochs`` seen, ``isr_at_second_kill`` and the ``truncating`` follower; it is an
    ``error`` (no second kill) when the elected replica is not one of the pair.
    ``diverge`` (KIP-279's scenario under a live workload; ``lag_ms`` default 500,
    ``lead_ms`` default the larger of ``gap_ms`` and 1500): with leader A and in-sync
    followers B (the next in the controller's election order: the assigned replicas, read
    from the topic znode) and C, cut B and C off from each other, SIGSTOP B for ``lag_ms``
    (C fetches A's last records, B does not), kill -9 A and resume B. B leads the next epoch
    and appends the clients' retries at offsets where C holds A's records; ``lead_ms`` later
    B is killed and C, which never reached B, is elected. Then the cut is healed and B
    started again: it follows C and asks it (OffsetsForLeaderEpoch) where B's epoch ends. C
    never had that epoch. KIP-101 as first shipped (``replica.truncation.mode=
    leader-epoch-v0``) takes C's answer, the start of C's own epoch, as the truncation point
    whatever epoch it belongs to, so B keeps its records below it, fetches on from there and
    rejoins the ISR with a log that differs from C's below the high watermark. Once B is
    back in the ISR, C is killed too: B leads and serves its own records at offsets readers
    saw with C's (``inconsistent-offsets``, ``committed-truncation``). With KIP-279
    (``leader-epoch``) B learns C's largest epoch below its own and truncates to that
    epoch's end: nothing differs. The completion names the ``cut`` pair, the ``lagging``
    follower, the ``leaders``, ``epochs`` and ``isr_at_third_kill``; an ``error`` says which
    step did not happen. ``stop`` heals the cut (``cut``), then starts every broker it
    killed.
``zk-cut`` (``{"key", "pause_follower"}``)
    cut the key's leader off from ZooKeeper only (``iptables`` OUTPUT DROP of TCP to the
    ZooKeeper client port on the leader's node, in our own chain ``ISRLAB-ZKCUT``): followers
    and clients still reach it, but its ISR changes and its ZooKeeper session cannot. With
    ``pause_follower`` (default true) one in-sync follower is SIGSTOPped too, so the leader
    tries to shrink its ISR while it cannot write the state znode and its session expires
    behind its back. ``stop`` removes the rule and resumes the follower.

``late-produce`` (``{"key", "hold_s", "release_s", "client"}``, the hazard KIP-890 closed)
    hold back the clients' requests to the key's leader and deliver them after their
    transactions were aborted. On the leader's node, in our own chain ``ISRLAB-LATE`` (jumped
    to from INPUT), TCP from the clients' address (``client``, default the address the
    harness's SSH session comes from, ``$SSH_CLIENT``: the clients run on the control host) to
    the broker port is dropped: replicas, ZooKeeper and the transaction coordinators (other
    brokers, or the leader itself) still reach it; only the clients cannot. A transactional
    producer whose produce request to the leader is caught times out
    (``op_timeout_ms``, its message.timeout.ms), aborts (EndTxn to its coordinator, which
    writes the abort marker to the leader) and bumps its epoch, but the request stays in its
    kernel's send queue, retransmitted with exponential backoff (200 ms, doubling: 12.6 s after
    it was first sent, then 25.4 s). After ``hold_s`` (default ``op_timeout_ms`` + 2.5 s: just
    before the 12.6-s retransmission of requests caught at the start, after their aborts) the
    rule becomes DROP of new connections only (``--syn``) for ``release_s`` (default 3): the
    held requests get through on their old connections, while the producers cannot open new
    ones and write their next transaction there first. Then the chain is removed. Without
    KIP-890 verification (``transaction.partition.verification.enable=false``) the late batch
    (old epoch, the sequence that follows) is appended after the abort marker and opens a
    transaction no coordinator knows: the partition's LSO stays below it until the producer's
    next marker there; a commit marker commits the aborted record (``G1a``), and a hang that
    outlives the workload leaves acknowledged records unread (``unseen``). With verification
    the partition asks the coordinator and refuses the batch. The whole sequence runs in
    ``start`` (its completion names the ``key``, ``leader``, ``leader_epoch``, ``client``,
    ``port``, ``held_s``, ``released_s`` and ``leader_after``); ``stop`` removes a chain left
    behind (``start`` failed midway).

A fault that finds no leader, or no follower to act on, completes with ``error`` and does
nothing. ``heal()`` of each undoes what it may have left (rules, paused and dead brokers).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

from isrlab.nemeses.base import BROKER_PORT, ClusterDB, default_key
from isrlab.nemeses.partition import PartitionFault
from isrlab.nemeses.process import KillFault, PauseFault

ZK_CLIENT_PORT = 2181
ZKCUT_CHAIN = "ISRLAB-ZKCUT"
LATE_CHAIN = "ISRLAB-LATE"
POLL_S = 0.25


def _split(key: str) -> tuple[str, int]:
    topic, _, part = key.rpartition("/")
    return topic, int(part)


class _Watching:
    """What the targeted faults share: the db, a clock and the state znode polls."""

    def __init__(
        self,
        db: ClusterDB,
        rng: random.Random,
        sleep: Callable[[float], None] | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.db = db
        self.rng = rng
        self._sleep = sleep or time.sleep
        self._clock = clock or time.monotonic
        self._kills = KillFault(db, rng)
        self._pauses = PauseFault(db, rng)

    def state(self, key: str) -> tuple[str | None, list[str], int] | None:
        try:
            return self.db.partition_state(*_split(key))
        except Exception:
            return None

    def wait_for(
        self, key: str, done: Callable[[tuple[str | None, list[str], int]], bool], wait_s: float
    ) -> tuple[tuple[str | None, list[str], int] | None, float]:
        """Poll the state znode until `done(state)` or `wait_s`; (last state, seconds waited)."""
        start = self._clock()
        state = self.state(key)
        while (state is None or not done(state)) and self._clock() - start < wait_s:
            self._sleep(POLL_S)
            state = self.state(key)
        return state, round(self._clock() - start, 3)

    def kill(self, node: str) -> bool:
        if self.db.kill(node):
            self._kills.killed.add(node)
            return True
        return False

    def pause(self, nodes: list[str]) -> list[str]:
        hit = [n for n in nodes if self.db.pause(n)]
        self._pauses.paused.update(hit)
        return hit

    def resume(self, nodes: list[str]) -> None:
        for n in nodes:
            self.db.resume(n)
            self._pauses.paused.discard(n)

    def heal(self) -> list[str]:
        """Resume the brokers this fault paused and start those it killed (only those: the
        pause and kill faults' own heal, which heal_all runs too, covers every node)."""
        paused = sorted(self._pauses.paused)
        self.resume(paused)
        killed = sorted(self._kills.killed)
        for node in killed:
            self.db.start(node)
        self._kills.killed.clear()
        return sorted(set(paused) | set(killed))


class IsrSqueezeFault(_Watching):
    kind = "isr-squeeze"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._isolation = PartitionFault(self.db, self.rng, "route")
        self._isolated = False

    def start(self, value: Any) -> dict[str, Any]:
        value = value or {}
        key = str(value.get("key") or default_key(self.db))
        to = str(value.get("to", "min"))
        then = str(value.get("then", "kill"))
        test = self.db.test
        lag_ms = int(test.get("replica_lag_time_max_ms") or 10000)
        wait_s = float(value.get("wait_s", 3 * lag_ms / 1000))
        state = self.state(key)
        leader, isr, epoch = state or (None, [], -1)
        if leader is None:
            return {"key": key, "error": "no leader in the state znode"}
        target = 1 if to == "leader" else max(1, int(test.get("min_insync_replicas") or 1))
        followers = [n for n in isr if n != leader]
        victims = self.rng.sample(followers, max(0, len(isr) - target))
        out: dict[str, Any] = {
            "key": key,
            "to": to,
            "then": then,
            "leader": leader,
            "leader_epoch": epoch,
            "isr_before": isr,
        }
        if not victims:
            return {**out, "error": f"the ISR {isr} is already at {target}: nothing to squeeze"}
        paused = self.pause(victims)
        try:
            seen, waited = self.wait_for(
                key,
                lambda s: s[0] == leader and len(s[1]) <= target,
                wait_s,
            )
            out.update(paused=paused, waited_s=waited, isr_at_failure=seen[1] if seen else None)
            if seen is None or seen[0] != leader or len(seen[1]) > target:
                return {**out, "error": f"the ISR did not shrink to {target} in {wait_s} s"}
            if then == "isolate":
                out["isolated"] = self._isolation.start({"shape": "isolate-leader", "key": key})
                self._isolated = True
            else:
                out["killed"] = leader if self.kill(leader) else None
                if then == "power" and out["killed"] is not None:
                    try:  # before the followers resume: the leader is down, its files cut
                        out["power_loss"] = self.db.power_loss(leader)  # type: ignore[attr-defined]
                    except Exception as e:
                        out["error"] = f"power loss of {leader}: {type(e).__name__}: {e}"
        finally:
            self.resume(paused)
        return out

    def stop(self, value: Any = None) -> dict[str, Any]:
        out: dict[str, Any] = self._kills.stop(value)
        if self._isolated:
            out["healed"] = self._isolation.stop(None)
            self._isolated = False
        return out

    def heal(self) -> list[str]:
        self._isolated = False
        return sorted(set(super().heal()) | set(self._isolation.heal()))


class LeaderFlapFault(_Watching):
    kind = "leader-flap"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._cut = PartitionFault(self.db, self.rng, "route")
        self._cutting = False

    def start(self, value: Any) -> dict[str, Any]:
        value = value or {}
        key = str(value.get("key") or default_key(self.db))
        gap_ms = int(value.get("gap_ms", 500))
        wait_s = float(value.get("wait_s", 30))
        follower = str(value.get("follower", "restart"))
        state = self.state(key)
        first, isr, epoch = state or (None, [], -1)
        if first is None:
            return {"key": key, "error": "no leader in the state znode"}
        out: dict[str, Any] = {"key": key, "gap_ms": gap_ms, "leaders": [first], "epochs": [epoch]}
        if follower == "cut":
            out["follower"] = "cut"
            return self._flap_with_a_cut(key, first, isr, gap_ms, wait_s, out)
        if follower == "diverge":
            out["follower"] = "diverge"
            return self._flap_to_diverge(key, first, isr, value, wait_s, out)
        if len(isr) < 2:
            return {**out, "error": f"the ISR {isr} has no follower to take over"}
        self.kill(first)
        seen, waited = self.wait_for(key, lambda s: s[0] not in (None, first), wait_s)
        if seen is None or seen[0] in (None, first):
            return {**out, "error": f"no new leader within {wait_s} s"}
        second = seen[0]
        out["leaders"].append(second)
        out["epochs"].append(seen[2])
        restarted = [n for n in seen[1] if n not in (first, second)]
        if restarted:
            follower = self.rng.choice(restarted)
            self.db.kill(follower)
            self.db.start(follower)
            out["restarted"] = follower
        return self._kill_the_second(key, second, gap_ms, wait_s, waited, out)

    def _kill_the_second(
        self, key: str, second: str, gap_ms: int, wait_s: float, waited: float, out: dict[str, Any]
    ) -> dict[str, Any]:
        """Both ways' end: ``gap_ms`` after the second leader was named, kill it too and
        record who leads next."""
        self._sleep(gap_ms / 1000)
        self.kill(second)
        third, waited2 = self.wait_for(key, lambda s: s[0] not in (None, second), wait_s)
        out["waited_s"] = round(waited + waited2, 3)
        if third is not None and third[0] is not None:
            out["leaders"].append(third[0])
            out["epochs"].append(third[2])
        return out

    def _flap_with_a_cut(
        self, key: str, first: str, isr: list[str], gap_ms: int, wait_s: float, out: dict[str, Any]
    ) -> dict[str, Any]:
        """``follower: cut``: two in-sync followers cut off from each other (and only from
        each other), the leader killed; the one elected next is killed at once, so the other,
        which followed it without reaching it, is elected with the log it truncated."""
        followers = [n for n in isr if n != first]
        if len(followers) < 2:
            return {**out, "error": f"the ISR {isr} has no two followers to cut apart"}
        pair = sorted(self.rng.sample(followers, 2))
        b, c = pair
        out["cut"] = pair
        self._cutting = True
        self._cut.start({"grudge": {b: [c], c: [b]}})
        self.kill(first)
        seen, waited = self.wait_for(key, lambda s: s[0] not in (None, first), wait_s)
        out["waited_s"] = waited
        if seen is None or seen[0] in (None, first):
            return {**out, "error": f"no new leader within {wait_s} s"}
        second = seen[0]
        out["leaders"].append(second)
        out["epochs"].append(seen[2])
        out["isr_at_second_kill"] = seen[1]
        if second not in pair:
            return {**out, "error": f"{second} was elected, not one of the cut pair {pair}"}
        # the other one of the pair now follows `second`, which it cannot reach: it
        # truncated (or, with leader epochs, asks and waits) and stays in the ISR until
        # `second` would drop it (replica.lag.time.max.ms), long after `second` is dead
        out["truncating"] = c if second == b else b
        return self._kill_the_second(key, second, gap_ms, wait_s, waited, out)

    def _succession(self, key: str, isr: list[str]) -> list[str]:
        """The ISR in the order the controller elects from: the partition's assigned replicas
        (``db.assignment``, the topic znode) where the db can read them, else the ISR's."""
        assignment = getattr(self.db, "assignment", None)
        if assignment is not None:
            try:
                order = list(assignment(*_split(key)))
            except Exception:
                order = []
            ranked = [n for n in order if n in isr]
            if len(ranked) == len(isr):
                return ranked
        return list(isr)

    def _flap_to_diverge(
        self,
        key: str,
        first: str,
        isr: list[str],
        value: dict[str, Any],
        wait_s: float,
        out: dict[str, Any],
    ) -> dict[str, Any]:
        """``follower: diverge`` (KIP-279's scenario under a live workload): B, the follower
        the controller elects next, is made to lag C, the other follower, and the two are cut
        off from each other; the leader A dies, B leads an epoch and appends at offsets where
        C holds A's records; B dies, C leads; B comes back and follows C, and once it is in
        the ISR again C dies, so B leads and serves whatever it kept."""
        lag_ms = int(value.get("lag_ms", 500))
        lead_ms = int(value.get("lead_ms", max(int(value.get("gap_ms", 500)), 1500)))
        followers = [n for n in self._succession(key, isr) if n != first]
        if len(followers) != 2:
            return {**out, "error": f"the ISR {isr} has not exactly two followers"}
        b, c = followers
        out.update(cut=sorted(followers), lagging=b, lag_ms=lag_ms, lead_ms=lead_ms)
        self._cutting = True
        self._cut.start({"grudge": {b: [c], c: [b]}})
        # B stops fetching for lag_ms while C goes on: C holds the leader's last records, B not
        paused = self.pause([b])
        try:
            self._sleep(lag_ms / 1000)
            self.kill(first)
        finally:
            self.resume(paused)
        seen, waited = self.wait_for(key, lambda s: s[0] not in (None, first), wait_s)
        out["waited_s"] = waited
        if seen is None or seen[0] != b:
            elected = None if seen is None else seen[0]
            return {**out, "error": f"{elected} was elected, not the lagging follower {b}"}
        out["leaders"].append(b)
        out["epochs"].append(seen[2])
        # B leads (its own epoch's records at the offsets where C has the old leader's),
        # C asks B where to truncate and never hears back
        self._sleep(lead_ms / 1000)
        self.kill(b)
        seen, waited2 = self.wait_for(key, lambda s: s[0] not in (None, b), wait_s)
        out["waited_s"] = round(waited + waited2, 3)
        if seen is None or seen[0] != c:
            elected = None if seen is None else seen[0]
            return {**out, "error": f"{elected} was elected after {b}, not {c}"}
        out["leaders"].append(c)
        out["epochs"].append(seen[2])
        # B back, following C (OffsetsForLeaderEpoch decides what it keeps), until in sync
        out["healed"] = self._cut.stop(None)
        self._cutting = False
        self.db.start(b)
        self._kills.killed.discard(b)
        seen, waited3 = self.wait_for(key, lambda s: s[0] == c and b in s[1], wait_s)
        out["waited_s"] = round(waited + waited2 + waited3, 3)
        if seen is None or b not in seen[1]:
            return {**out, "error": f"{b} did not rejoin {c}'s ISR within {wait_s} s"}
        out["isr_at_third_kill"] = seen[1]
        # readers see C's records below the HW; then C dies and B serves its own
        self._sleep(lag_ms / 1000)
        self.kill(c)
        seen, waited4 = self.wait_for(key, lambda s: s[0] not in (None, c), wait_s)
        out["waited_s"] = round(waited + waited2 + waited3 + waited4, 3)
        if seen is not None and seen[0] is not None:
            out["leaders"].append(seen[0])
            out["epochs"].append(seen[2])
        return out

    def stop(self, value: Any = None) -> dict[str, Any]:
        healed = None
        if self._cutting:  # the cut first, so the brokers started again find their peers
            healed = self._cut.stop(None)
            self._cutting = False
        out: dict[str, Any] = self._kills.stop(value)
        if healed is not None:
            out["healed"] = healed
        return out

    def heal(self) -> list[str]:
        self._cutting = False
        cut = self._cut.heal()
        return sorted(set(cut) | set(super().heal()))


class ZkCutFault(_Watching):
    kind = "zk-cut"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cut: set[str] = set()

    def start(self, value: Any) -> dict[str, Any]:
        value = value or {}
        key = str(value.get("key") or default_key(self.db))
        state = self.state(key)
        leader, isr, epoch = state or (None, [], -1)
        if leader is None:
            return {"key": key, "error": "no leader in the state znode"}
        self.db.remote(leader).exec(
            f"iptables -w -N {ZKCUT_CHAIN} 2>/dev/null || true; "
            f"iptables -w -C OUTPUT -j {ZKCUT_CHAIN} 2>/dev/null || "
            f"iptables -w -I OUTPUT -j {ZKCUT_CHAIN}; "
            f"iptables -w -A {ZKCUT_CHAIN} -p tcp --dport {ZK_CLIENT_PORT} -j DROP"
        )
        self.cut.add(leader)
        out: dict[str, Any] = {"key": key, "leader": leader, "leader_epoch": epoch, "isr": isr}
        followers = [n for n in isr if n != leader]
        if value.get("pause_follower", True) and followers:
            out["paused"] = self.pause([self.rng.choice(followers)])
        return out

    def stop(self, value: Any = None) -> dict[str, Any]:
        nodes = sorted(self.cut)
        for node in nodes:
            _uncut(self.db, node)
        self.cut.clear()
        paused = sorted(self._pauses.paused)
        self.resume(paused)
        return {"nodes": nodes, "resumed": paused}

    def heal(self) -> list[str]:
        healed = [n for n in self.db.names if _uncut(self.db, n)]
        self.cut.clear()
        return sorted(set(healed) | set(super().heal()))


class LateProduceFault(_Watching):
    kind = "late-produce"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cut: set[str] = set()

    def client_address(self, node: str) -> str:
        """The address the harness (and so its clients) reaches `node` from: the SSH session's
        peer (``$SSH_CLIENT``; under sudo, which drops it, the peer of an established
        connection to port 22). Empty when the node cannot tell."""
        res = self.db.remote(node).exec(
            'c="${SSH_CLIENT%% *}"; '
            "if [ -z \"$c\" ]; then c=$(ss -Htn state established '( sport = :22 )' "
            "2>/dev/null | awk 'NR==1 {print $4}'); c=\"${c%:*}\"; fi; "
            'echo "client=$c"',
            check=False,
        )
        for line in (res.stdout or "").splitlines():
            if line.startswith("client="):
                return line[len("client=") :].strip().strip("[]")
        return ""

    def _hold(self, node: str, client: str, port: int) -> None:
        """Drop every packet of the clients to the broker port of `node`."""
        self.db.remote(node).exec(
            f"iptables -w -N {LATE_CHAIN} 2>/dev/null || true; "
            f"iptables -w -C INPUT -j {LATE_CHAIN} 2>/dev/null || "
            f"iptables -w -I INPUT -j {LATE_CHAIN}; "
            f"iptables -w -A {LATE_CHAIN} -p tcp -s {client} --dport {port} -j DROP"
        )

    def _release(self, node: str, client: str, port: int) -> None:
        """Drop only the clients' new connections (SYN) to `node`: first add that rule, then
        delete the one that dropped everything, so no new connection slips through between."""
        self.db.remote(node).exec(
            f"iptables -w -A {LATE_CHAIN} -p tcp -s {client} --dport {port} --syn -j DROP; "
            f"iptables -w -D {LATE_CHAIN} -p tcp -s {client} --dport {port} -j DROP"
        )

    def start(self, value: Any) -> dict[str, Any]:
        value = value or {}
        key = str(value.get("key") or default_key(self.db))
        op_timeout_s = int(self.db.test.get("op_timeout_ms") or 10000) / 1000
        hold_s = float(value.get("hold_s", op_timeout_s + 2.5))
        release_s = float(value.get("release_s", 3.0))
        port = int(value.get("port", BROKER_PORT))
        state = self.state(key)
        leader, isr, epoch = state or (None, [], -1)
        if leader is None:
            return {"key": key, "error": "no leader in the state znode"}
        out: dict[str, Any] = {"key": key, "leader": leader, "leader_epoch": epoch, "isr": isr}
        client = str(value.get("client") or self.client_address(leader))
        if not client:
            return {**out, "error": f"{leader} cannot tell the clients' address (no $SSH_CLIENT)"}
        out.update(client=client, port=port)
        self.cut.add(leader)
        try:
            # 1. hold: every packet of the clients to the leader's broker port is dropped
            self._hold(leader, client, port)
            started = self._clock()
            self._sleep(hold_s)
            out["held_s"] = round(self._clock() - started, 3)
            # 2. release: the held requests get through on their open connections, new ones not
            self._release(leader, client, port)
            released = self._clock()
            self._sleep(release_s)
            out["released_s"] = round(self._clock() - released, 3)
        finally:
            # 3. heal (if this fails, stop and heal remove the chain)
            if _uncut(self.db, leader, LATE_CHAIN, "INPUT"):
                self.cut.discard(leader)
        after = self.state(key)
        out["leader_after"] = after[0] if after else None
        return out

    def stop(self, value: Any = None) -> dict[str, Any]:
        nodes = sorted(self.cut)
        for node in nodes:
            _uncut(self.db, node, LATE_CHAIN, "INPUT")
        self.cut.clear()
        return {"nodes": nodes}

    def heal(self) -> list[str]:
        healed = [n for n in self.db.names if _uncut(self.db, n, LATE_CHAIN, "INPUT")]
        self.cut.clear()
        return healed


def _uncut(db: ClusterDB, node: str, chain: str = ZKCUT_CHAIN, hook: str = "OUTPUT") -> bool:
    """Remove our `chain` and its jump from `hook` on `node`; True if there was one."""
    res = db.remote(node).exec(
        f"if iptables -w -L {chain} -n >/dev/null 2>&1; then "
        f"iptables -w -F {chain}; "
        f"while iptables -w -D {hook} -j {chain} 2>/dev/null; do :; done; "
        f"iptables -w -X {chain}; echo removed; fi",
        check=False,
    )
    return "removed" in (res.stdout or "")
