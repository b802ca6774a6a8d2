"""`isrlab test` and `isrlab demo`: one Jepsen-style test from nodes to report.

A test is a `TestConfig` (harness.testconfig: one table of options, validated before any node is
touched); its test map (`to_test()`) is saved as test.json. `run_test(config)` wires the pieces,
each of which knows nothing of the others and gets the test map:

    nodes       embedded netns cluster (harness.cluster), or --nodes / --nodes-file (harness.inventory)
    db          ZooKeeper ensemble + brokers deployed over SSH (harness.db.KafkaDB)
    nemesis     faults as ops (nemeses.build / nemeses.schedule)
    generator   workload phases: main + nemesis -> heal -> recovery -> final drain
                (harness.generator combinators, harness.workloads.queue.generator)
    clients     confluent-kafka queue clients, one per logical process
                (harness.workloads.queue.client)
    interpreter worker threads recording history.jsonl as it happens (harness.interpreter)
    checker     checkers.api.check on the history -> results.json (+ offset diagrams, summary.txt)
    report      report.html (harness.report)

Run directory: `<store>/<name>/<YYYYmmddTHHMMSS>/` with test.json, history.jsonl, results.json,
report.html, checker artefacts and one folder of logs per node; `<store>/<name>/latest` and
`<store>/latest` point at the newest run. Faults are healed at the end and on any abort (Ctrl-C,
an exception), logs are collected, the brokers and ZooKeeper are stopped and wiped, and an
embedded cluster the test brought up is torn down (`--keep-cluster` keeps it for the next run).

Exit code: 0 valid, 1 anomalies that are not allowed, 2 unknown or a setup failure.
"""

from __future__ import annotations

import contextlib
import gc
import inspect
import json
import os
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.live import Live
from rich.table import Table

from isrlab.harness.generator import Context, Pending
from isrlab.harness.testconfig import ConfigError, TestConfig, with_cli_options
from isrlab.harness.workloads.queue.generator import QueueWorkload, Workload, queue_test

console = Console(stderr=True)


class SetupError(RuntimeError):
    """The test could not start (nodes, deployment, bad options): exit code 2."""


def make_test(overrides: Mapping[str, Any]) -> TestConfig:
    """The validated configuration (table defaults for what ``overrides`` leaves out or None)."""
    try:
        return TestConfig.from_mapping(overrides)
    except ConfigError as e:
        raise SetupError(str(e)) from None


def check_store(store: Path) -> None:
    """Create the run store if need be; a store that cannot be written is a `SetupError`
    (said before any node is touched)."""
    try:
        store.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise SetupError(
            f"cannot create the run store {store}: {e.strerror or e}; give --store a "
            "directory you can write"
        ) from None
    if not os.access(store, os.W_OK | os.X_OK):
        raise SetupError(
            f"cannot write the run store {store}: give --store a directory you can write"
        )


def new_run_dir(store: Path, name: str) -> Path:
    check_store(store)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    run = store / name / stamp
    n = 1
    while run.exists():
        n += 1
        run = store / name / f"{stamp}-{n}"
    try:
        run.mkdir(parents=True)
    except OSError as e:
        raise SetupError(f"cannot create the run directory {run}: {e.strerror or e}") from None
    for link in (store / name / "latest", store / "latest"):
        with contextlib.suppress(OSError):
            if link.is_symlink() or link.exists():
                link.unlink()
            link.symlink_to(run.resolve())
    return run


class ScheduleGenerator:
    """The nemesis thread's generator: one schedule per fault kind, merged by time.

    Each kind alternates start/stop on its own staggered clock (`nemeses.schedule` with a
    seed of its own), so faults of different kinds overlap, as in Jepsen's combined nemesis:
    a partition can still be in force when a kill comes, which is what some data losses need
    (an ISR shrunk by the partition, then its last member killed)."""

    def __init__(self, streams: list[Iterator[dict[str, Any]]]):
        self._streams = streams
        self._due: list[int | None] = [None] * len(streams)
        self._ready: list[dict[str, Any] | None] = [None] * len(streams)

    @classmethod
    def for_test(cls, config: TestConfig) -> ScheduleGenerator:
        from isrlab import nemeses

        targets = list(config.nemesis_targets) if config.nemesis_targets else None
        if targets is None:
            # a test with a consumer group also aims faults at the group's coordinator, a
            # transactional one at the coordinator of its transactional ids
            extra = ["coordinator"] if config.group else []
            extra += ["txn-coordinator"] if config.txn and config.transactional_ids else []
            targets = [*nemeses.DEFAULT_TARGETS, *extra] if extra else None
        return cls(
            [
                nemeses.schedule(
                    [kind],
                    config.nemesis_interval,
                    f"{config.seed}-{kind}",
                    targets=targets,
                    keys=list(config.keys or ()),
                    squeeze_then=config.squeeze_then,
                    flap_follower=config.flap_follower,
                    lagging_how=config.lagging_how,
                )
                for kind in config.nemesis
            ]
        )

    def _advance(self, i: int, now: int) -> None:
        """Consume stream i's sleeps until it has an op; set when that op is due."""
        current = self._due[i]
        due: int = current if current is not None else now
        while self._ready[i] is None:
            nxt = next(self._streams[i], None)
            if nxt is None:
                self._due[i] = None
                return
            if nxt.get("type") == "sleep":
                due += int(float(nxt["value"]) * 1e9)
            else:
                self._ready[i] = {"f": nxt["f"], "value": nxt.get("value")}
        self._due[i] = due

    def op(self, ctx: Context) -> dict[str, Any] | Pending | None:
        for i in range(len(self._streams)):
            if self._ready[i] is None:
                self._advance(i, ctx.time)
        live = [i for i in range(len(self._streams)) if self._ready[i] is not None]
        if not live:
            return None
        i = min(live, key=lambda j: self._due[j] or 0)
        due = self._due[i] or 0
        if ctx.time < due:
            return Pending(due)
        op = self._ready[i]
        self._ready[i] = None
        return op

    def update(self, ctx: Context, event: dict[str, Any]) -> None:
        return None


def known_hosts_file() -> Path:
    """Where the host keys of real hosts (``--nodes``, a nodes file without ``known_hosts``)
    are kept: ``~/.isrlab/known_hosts``."""
    return Path.home() / ".isrlab" / "known_hosts"


@contextlib.contextmanager
def node_inventory(config: TestConfig) -> Iterator[tuple[Any, TestConfig]]:
    """The nodes to run on: given hosts, or the embedded cluster (brought up if needed).

    Yields the inventory and the configuration completed with the embedded cluster's node
    names and work directories."""
    from isrlab.harness.inventory import SshOptions, load_inventory

    if config.nodes or config.nodes_file:
        # Trust on first use, then strict: unknown host keys are accepted and kept, a changed
        # key is refused (a nodes file may pin keys: host_key_policy strict, known_hosts).
        ssh = SshOptions(host_key_policy="accept-new", known_hosts=str(known_hosts_file()))
        try:
            inv = load_inventory(config.nodes, config.nodes_file, ssh=ssh)
        except Exception as e:
            raise SetupError(f"bad --nodes/--nodes-file: {e}") from None
        yield inv, config
        return
    from isrlab.harness.cluster import embedded

    try:
        cm = embedded.embedded_cluster(
            config.node_count, name=config.cluster_name, keep=config.keep_cluster
        )
        cluster = cm.__enter__()
    except Exception as e:
        raise SetupError(f"{e}") from None
    try:
        # Node files (venv, data, logs) under the cluster's own directories, which
        # `cluster down` removes: an embedded run leaves nothing behind.
        yield (
            cluster.inventory,
            config.replace(nodes=[n.name for n in cluster.nodes], workdirs=dict(cluster.workdirs)),
        )
    finally:
        cm.__exit__(None, None, None)


def _progress_table(config: TestConfig, stats: dict[str, Any], phase: str) -> Table:
    t = Table.grid(padding=(0, 2))
    limit = config.time_limit
    elapsed = float(stats.get("elapsed_s", 0))
    bar_w = 30
    done = min(int(bar_w * elapsed / limit), bar_w) if limit else bar_w
    t.add_row(
        f"[bold]{config.name}[/]",
        f"{phase}",
        f"[{'#' * done}{'.' * (bar_w - done)}] {elapsed:5.1f}/{limit:.0f}s",
    )
    t.add_row(
        f"ops/s {stats.get('ops_per_s', 0):7.0f}",
        f"[green]ok {stats.get('ok', 0)}[/] [red]fail {stats.get('fail', 0)}[/] "
        f"[yellow]info {stats.get('info', 0)}[/]",
        "faults: " + (", ".join(sorted(stats.get("active_faults", []))) or "none"),
    )
    return t


def progress_line(stats: dict[str, Any], before: dict[str, Any]) -> str:
    """A progress line for a log (no terminal), printed every 10 s: the ops completed since
    the previous line (`before`, the stats it showed; empty for the first) per second, not
    the last second's (which a fault's stall at the moment of printing turns to 0 while
    thousands completed since the line before)."""

    def done(s: dict[str, Any]) -> int:
        return int(s.get("ok", 0)) + int(s.get("fail", 0)) + int(s.get("info", 0))

    elapsed = float(stats.get("elapsed_s", 0))
    span = elapsed - float(before.get("elapsed_s", 0))
    rate = (done(stats) - done(before)) / span if span > 0 else 0.0
    faults = ", ".join(sorted(stats.get("active_faults", []))) or "none"
    return (
        f"  {elapsed:6.1f}s  {rate:6.0f} ops/s  ok {stats.get('ok', 0)} "
        f"fail {stats.get('fail', 0)} info {stats.get('info', 0)}  faults: {faults}"
    )


def _raise_fd_limit() -> None:
    """Every logical process owns librdkafka clients with sockets to every broker: lift the
    soft descriptor limit to the hard one so a long run with many processes cannot hit it."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 1 << 20), hard))


def workload_for(test: Mapping[str, Any], nodes: Mapping[str, str]) -> tuple[Workload, Any]:
    """The workload's generators and its client factory (client_factory(process, thread)):
    the queue workload, or eos (consume-transform-produce, harness.workloads.eos)."""
    if test.get("workload") == "eos":
        from isrlab.harness.workloads.eos.client import client_factory
        from isrlab.harness.workloads.eos.generator import EosWorkload

        eos = EosWorkload(test)
        return eos, client_factory(test, nodes, eos)
    from isrlab.harness.workloads.queue.client import QueueClient

    return QueueWorkload(test), QueueClient.factory(test, nodes)


def run_test(config: TestConfig, progress: bool = True) -> tuple[Path, dict[str, Any]]:
    """Run one test; returns (run dir, results). Raises SetupError when it cannot start."""
    _raise_fd_limit()
    from isrlab import nemeses
    from isrlab.harness.db import KafkaDB
    from isrlab.harness.history import HistoryWriter
    from isrlab.harness.interpreter import Interpreter, bounds
    from isrlab.harness.workloads.queue.options import QueueOptions

    run_dir = new_run_dir(Path(config.store), config.name)
    config = config.replace(run_dir=str(run_dir))
    say = console.print if progress else (lambda *a, **k: None)
    say(f"[bold]isrlab test[/] {config.name}: run directory {run_dir}")
    say(f"  producers: {producer_summary(config)}")
    with node_inventory(config) as (inventory, config):
        test = config.to_test()
        (run_dir / "test.json").write_text(json.dumps(test, indent=2, default=str))
        db = KafkaDB(test, inventory, run_dir, progress=lambda m: say(f"  {m}"))
        nem = None
        workload: Workload | None = None
        try:
            failure = None
            try:
                db.setup()
                db.create_topics(
                    test["keys"], config.replication_factor, config.min_insync_replicas
                )
                if config.nemesis:
                    nem = nemeses.build(list(config.nemesis), db, test)
            except Exception as e:
                failure = f"setting up the cluster failed: {e}"
            if failure is not None:
                # Raised outside the handler: no traceback keeps the failed call's frames (and
                # their Kafka clients) alive while the cluster is torn down.
                raise SetupError(failure)
            nodes = {n: db.bootstrap_servers([n]) for n in db.names}
            workload, client_factory = workload_for(test, nodes)
            nemesis_gen = ScheduleGenerator.for_test(config) if nem is not None else None
            gen = queue_test(workload, test, nemesis_gen=nemesis_gen)
            history = HistoryWriter(run_dir / "history.jsonl")
            # A client call that never returns is abandoned (info, new process) and the
            # whole run ends in bounded time, whatever librdkafka does (interpreter.bounds).
            hang_timeout, run_timeout = bounds(
                QueueOptions.from_test(test).op_timeout_ms / 1000,
                float(test.get("time_limit", 60)),
                float(test.get("recovery_time", 0)),
                float(test.get("final_time_limit", 30)),
            )
            interp = Interpreter(
                gen,
                history,
                client_factory,
                config.concurrency,
                nemesis=nem,
                seed=int(config.seed or 0),
                hang_timeout=hang_timeout,
                run_timeout=run_timeout,
            )
            _run_with_progress(interp, config, progress)
            history.close()
        finally:
            if workload is not None:
                with contextlib.suppress(Exception):
                    workload.close()
            if nem is not None:
                with contextlib.suppress(Exception):
                    nem.close()
            with contextlib.suppress(Exception):
                nemeses.heal_all(db)
            with contextlib.suppress(Exception):
                db.collect_logs(run_dir)
            with contextlib.suppress(Exception):
                db.teardown()
            with contextlib.suppress(Exception):
                db.close()
            del db, nem
            gc.collect()  # destroy every librdkafka client before the nodes go away
    say("checking the history ...")
    return run_dir, check_run(run_dir, test)


def check_history(
    run_dir: Path, test: Mapping[str, Any]
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The ops of a run directory's history.jsonl and the queue checker's results under its
    test's policy (a run that checked nothing is "unknown", `idle_warning`); writes nothing."""
    from isrlab.checkers.api import check, policy_from_test
    from isrlab.checkers.history import load_history, nothing_checked

    ops = load_history(run_dir / "history.jsonl")
    policy = policy_from_test(dict(test))
    policy.pop("workload", None)
    results = check(ops, "queue", **policy)
    warning = idle_warning(results)
    if warning:
        # The run as a whole checked nothing (Jepsen's stats checker fails such a run): its
        # verdict is "unknown", with the reason where the spec keeps it.
        nothing_checked(results, warning)
    return ops, results


def check_run(run_dir: Path, test: Mapping[str, Any]) -> dict[str, Any]:
    """Check a run directory's history.jsonl under its test's policy; write results.json, the
    checker's artifacts and report.html; return the results."""
    from isrlab.checkers.render import render_artifacts
    from isrlab.checkers.unseen import annotate as annotate_unseen
    from isrlab.harness.report import render_report

    ops, results = check_history(run_dir, test)
    annotate_unseen(results, ops, run_dir)  # what the replicas say of unread acknowledged writes
    (run_dir / "results.json").write_text(json.dumps(results, indent=2, default=str))
    render_artifacts(ops, results, run_dir)
    render_report(run_dir)  # adds the optional `availability` field to results.json
    return dict(json.loads((run_dir / "results.json").read_text()))


def producer_summary(config: TestConfig) -> str:
    """The producers a run uses, in Kafka's words (said at the start of every run)."""
    if config.txn:
        kind = "transactional (idempotent)"
    elif config.idempotence:
        kind = "idempotent (enable.idempotence=true, Kafka 3.x's default with acks=all)"
    else:
        kind = "not idempotent (at least once: a retried send may be written twice)"
    return f"acks={config.acks}, {kind}"


def _run_with_progress(interp: Any, config: TestConfig, progress: bool) -> None:
    result: dict[str, Any] = {}

    def target() -> None:
        try:
            result["stats"] = interp.run()
        except BaseException as e:  # surfaced in the main thread
            result["error"] = e

    worker = threading.Thread(target=target, name="interpreter", daemon=True)
    worker.start()
    said = 0

    def say_abandoned() -> None:
        # Workers the interpreter gave up on (a client call that never returned, or the
        # run's own time bound): said once each, in both display modes.
        nonlocal said
        lines = list(interp.stats().get("abandoned") or [])
        for line in lines[said:]:
            console.print(f"[yellow]  abandoned: {line}[/]")
        said = max(said, len(lines))

    try:
        if progress and console.is_terminal:
            with Live(console=console, refresh_per_second=4) as live:
                while worker.is_alive():
                    stats = interp.stats()
                    phase = (
                        "workload"
                        if stats.get("elapsed_s", 0) < config.time_limit
                        else "final reads"
                    )
                    live.update(_progress_table(config, stats, phase))
                    say_abandoned()
                    worker.join(0.25)
        else:
            last = 0.0
            before: dict[str, Any] = {}
            while worker.is_alive():
                worker.join(0.5)
                if progress:
                    say_abandoned()
                if progress and time.monotonic() - last >= 10:
                    last = time.monotonic()
                    s = interp.stats()
                    console.print(progress_line(s, before))
                    before = s
    except KeyboardInterrupt:
        console.print("[yellow]interrupted: stopping clients, healing faults ...[/]")
        interp.stop()
        worker.join(60)
        raise
    if progress:
        say_abandoned()
    if "error" in result:
        raise result["error"]


def exit_code(results: Mapping[str, Any]) -> int:
    """0 valid, 1 invalid, 2 unknown; a "valid" run that acknowledged and read nothing
    (`idle_warning`) checked nothing, so it is 2 as well, never green."""
    v = results.get("valid")
    if v is True and idle_warning(results):
        return 2
    return 0 if v is True else 1 if v is False else 2


def idle_warning(results: Mapping[str, Any]) -> str | None:
    """A warning when the run exercised nothing: no record acknowledged with an offset and none
    read. The history's checker may call that valid (an ok poll that read nothing is something
    checked), but the run says nothing about the system: `run_test` records its verdict as
    "unknown" with this reason in ``stats["nothing-checked"]`` (Jepsen's stats checker fails
    such a run)."""
    stats = results.get("stats") or {}
    if not isinstance(stats, Mapping) or "reads" not in stats:
        return None
    if stats.get("reads") == 0 and int(stats.get("max_offset", -1)) < 0:
        return IDLE_REASON
    return None


IDLE_REASON = (
    "no record was acknowledged with an offset and none was read: the verdict says "
    "nothing about the system (was the cluster working? see the node logs)"
)


def print_summary(run_dir: Path, results: Mapping[str, Any]) -> None:
    warning = idle_warning(results)
    if warning:
        console.print(f"[bold yellow]warning: {warning}[/]")
    v = results.get("valid")
    color = {True: "green", False: "red"}.get(v, "yellow")  # type: ignore[arg-type]
    console.print(
        f"\n[bold {color}]valid: {v}[/]   anomalies: {', '.join(results.get('anomaly_types', [])) or 'none'}"
    )
    avail = results.get("availability") or {}
    if avail.get("stuck_consumer_count"):
        console.print(
            f"[yellow]liveness: {avail['stuck_consumer_count']} stretch(es) of stuck consumers "
            "(polls empty while their keys had readable records; see the report)[/]"
        )
    for name, info in sorted(results.get("anomalies", {}).items()):
        console.print(f"  {name}: {info.get('count')}")
        for ex in info.get("examples", [])[:2]:
            text = ex.get("explanation") if isinstance(ex, dict) else str(ex)
            console.print(f"    - {text}")
    console.print(f"report: {run_dir / 'report.html'}")


def _require_root_or_nodes(config: TestConfig) -> None:
    if config.nodes or config.nodes_file:
        return
    if os.geteuid() != 0:
        raise SetupError(
            "the embedded cluster needs root (network namespaces, iptables): run with sudo, "
            "or give real hosts with --nodes n1,n2,... or --nodes-file nodes.yaml"
        )


def knob_settings(items: Sequence[str] | None, options: Mapping[str, Any]) -> dict[str, Any]:
    """``--set NAME=VALUE`` items -> workload knobs (test.json keys of the workload's table,
    docs/test-options.md); the test table's own options have their flags and are refused here,
    as is anything that is not NAME=VALUE. The values are checked with the test."""
    out: dict[str, Any] = {}
    for item in items or ():
        name, sep, raw = item.partition("=")
        name = name.strip().replace("-", "_")
        if not sep or not name:
            raise SetupError(f"--set takes NAME=VALUE (a workload knob), not {item!r}")
        if name in options:
            flag = name.replace("_", "-")
            raise SetupError(f"--set {name}: that is a test option, give it as --{flag}")
        out[name] = raw.strip()
    return out


def _test_command(
    test_count: int = 1,
    set_: list[str] | None = None,
    old_keys: str | None = None,
    **options: Any,
) -> None:
    """Run a Jepsen-style fault-injection test and check its history.

    Producers are Kafka 3.x's by default: acks=all with enable.idempotence=true (off by
    default with --acks 0 or 1); --no-idempotence is the at-least-once study.

    Real hosts (--nodes, --nodes-file): SSH host keys are trusted on first use and kept in
    ~/.isrlab/known_hosts; a changed key is refused. To pin keys instead, put them in a file
    (ssh-keyscan HOST >> FILE, then check the fingerprints) and name it in the nodes file
    with host_key_policy: strict and known_hosts: FILE."""
    try:
        # every run's configuration is validated before the first run touches a node
        if old_keys is not None:
            raise SetupError(
                f"--keys is now --key-count (the number of keys, test.json's key_count): "
                f"give --key-count {old_keys}"
            )
        if test_count < 1:
            raise SetupError(f"--test-count must be at least 1, not {test_count}")
        options = {**options, **knob_settings(set_, options)}
        seed = options.get("seed")
        configs = [
            make_test(
                {
                    **options,
                    "keep_cluster": bool(options.get("keep_cluster")) or i < test_count - 1,
                    "seed": seed + i if seed is not None else None,
                }
            )
            for i in range(test_count)
        ]
        check_store(Path(configs[0].store))
        _require_root_or_nodes(configs[0])
    except SetupError as e:
        console.print(f"[red]isrlab test: {e}[/]")
        raise typer.Exit(2) from None
    worst = 0
    for config in configs:
        try:
            run_dir, results = run_test(config)
        except SetupError as e:
            console.print(f"[red]isrlab test: {e}[/]")
            raise typer.Exit(2) from None
        print_summary(run_dir, results)
        worst = max(worst, exit_code(results))
    raise typer.Exit(worst)


test_command = with_cli_options(
    _test_command,
    [
        inspect.Parameter(
            "test_count",
            inspect.Parameter.KEYWORD_ONLY,
            default=1,
            annotation=Annotated[int, typer.Option(help="run the test this many times")],
        ),
        inspect.Parameter(
            "set_",
            inspect.Parameter.KEYWORD_ONLY,
            default=None,
            annotation=Annotated[
                list[str] | None,
                typer.Option(
                    "--set",
                    help="NAME=VALUE: a knob of the workload, saved in test.json (repeatable; "
                    "e.g. --set copier_kill_interval=5; docs/test-options.md lists them)",
                ),
            ],
        ),
        inspect.Parameter(
            "old_keys",
            inspect.Parameter.KEYWORD_ONLY,
            default=None,
            annotation=Annotated[
                str | None, typer.Option("--keys", hidden=True, help="now --key-count")
            ],
        ),
    ],
)


def demo_command(
    time_limit: Annotated[float, typer.Option(help="seconds of workload with faults")] = 60,
    store: Annotated[Path, typer.Option(help="run store")] = Path("store"),
) -> None:
    """The main job: 5-node embedded cluster, acks=all with idempotent producers,
    min.insync.replicas=2, partition + kill faults, about a minute of workload, then the report."""
    try:
        test = make_test(
            {
                "name": "demo",
                "acks": "all",
                "idempotence": True,
                "min_insync_replicas": 2,
                "nemesis": "partition+kill",
                "nemesis_interval": 8,
                "time_limit": time_limit,
                "final_time_limit": 40,
                "recovery_time": 8,
                "store": str(store),
            }
        )
        check_store(store)
        _require_root_or_nodes(test)
        run_dir, results = run_test(test)
    except SetupError as e:
        console.print(f"[red]isrlab demo: {e}[/]")
        raise typer.Exit(2) from None
    print_summary(run_dir, results)
    console.print(f"summary: {run_dir / 'summary.txt'}")
    raise typer.Exit(exit_code(results))
