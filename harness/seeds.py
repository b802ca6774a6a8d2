"""`isrlab seeds`: the seeds' experiment, reproduced and plotted.

A follower is cut off from the partition leader with the route trick (on the follower,
`route` to the leader via 127.0.0.1: packets to the leader loop back, the TCP connection breaks,
both processes live on) while two producers write to the partition side by side, one with
acks=1 and one with acks=all (min.insync.replicas=2, RF=3). What Kafka's design predicts, and what
the seeds observed:

- acks=1 producers carry on: the leader acknowledges on its own append;
- acks=all producers stall: the high watermark cannot pass what the cut-off follower lacks while
  it is still in the ISR, so nothing is acknowledged until the leader drops it from the ISR after
  `replica.lag.time.max.ms`; then the ISR (leader + the other follower) still meets
  min.insync.replicas=2 and acks=all carries on.

The run directory gets seeds.json (every acknowledgement, the ISR over time, the fault period)
and report.html with the plot: acknowledged messages per second for both producers and the ISR
size, the fault shaded. `measure()` also returns the numbers the test asserts on.
"""

from __future__ import annotations

import io
import itertools
import json
import random
import threading
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from isrlab.harness.runner import (
    SetupError,
    check_store,
    console,
    make_test,
    new_run_dir,
    node_inventory,
)

TOPIC = "seeds"


def _producer_loop(
    bootstrap: str, acks: str, rate: float, stop: threading.Event, t0: float, out: list[float]
) -> None:
    from confluent_kafka import Producer

    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": acks,
            "linger.ms": 1,
            "message.timeout.ms": 120000,
            "request.timeout.ms": 60000,
        }
    )

    def cb(err: Any, msg: Any) -> None:
        if err is None:
            out.append(time.monotonic() - t0)

    i = 0
    while not stop.is_set():
        due = t0 + i / rate
        now = time.monotonic()
        if now < due:
            p.poll(min(due - now, 0.01))
            continue
        try:
            p.produce(TOPIC, f"{acks}-{i}".encode(), partition=0, on_delivery=cb)
            i += 1
        except BufferError:
            p.poll(0.01)
        p.poll(0)
    p.flush(30)


def measure(
    db: Any, run_dir: Path, lag_ms: int, rate: float = 300.0, before_s: float = 6.0
) -> dict[str, Any]:
    from isrlab.nemeses.partition import PartitionFault

    md = db.metadata(topic=TOPIC)
    part = md.topics[TOPIC].partitions[0]
    leader = db.broker_node(part.leader)
    follower = next(db.broker_node(r) for r in part.replicas if r != part.leader)
    if leader is None or follower is None:
        raise SetupError("the seeds partition has no leader or follower")
    bootstrap = db.bootstrap_servers()
    t0 = time.monotonic()
    stop = threading.Event()
    acks: dict[str, list[float]] = {"1": [], "all": []}
    threads = [
        threading.Thread(target=_producer_loop, args=(bootstrap, a, rate, stop, t0, acks[a]))
        for a in acks
    ]
    isr: list[tuple[float, int]] = []

    def watch_isr() -> None:
        while not stop.is_set():
            try:
                m = db.metadata(topic=TOPIC, timeout=2)
                isr.append((time.monotonic() - t0, len(m.topics[TOPIC].partitions[0].isrs)))
            except Exception:
                pass
            time.sleep(0.25)

    watcher = threading.Thread(target=watch_isr)
    for t in [*threads, watcher]:
        t.start()
    fault = PartitionFault(db, random.Random(0), "route")
    try:
        time.sleep(before_s)
        cut_at = time.monotonic() - t0
        fault.start({"grudge": {follower: [leader]}})
        console.print(f"  cut {follower} off from the leader {leader} (route via 127.0.0.1)")
        deadline = time.monotonic() + 3 * lag_ms / 1000 + 20
        shrunk_at = None
        while time.monotonic() < deadline:
            if isr and isr[-1][0] > cut_at and isr[-1][1] < 3:
                shrunk_at = isr[-1][0]
                break
            time.sleep(0.2)
        time.sleep(6.0)
        healed_at = time.monotonic() - t0
    finally:
        fault.heal()
    time.sleep(6.0)
    stop.set()
    for t in [*threads, watcher]:
        t.join(60)
    end = time.monotonic() - t0

    def longest_gap(times: list[float], a: float, b: float) -> float:
        ts = [a, *sorted(x for x in times if a <= x <= b), b]
        return max(y - x for x, y in itertools.pairwise(ts))

    window_end = shrunk_at if shrunk_at is not None else healed_at
    result = {
        "leader": leader,
        "follower": follower,
        "lag_ms": lag_ms,
        "rate_per_producer": rate,
        "cut_at": cut_at,
        "isr_shrunk_at": shrunk_at,
        "healed_at": healed_at,
        "end": end,
        "acks": acks,
        "isr": isr,
        "acks1_during_cut": sum(1 for x in acks["1"] if cut_at <= x <= window_end),
        "acksall_during_cut": sum(1 for x in acks["all"] if cut_at + 1 <= x <= window_end),
        "acks1_longest_gap_s": longest_gap(acks["1"], cut_at, healed_at),
        "acksall_longest_gap_s": longest_gap(acks["all"], cut_at, healed_at),
        "acksall_after_shrink": sum(
            1 for x in acks["all"] if shrunk_at is not None and shrunk_at + 1 <= x <= healed_at
        ),
    }
    (run_dir / "seeds.json").write_text(json.dumps(result))
    (run_dir / "report.html").write_text(render(result))
    return result


def render(r: dict[str, Any]) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(11, 6), sharex=True, height_ratios=[3, 1])
    width = 0.5
    n = int(r["end"] / width) + 1
    for a, color in (("1", "#2a9d4b"), ("all", "#355070")):
        counts = [0] * n
        for x in r["acks"][a]:
            counts[min(int(x / width), n - 1)] += 1
        ax1.plot(
            [i * width for i in range(n)],
            [c / width for c in counts],
            label=f"acks={a}",
            color=color,
        )
    for ax in (ax1, ax2):
        ax.axvspan(
            r["cut_at"], r["healed_at"], color="#f4a259", alpha=0.2, label="follower cut off"
        )
        if r["isr_shrunk_at"] is not None:
            ax.axvline(r["isr_shrunk_at"], color="#bc4b51", ls="--", label="ISR shrinks")
    ax1.set_ylabel("acknowledged msgs / s")
    ax1.legend(loc="upper right", fontsize=8)
    ax2.step([t for t, _ in r["isr"]], [s for _, s in r["isr"]], where="post", color="#6d597a")
    ax2.set_ylabel("ISR size")
    ax2.set_xlabel("seconds")
    ax2.set_ylim(0, 3.5)
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    plt.close(fig)
    svg = buf.getvalue()
    svg = svg[svg.index("<svg") :]
    rows = "".join(
        f"<tr><th>{k}</th><td>{v if not isinstance(v, float) else f'{v:.2f}'}</td></tr>"
        for k, v in r.items()
        if k not in ("acks", "isr")
    )
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>isrlab: the seeds' experiment"
        "</title><style>body{font-family:system-ui,sans-serif;margin:2em;max-width:1150px}"
        "td,th{padding:3px 8px;border:1px solid #ddd;text-align:left}</style></head><body>"
        "<h1>The seeds' experiment</h1><p>A follower is cut off from the leader with "
        "<code>route</code> via 127.0.0.1 while an acks=1 and an acks=all producer write to the "
        "same partition (RF=3, min.insync.replicas=2). acks=1 carries on; acks=all stalls until "
        "the leader drops the follower from the ISR after replica.lag.time.max.ms, then carries on."
        f"</p>{svg}<table>{rows}</table></body></html>"
    )


def run_seeds(
    store: Path, lag_ms: int = 10000, cluster_name: str = "default", keep_cluster: bool = False
) -> tuple[Path, dict[str, Any]]:
    from isrlab.harness.db import KafkaDB

    config = make_test(
        {
            "name": "seeds",
            "store": str(store),
            "nemesis": "none",
            "replica_lag_time_max_ms": lag_ms,
            "min_insync_replicas": 2,
            "replication_factor": 3,
            "cluster_name": cluster_name,
            "keep_cluster": keep_cluster,
            "node_count": 3,
        }
    )
    run_dir = new_run_dir(store, "seeds")
    with node_inventory(config) as (inventory, config):
        test = config.to_test()
        (run_dir / "test.json").write_text(json.dumps(test, indent=2, default=str))
        db = KafkaDB(test, inventory, run_dir, progress=lambda m: console.print(f"  {m}"))
        try:
            db.setup()
            db.create_topics([f"{TOPIC}/0"], 3, 2)
            result = measure(db, run_dir, lag_ms)
        finally:
            try:
                db.collect_logs(run_dir)
            finally:
                db.teardown()
                db.close()
    return run_dir, result


def seeds_command(
    lag_ms: Annotated[int, typer.Option(help="replica.lag.time.max.ms of the brokers")] = 10000,
    store: Annotated[Path, typer.Option(help="run store")] = Path("store"),
) -> None:
    """The seeds' experiment: cut a follower off with the route trick; acks=1 carries on,
    acks=all stalls until the follower leaves the ISR."""
    import os

    try:
        check_store(store)
    except SetupError as e:
        console.print(f"[red]isrlab seeds: {e}[/]")
        raise typer.Exit(2) from None
    if os.geteuid() != 0:
        console.print("[red]isrlab seeds: the embedded cluster needs root (run with sudo)[/]")
        raise typer.Exit(2)
    try:
        run_dir, r = run_seeds(store, lag_ms)
    except SetupError as e:
        console.print(f"[red]isrlab seeds: {e}[/]")
        raise typer.Exit(2) from None
    console.print(
        f"acks=1: {r['acks1_during_cut']} acks while the follower was cut off and still in the "
        f"ISR (longest gap {r['acks1_longest_gap_s']:.1f} s); acks=all: longest gap "
        f"{r['acksall_longest_gap_s']:.1f} s, ISR shrank "
        f"{(r['isr_shrunk_at'] or float('nan')) - r['cut_at']:.1f} s after the cut, "
        f"{r['acksall_after_shrink']} acks after it"
    )
    console.print(f"report: {run_dir / 'report.html'}")
