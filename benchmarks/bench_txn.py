"""Transactional produce on three brokers, next to idempotent produce in the same run (issue 14).

ZooKeeper and three brokers on 127.0.0.1-3 of this machine (benchmarks/_cluster.py); the topics
have 3 partitions, replication factor 3 and min.insync.replicas 2; __transaction_state has
Kafka's defaults (50 partitions, replication factor 3, min ISR 2); every producer is
confluent-kafka with acks=all.

- Throughput: 100-byte records, spread round-robin over the 3 partitions. A transactional
  producer runs begin, 100 produce (--txn-records), commit, for --transactions transactions;
  the baseline is an idempotent producer (enable.idempotence=true, no transactional.id) sending the same number of
  records, then flush(). Both keep their clients across --rounds alternating rounds; the figure
  is each one's median records/s. Target (issue 14): transactional >= 0.5x idempotent.
- Commit latency: transactions of --latency-records records (one per partition) started on a
  fixed schedule of --rate transactions/s for --latency-seconds, spread over --latency-producers
  transactional producers (a transaction starts when it is due, or as soon as a producer is
  free); the latency is begin_transaction to commit_transaction returning. The baseline is the
  same schedule and records sent by idempotent producers, latency from the first produce to
  flush() returning (every record acknowledged).

Afterwards a read_committed consumer counts the transactional topic: every committed record,
nothing else.

    flock /tmp/isrlab-cluster.lock python benchmarks/bench_txn.py [--quick]
        [--transactions 500] [--txn-records 100] [--rounds 3] [--rate 100] [--latency-seconds 20]

(the brokers listen on 127.0.0.1-3, shared with the cluster tests: hold the lock while it runs)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from confluent_kafka import (  # noqa: E402
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.progress import (  # noqa: E402
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)

from benchmarks._cluster import progress, running_cluster  # noqa: E402

PARTITIONS = 3
TXN_TOPIC = "bench-txn"
IDEM_TOPIC = "bench-idem"
VALUE = b"v" * 100


class Failures:
    """Delivery reports of failed records (only errors are reported)."""

    def __init__(self) -> None:
        self.errors: list[Any] = []

    def __call__(self, err: Any, _msg: Any) -> None:
        if err is not None:
            self.errors.append(err)

    def check(self, what: str) -> None:
        if self.errors:
            raise RuntimeError(
                f"{what}: {len(self.errors)} records failed, first: {self.errors[0]}"
            )


def make_producer(bootstrap: str, failures: Failures, **conf: Any) -> Producer:
    return Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "delivery.report.only.error": True,
            "on_delivery": failures,
            **conf,
        }
    )


def transactional(bootstrap: str, failures: Failures, txn_id: str, linger_ms: int) -> Producer:
    p = make_producer(bootstrap, failures, **{"transactional.id": txn_id, "linger.ms": linger_ms})
    p.init_transactions(60)  # the first one creates __transaction_state
    return p


def idempotent(bootstrap: str, failures: Failures, linger_ms: int) -> Producer:
    return make_producer(
        bootstrap, failures, **{"enable.idempotence": True, "linger.ms": linger_ms}
    )


def produce(p: Producer, topic: str, partition: int) -> None:
    while True:
        try:
            p.produce(topic, VALUE, partition=partition)
            return
        except BufferError:
            p.poll(0.001)


def run_transactions(
    p: Producer, n: int, per_txn: int, advance: Callable[[], None] = lambda: None
) -> float:
    """n transactions of per_txn records; the seconds taken."""
    t0 = time.perf_counter()
    for _ in range(n):
        p.begin_transaction()
        for i in range(per_txn):
            produce(p, TXN_TOPIC, i % PARTITIONS)
        p.commit_transaction(60)
        advance()
    return time.perf_counter() - t0


def run_idempotent(
    p: Producer, records: int, step: int, advance: Callable[[], None] = lambda: None
) -> float:
    """`records` records, then flush(); the seconds taken. advance() every `step` records."""
    t0 = time.perf_counter()
    for i in range(records):
        produce(p, IDEM_TOPIC, i % PARTITIONS)
        if (i + 1) % step == 0:
            p.poll(0)
            advance()
    if p.flush(120):
        raise RuntimeError("idempotent producer: records left undelivered after 120 s")
    return time.perf_counter() - t0


def concurrently(work: Iterable[Callable[[], float]]) -> float:
    """Run each piece of work in its own thread (librdkafka calls release the GIL); the
    seconds until the last one is done."""
    errors: list[BaseException] = []

    def run(w: Callable[[], float]) -> None:
        try:
            w()
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=run, args=(w,), daemon=True) for w in work]
    t0 = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if errors:
        raise RuntimeError(f"{len(errors)} producers failed, first: {errors[0]!r}")
    return time.perf_counter() - t0


def paced(
    workers: list[Callable[[], None]],
    rate: float,
    seconds: float,
    advance: Callable[[], None] = lambda: None,
) -> tuple[list[float], float]:
    """Operation i is due at start + i/rate (i < rate*seconds); each worker (one thread each)
    takes the next operation, waits until it is due and runs it. Returns each operation's
    latency and the achieved rate (operations / time until the last one finished)."""
    n = int(rate * seconds)
    lock = threading.Lock()
    next_op = [0]
    lats: list[float] = []
    errors: list[BaseException] = []
    ready = threading.Barrier(len(workers) + 1)
    start: list[float] = []

    def loop(work: Callable[[], None]) -> None:
        ready.wait()
        while not errors:
            with lock:
                i = next_op[0]
                if i >= n:
                    return
                next_op[0] += 1
            delay = start[0] + i / rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            t = time.perf_counter()
            try:
                work()
            except BaseException as e:
                errors.append(e)
                return
            lat = time.perf_counter() - t
            with lock:
                lats.append(lat)
            advance()

    threads = [threading.Thread(target=loop, args=(w,), daemon=True) for w in workers]
    for th in threads:
        th.start()
    start.append(time.perf_counter() + 0.05)
    ready.wait()
    for th in threads:
        th.join(seconds + 120)
    end = time.perf_counter()
    if errors:
        raise RuntimeError(f"{len(errors)} operations failed, first: {errors[0]!r}")
    return lats, len(lats) / (end - start[0])


def pct(lats: list[float], q: float) -> float:
    s = sorted(lats)
    return s[min(len(s) - 1, int(len(s) * q))] * 1000


def count_committed(bootstrap: str, expected: int) -> int:
    """Records a read_committed consumer gets from the transactional topic until it reaches
    the end of every partition."""
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "bench-txn-reader",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
            "log_level": 2,
        }
    )
    c.assign([TopicPartition(TXN_TOPIC, p, 0) for p in range(PARTITIONS)])
    got, eof = 0, set()
    deadline = time.monotonic() + 60 + expected / 20_000
    try:
        while len(eof) < PARTITIONS and time.monotonic() < deadline:
            for m in c.consume(10_000, 0.5):
                if m.error():
                    if m.error().code() == KafkaError._PARTITION_EOF:
                        eof.add(m.partition())
                        continue
                    raise KafkaException(m.error())
                eof.discard(m.partition())
                got += 1
    finally:
        c.close()
    if len(eof) < PARTITIONS:
        raise RuntimeError(f"the read_committed consumer did not reach the end ({got} read)")
    return got


@dataclass
class Results:
    txn_rates: list[float]  # records/s of each throughput round
    idem_rates: list[float]
    lat: dict[str, tuple[list[float], float]]  # kind -> (latencies, achieved rate)
    committed: int  # records committed to TXN_TOPIC
    seen: int  # records a read_committed consumer read from TXN_TOPIC


def measure(bootstrap: str, args: argparse.Namespace, bar: Progress) -> Results:
    """Every figure; the clients live in this call only, so they are gone before the brokers
    stop (else librdkafka logs every refused reconnect)."""
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 2})
    for topic in (TXN_TOPIC, IDEM_TOPIC):
        admin.create_topics([NewTopic(topic, PARTITIONS, 3, config={"min.insync.replicas": "2"})])[
            topic
        ].result(30)
    leaders = {
        t: sorted(p.leader for p in md.partitions.values())
        for t, md in admin.list_topics(timeout=10).topics.items()
        if t in (TXN_TOPIC, IDEM_TOPIC)
    }
    progress(f"cluster is up ({bootstrap}); partition leaders {leaders}")
    failures = Failures()
    records = args.transactions * args.txn_records
    n = args.producers
    tps = [transactional(bootstrap, failures, f"bench-txn-throughput-{i}", 5) for i in range(n)]
    ips = [idempotent(bootstrap, failures, 5) for _ in range(n)]
    # warm-up: connections, metadata, producer ids, the coordinators' partitions
    for tp in tps:
        run_transactions(tp, 5, args.txn_records)
    committed = 5 * args.txn_records * n
    for ip in ips:
        run_idempotent(ip, 5 * args.txn_records, args.txn_records)
    txn_rates: list[float] = []
    idem_rates: list[float] = []
    for r in range(args.rounds):
        for kind in ["txn", "idem"] if r % 2 == 0 else ["idem", "txn"]:
            task = bar.add_task(f"round {r + 1}/{args.rounds}: {kind}", total=args.transactions)
            adv = partial(bar.advance, task)
            if kind == "txn":
                secs = concurrently(
                    partial(run_transactions, p, args.transactions // n, args.txn_records, adv)
                    for p in tps
                )
                committed += records
                txn_rates.append(records / secs)
            else:
                secs = concurrently(
                    partial(run_idempotent, p, records // n, args.txn_records, adv) for p in ips
                )
                idem_rates.append(records / secs)
            bar.remove_task(task)
            progress(f"round {r + 1} {kind}: {records / secs:,.0f} records/s")
    failures.check("throughput")

    k = args.latency_records
    txn_ps = [
        transactional(bootstrap, failures, f"bench-txn-latency-{i}", 0)
        for i in range(args.latency_producers)
    ]
    idem_ps = [idempotent(bootstrap, failures, 0) for _ in range(args.latency_producers)]

    def txn_op(p: Producer) -> Callable[[], None]:
        def op() -> None:
            run_transactions(p, 1, k)

        return op

    def idem_op(p: Producer) -> Callable[[], None]:
        def op() -> None:
            for i in range(k):
                produce(p, IDEM_TOPIC, i % PARTITIONS)
            if p.flush(60):
                raise RuntimeError("records left undelivered after 60 s")

        return op

    for p in txn_ps:  # warm-up: every producer has written to every partition
        run_transactions(p, 1, k)
        committed += k
    for p in idem_ps:
        idem_op(p)()
    n_ops = int(args.rate * args.latency_seconds)
    lat = {}
    for kind, workers in (
        ("idempotent", [idem_op(p) for p in idem_ps]),
        ("transactional", [txn_op(p) for p in txn_ps]),
    ):
        task = bar.add_task(f"latency at {args.rate:g}/s: {kind}", total=n_ops)
        lat[kind] = paced(workers, args.rate, args.latency_seconds, partial(bar.advance, task))
        bar.remove_task(task)
        progress(f"latency {kind}: {lat[kind][1]:.1f}/s achieved")
    committed += len(lat["transactional"][0]) * k
    failures.check("latency")
    progress("a read_committed consumer counts the transactional topic")
    seen = count_committed(bootstrap, committed)
    return Results(txn_rates, idem_rates, lat, committed, seen)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--quick",
        action="store_true",
        help="a short run: 100 transactions x 2 rounds, 5 s of latency",
    )
    ap.add_argument("--transactions", type=int, default=500, help="per throughput round")
    ap.add_argument(
        "--txn-records", type=int, default=100, help="records per transaction (throughput)"
    )
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds of each producer")
    ap.add_argument(
        "--producers",
        type=int,
        default=1,
        help="throughput: producers of each kind running at once (--transactions is split)",
    )
    ap.add_argument(
        "--add-partitions-wait-ms",
        type=int,
        default=None,
        help="the brokers' transaction.add.partitions.wait.ms (default: the broker's, 1000; "
        "0 is Kafka 3.x's immediate CONCURRENT_TRANSACTIONS)",
    )
    ap.add_argument("--rate", type=float, default=100.0, help="transactions/s of the latency run")
    ap.add_argument("--latency-seconds", type=float, default=20.0)
    ap.add_argument("--latency-records", type=int, default=PARTITIONS, help="per transaction")
    ap.add_argument("--latency-producers", type=int, default=8)
    args = ap.parse_args()
    if args.quick:
        args.transactions, args.rounds, args.latency_seconds = 100, 2, 5.0
    if (
        min(
            args.transactions,
            args.txn_records,
            args.rounds,
            args.latency_records,
            args.latency_producers,
            args.producers,
        )
        < 1
    ):
        ap.error(
            "the counts (--transactions, --txn-records, --rounds, --producers, --latency-*) "
            "must be >= 1"
        )
    if args.transactions % args.producers:
        ap.error("--transactions must be a multiple of --producers")
    if args.add_partitions_wait_ms is not None and args.add_partitions_wait_ms < 0:
        ap.error("--add-partitions-wait-ms must be >= 0")
    if args.rate <= 0 or args.latency_seconds <= 0:
        ap.error("--rate and --latency-seconds must be > 0")
    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    )
    progress("starting ZooKeeper and 3 brokers")
    overrides = {}
    if args.add_partitions_wait_ms is not None:
        overrides["transaction.add.partitions.wait.ms"] = str(args.add_partitions_wait_ms)
    with running_cluster("bench-txn-", overrides) as cluster, bar:
        res = measure(cluster.bootstrap, args, bar)
    if res.seen != res.committed:
        raise RuntimeError(f"read_committed saw {res.seen} records, {res.committed} were committed")
    records = args.transactions * args.txn_records
    txn_rates, idem_rates, lat, seen, committed = (
        res.txn_rates,
        res.idem_rates,
        res.lat,
        res.seen,
        res.committed,
    )
    txn_tput, idem_tput = statistics.median(txn_rates), statistics.median(idem_rates)
    ratio = txn_tput / idem_tput
    (t_lat, t_rate), (i_lat, i_rate) = lat["transactional"], lat["idempotent"]
    print(
        f"\n3 brokers on 127.0.0.1-3; topics of {PARTITIONS} partitions, RF=3, "
        f"min.insync.replicas=2, acks=all; 100-byte records; throughput: "
        f"{args.transactions} transactions of {args.txn_records} records ({records:,} records) "
        f"per round over {args.producers} producer(s) of each kind, median of {args.rounds} "
        f"alternating rounds; transaction.add.partitions.wait.ms="
        f"{'default' if args.add_partitions_wait_ms is None else args.add_partitions_wait_ms}; "
        f"latency: "
        f"{args.latency_records} records per transaction, {args.rate:g}/s for "
        f"{args.latency_seconds:g} s over {args.latency_producers} producers; "
        f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}\n"
    )
    print("| measure | transactional | baseline: idempotent, no transaction | vs baseline |")
    print("|---|---|---|---|")
    print(f"| throughput, records/s | {txn_tput:,.0f} | {idem_tput:,.0f} | {ratio:.2f}x |")
    print(
        f"| throughput, each round | {', '.join(f'{x:,.0f}' for x in txn_rates)} | "
        f"{', '.join(f'{x:,.0f}' for x in idem_rates)} | |"
    )
    print(
        f"| commits/s at {args.rate:g}/s asked (achieved) | {t_rate:.1f} | {i_rate:.1f} "
        f"(sends of {args.latency_records} records + flush) | |"
    )
    for q, name in ((0.5, "p50"), (0.99, "p99")):
        t, i = pct(t_lat, q), pct(i_lat, q)
        print(
            f"| {name} latency, ms (begin -> commit acknowledged) | {t:.1f} | {i:.1f} | "
            f"{t / i:.1f}x |"
        )
    print(
        f"\nread_committed consumer: {seen:,} records, all {committed:,} committed records\n"
        f"target (transactional throughput >= 0.5x idempotent): "
        f"{'met' if ratio >= 0.5 else 'NOT met'} ({ratio:.2f}x)"
    )


if __name__ == "__main__":
    main()
