"""The eos workload's copier on the simulator: harness/workloads/eos/client.py's `EosCopier`
over the simulated client (`SimQueueClient` with its group member, harness/sim/group.py, and
its transactional producer, harness/sim/txn.py).

`SimEosCopier` is a `SimQueueClient` whose consumer is a member of the test's group (the
``subscribe`` op) reading at read_committed, and whose ``txn`` op is one copy, as the real
copier's:

1. poll (``_poll_ms``): the records of the input keys the group gave this copier (rebalances
   taken during the poll, as librdkafka serves them);
2. begin, send every value verbatim to the output key paired with its input key, await the
   acks, `send_offsets_to_transaction` (AddOffsetsToTxn, then TxnOffsetCommit with the
   member's generation and id) with the next offset to read of every input key copied,
   commit (EndTxn);
3. anything that goes wrong before the commit aborts the transaction and rewinds the consumer
   to the group's committed offsets (OffsetFetch: Kafka's resetToLastCommittedPositions; a
   client that cannot is given up); a revocation taken during the poll drops the batch the
   same way (``fail`` "rebalanced"). A send_offsets that does not finish in time is a
   ``fail`` ["send-offsets", "timeout"] and the client is given up, a commit that does not is
   ``info``, as the real copier's bounded calls.

Completions are the real copier's: the poll then the sends to the output keys, `producer`,
and the optional ``zombie``; ``ok`` committed, ``fail`` certainly not, ``info`` unknown. A poll
that reads nothing is an ``ok`` op without sends, no transaction begun.

The hint ``_kill`` kills the copier after its sends were acknowledged and before the commit
(``info``, error ``killed``): the client is closed without aborting, the thread goes on as a
new process whose init_transactions (same transactional id) fences it. With the knob
``copier_zombies`` the killed copier lives on as a zombie (`Zombies`, one registry per run,
made by `client_factory`): its member is dropped without LeaveGroup (it times out of the
group) but its producer keeps its connections, producer id and epoch, and open transaction.
When a later copier of the same transactional id has sent a copy and not committed it yet,
and that copy wrote to an output key the zombie wrote to, the zombie sends its copies to
those keys again (its partitions are already in its transaction: no AddPartitionsToTxn, the
old epoch in the batches) and tries to commit (EndTxn with its epoch); the new copier's op
records it under ``zombie`` {process, sends, acked, errors, commit} (or {process, gave-up}
after `ZOMBIE_TRIES` copies without a shared key). A zombie is replaced by a newer one of its
id, dropped when a copier of its id closes (its process ends), and at the end of the run
(`Zombies.drop_all`, whose fates the run reports as the real `drop_zombies`'). The zombie's
calls run in the waking copier's task, as the real ones run in its thread.

Without transactions (``--no-txn``: at-least-once, the workload's control) a copy sends the
values with the copier's plain (idempotent by default) producer, awaits the acks, then commits
the offsets to the group (`SimGroupMember.commit_offsets`: a synchronous consumer commit with
the member's generation), as the real copier's `_commit_offsets`: ``ok`` committed, ``info``
when the commit failed or timed out (the sends happened), a failed send ``fail``/``info`` and
the consumer rewound. A copier killed between the sends and the commit leaves its copies in
the output, and the next copier copies them again from the committed offsets:
``eos-duplicate``, what the control is there to show.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from isrlab.checkers.queue import codec
from isrlab.harness.sim.client import PORT, SimQueueClient, _Delivery
from isrlab.harness.workloads.eos.client import ZOMBIE_TRIES
from isrlab.harness.workloads.eos.options import EosOptions
from isrlab.harness.workloads.queue.client import parse_key

__all__ = ["SimEosCopier", "Zombies", "client_factory"]

Op = dict[str, Any]


class _Zombie:
    """A killed copier's client (its producer inside its transaction) and what it sent."""

    def __init__(self, client: SimEosCopier, process: int, sends: list[tuple[str, Any]]) -> None:
        self.client = client
        self.process = process
        self.sends = sends  # (output key, value)
        self.tries = 0

    def drop(self) -> None:
        """The zombie's producer is gone (librdkafka's purge): its connections closed."""
        conns, self.client._conns = self.client._conns, {}
        for conn in conns.values():
            conn.close()


class Zombies:
    """One run's zombie copiers by transactional id (at most one each), and their fates
    ("woken", "gave-up", "replaced", "closed", "left"), as the real workload's registry."""

    def __init__(self) -> None:
        self.by_id: dict[str, _Zombie] = {}
        self.fates: Counter[str] = Counter()

    def add(self, txn_id: str, zombie: _Zombie) -> None:
        old = self.by_id.pop(txn_id, None)
        self.by_id[txn_id] = zombie
        if old is not None:
            self.fates["replaced"] += 1
            old.drop()

    def close_id(self, txn_id: str) -> None:
        z = self.by_id.pop(txn_id, None)
        if z is not None:
            self.fates["closed"] += 1
            z.drop()

    def drop_all(self) -> dict[str, int]:
        """Drop every zombie (the run is over): how the run's zombies ended."""
        zombies = [self.by_id[k] for k in sorted(self.by_id)]
        self.by_id.clear()
        self.fates["left"] += len(zombies)
        for z in zombies:
            z.drop()
        fates = dict(self.fates)
        self.fates.clear()
        return fates


class SimEosCopier(SimQueueClient):
    """One copier process on the simulator (see the module doc)."""

    def __init__(
        self,
        test: Mapping[str, Any],
        transport: Any,
        bootstrap: Sequence[str],
        process: int,
        node: str | None = None,
        port: int = PORT,
        thread: int | None = None,
        zombies: Zombies | None = None,
    ) -> None:
        # a copier never copies what an aborted or open transaction wrote upstream
        test = {**test, "isolation_level": "read_committed"}
        super().__init__(test, transport, bootstrap, process, node=node, port=port, thread=thread)
        eos = test.get("eos") or {}
        inputs, outputs = list(eos.get("input") or ()), list(eos.get("output") or ())
        if not inputs or len(inputs) != len(outputs):
            raise ValueError("the eos copier needs test['eos'] = {input: [...], output: [...]}")
        self.output_of: dict[str, str] = dict(zip(inputs, outputs, strict=True))
        self.eos_knobs = EosOptions.from_test(test)
        self.zombies = zombies if zombies is not None else Zombies()
        self._zombified = False
        if self.txn is not None:
            # (librdkafka wants message.timeout.ms <= transaction.timeout.ms)
            self.txn.timeout_ms = max(
                self.eos_knobs.transaction_timeout_ms, self.knobs.op_timeout_ms
            )

    @property
    def transactional_id(self) -> str | None:
        return None if self.txn is None else str(self.txn.transactional_id)

    async def invoke(self, op: Mapping[str, Any]) -> Op:
        if op["f"] != "txn" or not self._open or self.group is None:
            return await super().invoke(op)
        base: Op = {k: v for k, v in op.items() if not k.startswith("_")}
        base["node"] = self.node
        poll_s = float(op.get("_poll_ms", self.knobs.poll_ms)) / 1000
        done = await self._copy(base, poll_s, bool(op.get("_kill")))
        return self.group.with_rebalance(done)  # type: ignore[no-any-return]

    def _revoked(self) -> int:
        pending = self.group.pending
        return 0 if pending is None else len(pending["revoked"])

    # ----- one copy -------------------------------------------------------------------------

    async def _copy(self, op: Op, poll_s: float, kill: bool) -> Op:
        if not self.group.subscribed:
            return {**op, "type": "fail", "error": "not-subscribed"}
        revoked_before = self._revoked()
        reads = await self._poll(poll_s, {})
        poll = codec.poll_result(reads)
        records = [(k, o, v) for k, pairs in reads.items() for o, v in pairs]
        if not records:
            return {**op, "type": "ok", "value": [poll]}
        if self._revoked() > revoked_before:
            # part of the batch may belong to another member now: copy nothing
            await self._rewind()
            return {**op, "type": "fail", "value": [poll], "error": "rebalanced"}
        bad = [k for k, _o, _v in records if k not in self.output_of]
        if bad:
            await self._rewind()
            return {**op, "type": "fail", "value": [poll], "error": ["not-an-input-key", bad[0]]}
        mops = [codec.send(self.output_of[k], v) for k, _o, v in records]
        out: list[Any] = [list(m) for m in mops]
        offsets: dict[str, int] = {}
        for k, o, _v in records:
            if o is not None:
                offsets[k] = max(offsets.get(k, 0), o + 1)
        deadline = self._loop_time() + self.op_timeout
        errors: list[Any] = []
        zombie: Op = {}
        if self.txn is not None:
            verdict = await self._txn_copy(mops, out, offsets, deadline, kill, errors, zombie)
        else:
            verdict = await self._plain_copy(mops, out, offsets, deadline, kill, errors)
        if verdict == "killed":
            if self.eos_knobs.copier_zombies and self.txn is not None:
                self._become_zombie(mops)
            else:
                await self.close()
            verdict = "info"
            errors.append("killed")
        elif verdict != "ok":
            await self._rewind()
        result: Op = {**op, "type": verdict, "value": [poll, *out]}
        if errors:
            result["error"] = errors[0] if len(errors) == 1 else errors
        result["producer"] = {
            "id": self._pid,
            "epoch": self._epoch,
            "idempotent": self.idempotent or self.txn is not None,
            "transactional_id": self.transactional_id or "",
        }
        if zombie:
            result["zombie"] = zombie
        return result

    async def _txn_copy(
        self,
        mops: list[Any],
        out: list[Any],
        offsets: dict[str, int],
        deadline: float,
        kill: bool,
        errors: list[Any],
        zombie: Op,
    ) -> str:
        """Send the copies and commit them with the offsets: "ok", "fail", "info" or
        "killed" (the caller drops the client)."""
        txn = self.txn
        if txn.fatal is not None:
            # begin_transaction raises the fatal error
            errors.append(txn.fatal)
            self.broken = True
            return "fail" if txn.fatal_definite else "info"
        txn._begin()
        verdict, errs = await txn._send_run(mops, out, 0, len(mops), deadline)
        errors += errs
        if verdict != "ok":
            return await txn._abort(errors)  # type: ignore[no-any-return]
        if kill:
            return "killed"
        if self.eos_knobs.copier_zombies:
            zombie.update(await self._wake_zombie(mops, deadline))
        left = max(0.1, self._left(deadline))
        err = await txn.send_offsets_to_transaction(offsets, self.group, self._loop_time() + left)
        if err == "timed-out":
            # nothing will commit this transaction, but this client cannot abort it
            errors.append(["send-offsets", "timeout"])
            self.broken = True
            return "fail"
        if err is not None:
            errors.append(err)
            return await txn._abort(errors)  # type: ignore[no-any-return]
        left = max(0.1, self._left(deadline))
        return await txn._commit(self._loop_time() + left, errors)  # type: ignore[no-any-return]

    async def _plain_copy(
        self,
        mops: list[Any],
        out: list[Any],
        offsets: dict[str, int],
        deadline: float,
        kill: bool,
        errors: list[Any],
    ) -> str:
        """At-least-once (no transactions): send the copies, await the acks, then commit the
        offsets to the group (a synchronous consumer commit): "ok", "fail" or "info" (a send
        that may have happened is not undone; the sends happened whatever becomes of the
        commit), or "killed" between the sends and the commit."""
        verdict, errs = await self._send_run(mops, out, 0, len(mops), deadline)
        errors += errs
        if verdict != "ok":
            return verdict
        if kill:
            return "killed"
        left = max(0.1, self._left(deadline))
        kind, error = await self.group.commit_offsets(offsets, self._loop_time() + left)
        if kind == "ok":
            return "ok"
        errors.append(error)
        if kind == "info" and error != ["commit", "timeout"]:
            self.broken = True  # (as the real copier: a commit refused for an unknown reason)
        return "info"

    async def _rewind(self) -> None:
        """Every assigned input key back to the group's committed offset (the log start where
        the group has none); a client that cannot is given up (`broken`)."""
        if not self.assigned:
            return
        keys = sorted(self.assigned)
        limit = self._loop_time() + min(self.op_timeout, self.request_timeout)
        got = await self.group.committed(keys, limit)
        if set(got) != set(keys):
            self.broken = True
        for k, off in got.items():
            if k in self.assigned:
                self.positions[k] = off

    # ----- zombies --------------------------------------------------------------------------

    def _become_zombie(self, mops: list[Any]) -> None:
        """Hand this copier's producer, inside its transaction, to a zombie; the member is
        dropped (it times out of the group), the connections stay with the producer."""
        txn_id = self.transactional_id
        assert txn_id is not None
        self._zombified = True
        self._open = False
        self.group.drop()
        self.assigned = set()
        self.positions = {}
        self.zombies.add(txn_id, _Zombie(self, self.process, [(k, v) for _f, k, v in mops]))

    async def close(self) -> None:
        """Drop the client, and the zombie of this copier's transactional id (nothing of its
        id may write after its process ends); a zombie's own client keeps its producer."""
        if self._zombified:
            self._open = False
            return
        await super().close()
        if self.transactional_id:
            self.zombies.close_id(self.transactional_id)

    async def _wake_zombie(self, mops: list[Any], deadline: float) -> Op:
        """The zombie of this copier's transactional id, if any, sends its copies to the
        output keys this copy wrote to, then tries to commit: what happened, or {}."""
        txn_id = self.transactional_id
        if not txn_id:
            return {}
        z = self.zombies.by_id.get(txn_id)
        if z is None:
            return {}
        keys = {k for _f, k, _v in mops}
        sends = [(k, v) for k, v in z.sends if k in keys]
        z.tries += 1
        if not sends and z.tries < ZOMBIE_TRIES:
            return {}
        del self.zombies.by_id[txn_id]
        self.zombies.fates["woken" if sends else "gave-up"] += 1
        if not sends:
            z.drop()
            return {"process": z.process, "gave-up": True}
        zt = z.client.txn
        by_tp: dict[tuple[str, int], list[bytes]] = {}
        count: dict[tuple[str, int], int] = {}
        for k, v in sends:
            tp = parse_key(k)
            by_tp.setdefault(tp, []).append(str(v).encode())
            count[tp] = count.get(tp, 0) + 1
        loop = asyncio.get_running_loop()
        # its partitions are in its transaction already: no AddPartitionsToTxn is sent
        adding = loop.create_task(zt._add_partitions(sorted(by_tp), deadline))
        tasks = {
            tp: loop.create_task(zt._deliver(tp, values, deadline, adding))
            for tp, values in sorted(by_tp.items())
        }
        await asyncio.wait(list(tasks.values()), timeout=max(0.001, self._left(deadline)))
        if not adding.done():
            adding.cancel()
        acked = 0
        errs: set[str] = set()
        for tp, task in tasks.items():
            if task.done():
                d: _Delivery = task.result()
            else:
                task.cancel()
                d = _Delivery("info", error="timeout")
            if d.outcome == "ok":
                acked += count[tp]
            elif d.error:
                errs.add(str(d.error))
        if zt.fatal is not None:
            commit = str(zt.fatal)
        elif zt.abortable is not None:
            commit = str(zt.abortable)
        else:
            end = max(0.1, self._left(deadline))
            err = await zt._end_txn(commit=True, deadline=self._loop_time() + end)
            commit = "ok" if err is None else ("timeout" if err == "timed-out" else str(err))
        z.drop()
        return {
            "process": z.process,
            "sends": [list(codec.send(k, v)) for k, v in sends],
            "acked": acked,
            "errors": sorted(errs),
            "commit": commit,
        }


def client_factory(
    test: Mapping[str, Any], net: Any, nodes: Sequence[str], workload: Any, zombies: Zombies
) -> Callable[[int, int], SimQueueClient]:
    """client_factory(process, thread) for the simulated interpreter, by role as the real
    eos `client_factory`: copiers a `SimEosCopier` (sharing the run's `zombies`), producers
    and readers a non-transactional `SimQueueClient` (readers at the test's isolation
    level), and once the workload drains a read_committed `SimQueueClient`."""
    names = list(nodes)
    plain = {**test, "txn": False}
    drain = {**plain, "isolation_level": "read_committed", "watermark_p": 0.0}
    by_role: dict[str, Callable[[int, int], SimQueueClient]] = {
        "producer": SimQueueClient.factory(plain, net, names),
        "reader": SimQueueClient.factory(plain, net, names),
        "drain": SimQueueClient.factory(drain, net, names),
    }

    def copier(process: int, thread: int) -> SimQueueClient:
        i = thread % len(names)
        return SimEosCopier(
            test,
            net.host(f"client{thread}"),
            names[i:] + names[:i],
            process,
            node=names[i],
            thread=thread,
            zombies=zombies,
        )

    by_role["copier"] = copier

    def make(process: int, thread: int) -> SimQueueClient:
        role = "drain" if workload.draining else workload.role(thread)
        return by_role[role](process, thread)

    return make
