"""Every fault and its heal against a real 5-node embedded cluster: ZooKeeper x3 + 5 brokers.

One cluster ("dbtest") for the module, deployed by KafkaDB over SSH; each test leaves it healed
(the ``nem`` fixture runs heal_all) so tests are independent of order.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from isrlab import nemeses
from isrlab.harness.cluster import EmbeddedCluster, embedded_cluster
from isrlab.harness.db import KafkaDB
from isrlab.harness.wheelhouse import build_wheelhouse
from isrlab.nemeses.partition import CHAIN

pytestmark = [pytest.mark.root, pytest.mark.integration, pytest.mark.timeout(600)]

ZK_SESSION_MS = 6000
KEYS = ["t0/0", "t1/0"]


@pytest.fixture(scope="module")
def cluster() -> Iterator[EmbeddedCluster]:
    with embedded_cluster(5, "dbtest") as c:
        yield c


@pytest.fixture(scope="module")
def db(cluster: EmbeddedCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaDB]:
    test = {
        "name": "dbtest",
        "seed": 7,
        "keys": KEYS,
        "zk_session_timeout_ms": ZK_SESSION_MS,
        "replica_lag_time_max_ms": 3000,
        "replication_factor": 3,
    }
    d = KafkaDB(test, cluster.inventory, tmp_path_factory.mktemp("run"), workdirs=cluster.workdirs)
    d.setup()
    d.create_topics(KEYS, rf=3, min_insync=1)
    yield d
    d.teardown()
    for name in d.names:
        left = d.remote(name).exec(f"ls {d.workdirs[name]}").stdout.split()
        assert sorted(left) == ["venv", "wheelhouse"], left


@pytest.fixture
def nem(db: KafkaDB) -> Iterator[nemeses.Nemesis]:
    n = nemeses.build(["partition", "partition-iptables", "pause", "kill", "clock"], db, db.test)
    with nemeses.healing(n):
        yield n
    db.wait_for_brokers(timeout=60)


def _producer(bootstrap: str, acks: str = "1") -> Producer:
    return Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": acks,
            "message.timeout.ms": 8000,
            "socket.timeout.ms": 3000,
            "log_level": 2,
        }
    )


def _send(p: Producer, topic: str, value: bytes) -> Any:
    box: dict[str, Any] = {}
    p.produce(topic, value, partition=0, on_delivery=lambda err, msg: box.update(e=err, m=msg))
    p.flush(15)
    assert "e" in box, "no delivery report"
    return box["e"], box["m"]


def _routes(db: KafkaDB, node: str) -> list[str]:
    out = db.remote(node).exec("ip route show").stdout.splitlines()
    return [line for line in out if "via 127.0.0.1" in line]


def _chain_rules(db: KafkaDB, node: str) -> list[str]:
    res = db.remote(node).exec(f"iptables -w -S {CHAIN}", check=False)
    return [line for line in res.stdout.splitlines() if line.startswith("-A")]


def _reaches(db: KafkaDB, src: str, dst: str, port: int = 9092) -> bool:
    host = db.node(dst).host
    cmd = f"timeout 2 bash -c 'exec 3<>/dev/tcp/{host}/{port}'"
    return db.remote(src).exec(cmd, check=False).ok


def _wait(pred: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.25)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def test_setup_deploys_a_working_cluster_a_host_client_can_use(db: KafkaDB) -> None:
    assert len(db.metadata().brokers) == 5
    assert db.controller() in db.names
    topic = "t1"
    err, msg = _send(_producer(db.bootstrap_servers(), "all"), topic, b"hello")
    assert err is None and msg.offset() >= 0
    c = Consumer(
        {
            "bootstrap.servers": db.bootstrap_servers(),
            "group.id": f"g{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False,
            "log_level": 2,
        }
    )
    c.assign([TopicPartition(topic, 0, msg.offset())])
    got = _wait(lambda: c.poll(1.0), 20, "the record to be consumed")
    c.close()
    assert got.error() is None and got.value() == b"hello"
    # everything the broker writes lives under the node's work dir
    n1 = db.names[0]
    props = db.remote(n1).read_file(db.path(n1, "broker", "server.properties")).decode()
    assert f"log.dirs={db.path(n1, 'broker', 'data')}" in props
    assert f"zookeeper.session.timeout.ms={ZK_SESSION_MS}" in props
    assert db.remote(n1).exec(f"test -s {db.broker_pidfile(n1)}", check=False).ok


def test_route_isolated_leader_is_replaced_and_still_takes_acks_1_writes(
    db: KafkaDB, nem: nemeses.Nemesis
) -> None:
    topic = "t0"
    old = db.leader_of(topic, 0)
    assert old is not None
    done = nem.invoke(
        {
            "process": "nemesis",
            "type": "info",
            "f": "start-partition",
            "value": {"shape": "isolate-leader", "key": "t0/0"},
        }
    )
    assert "error" not in done, done
    others = [n for n in db.names if n != old]
    assert done["value"][old] == others
    assert all(done["value"][n] == [old] for n in others)
    assert len(_routes(db, old)) == 4 and all(len(_routes(db, n)) == 1 for n in others)
    assert not _reaches(db, old, others[0]) and _reaches(db, others[0], others[1])
    # the old leader still answers the host and, with acks=1, acknowledges alone: the write
    # the seeds' experiment loses once a new leader is elected on the other side
    # (a few tries: on this loaded host a single 8 s delivery timeout is sometimes too short)
    for _ in range(3):
        err, msg = _send(_producer(db.bootstrap_servers([old]), "1"), topic, b"old-leader")
        if err is None:
            break
    assert err is None, err
    assert msg.offset() >= 0

    def new_leader() -> str | None:
        try:
            ldr = db.leader_of(topic, 0, via=others)
        except Exception:  # a metadata timeout on this loaded host: ask again
            return None
        return ldr if ldr not in (None, old) else None

    new = _wait(new_leader, ZK_SESSION_MS / 1000 + 30, "a new leader")
    assert new in others
    healed = nem.invoke({"process": "nemesis", "type": "info", "f": "stop-partition"})
    assert healed["value"] == {n: [] for n in db.names}
    assert all(not _routes(db, n) for n in db.names)
    assert _reaches(db, old, others[0])


def test_iptables_halves_drop_traffic_between_sides_only(db: KafkaDB, nem: nemeses.Nemesis) -> None:
    done = nem.invoke(
        {
            "process": "nemesis",
            "type": "info",
            "f": "start-partition-iptables",
            "value": {"shape": "halves"},
        }
    )
    grudge = done["value"]
    minority = [n for n in db.names if len(grudge[n]) == 3]
    majority = [n for n in db.names if len(grudge[n]) == 2]
    assert len(minority) == 2 and len(majority) == 3
    assert sorted(grudge[minority[0]]) == sorted(majority)
    for n in db.names:
        assert len(_chain_rules(db, n)) == len(grudge[n])
    assert not _reaches(db, minority[0], majority[0])
    assert _reaches(db, majority[0], majority[1]) and _reaches(db, minority[0], minority[1])
    # the control host is never cut off
    assert db.remote(minority[0]).exec("true").ok
    nem.invoke({"process": "nemesis", "type": "info", "f": "stop-partition-iptables"})
    assert all(not _chain_rules(db, n) for n in db.names)
    assert _reaches(db, minority[0], majority[0])


def test_pause_and_resume(db: KafkaDB, nem: nemeses.Nemesis) -> None:
    done = nem.invoke(
        {"process": "nemesis", "type": "info", "f": "start-pause", "value": {"target": "minority"}}
    )
    paused = done["value"]["nodes"]
    assert len(paused) == 2
    assert all(db.broker_state(n) == "paused" for n in paused)
    assert all(db.broker_state(n) == "running" for n in db.names if n not in paused)
    assert nem.active == {"pause"}
    stop = nem.invoke({"process": "nemesis", "type": "info", "f": "stop-pause"})
    assert stop["value"]["nodes"] == sorted(paused)
    assert all(db.broker_state(n) == "running" for n in db.names)


def test_kill_and_restart(db: KafkaDB, nem: nemeses.Nemesis) -> None:
    ctl = db.controller()
    done = nem.invoke(
        {"process": "nemesis", "type": "info", "f": "start-kill", "value": {"target": "controller"}}
    )
    assert done["value"]["nodes"] == [ctl]
    assert db.broker_state(ctl) == "down"
    nem.invoke({"process": "nemesis", "type": "info", "f": "stop-kill"})
    assert db.broker_state(ctl) == "running"
    db.wait_for_brokers(timeout=60)


def test_the_coordinator_target_kills_the_leader_of_the_groups_offsets_partition(
    db: KafkaDB, nem: nemeses.Nemesis, monkeypatch: pytest.MonkeyPatch
) -> None:
    from isrlab.broker.coordinator.ownership import partition_for

    group = f"dbtest-{uuid.uuid4().hex[:6]}"
    monkeypatch.setitem(db.test, "group", group)

    def ask() -> str | None:
        try:  # the first FindCoordinator creates __consumer_offsets
            return db.coordinator(group)
        except Exception:
            return None

    _wait(ask, 60, "the group's coordinator")

    def offsets_partitions() -> int:
        # the broker asked may not know the new topic's partitions yet (an empty list, as
        # Kafka answers for a topic being created: a CI run once divided by it)
        try:
            topic = db.metadata(topic="__consumer_offsets").topics["__consumer_offsets"]
        except Exception:
            return 0
        return len(topic.partitions)

    partition = partition_for(
        group, _wait(offsets_partitions, 60, "__consumer_offsets' partitions in the metadata")
    )
    # Just after __consumer_offsets is created its leaders may still move (a CI run once saw
    # the coordinator go from n1 to n2 between two looks, the broker killed by the test
    # before having just come back): aim once the same leader was seen three times in a row.
    seen: list[str | None] = []

    def settled() -> str | None:
        c = ask()
        seen.append(c if c == db.leader_of("__consumer_offsets", partition) else None)
        last = seen[-3:]
        return last[0] if len(last) == 3 and last[0] is not None and len(set(last)) == 1 else None

    coord = _wait(settled, 60, "a settled coordinator")
    done = nem.invoke(
        {
            "process": "nemesis",
            "type": "info",
            "f": "start-kill",
            "value": {"target": "coordinator"},
        }
    )
    assert done["value"] == {"target": "coordinator", "nodes": [coord]}
    assert db.broker_state(coord) == "down"
    others = [n for n in db.names if n != coord]

    def moved() -> str | None:
        try:
            new = db.coordinator(group, via=others)
        except Exception:
            return None
        return new if new not in (None, coord) else None

    assert _wait(moved, ZK_SESSION_MS / 1000 + 30, "a new coordinator") in others
    nem.invoke({"process": "nemesis", "type": "info", "f": "stop-kill"})
    db.wait_for_brokers(timeout=60)


def test_clock_bump_is_seen_by_the_broker_and_reset(db: KafkaDB, nem: nemeses.Nemesis) -> None:
    node = db.names[1]
    offset_file = db.clock_offset_file(node)
    environ = db.remote(node).read_file(f"/proc/{db.broker_pid(node)}/environ").decode()
    assert f"ISRLAB_CLOCK_OFFSET_FILE={offset_file}" in environ.split("\0")
    python = db.path(node, "venv", "bin", "python")

    def skew() -> float:
        # the broker's interpreter with the broker's environment, next to the node's clock
        out = db.remote(node).exec(
            f"env ISRLAB_CLOCK_OFFSET_FILE={offset_file} {python} -c "
            "'import time; print(time.time())'; date +%s.%N"
        )
        a, b = out.stdout.split()
        return float(a) - float(b)

    assert abs(skew()) < 2
    done = nem.invoke(
        {
            "process": "nemesis",
            "type": "info",
            "f": "start-clock",
            "value": {"mode": "bump", "target": "all", "delta_ms": 3_600_000},
        }
    )
    assert done["value"]["offsets"][node] == pytest.approx(3600.0)
    assert skew() == pytest.approx(3600, abs=2)
    # the broker itself: its log timestamps jump an hour ahead (a new topic makes it log)
    db.create_topics(["tclock/0"], rf=5, min_insync=1)
    log = db.remote(node).read_file(db.path(node, "logs", "broker.log")).decode()
    line = next(x for x in reversed(log.splitlines()) if "tclock" in x)
    stamp = datetime.strptime(line[:19], "%Y-%m-%d %H:%M:%S").timestamp()
    assert stamp - time.time() == pytest.approx(3600, abs=30)
    nem.invoke({"process": "nemesis", "type": "info", "f": "stop-clock"})
    assert abs(skew()) < 2
    assert db.remote(node).read_file(offset_file).strip() == b"+0.000"


def test_clock_strobe_flips_until_stopped(db: KafkaDB, nem: nemeses.Nemesis) -> None:
    node = db.names[0]
    nem.invoke(
        {
            "process": "nemesis",
            "type": "info",
            "f": "start-clock",
            "value": {"mode": "strobe", "target": "all", "delta_ms": -5000, "period_ms": 200},
        }
    )
    # the file flips between -5 and 0 (it held +0 before): wait to see -5, then 0 again
    seen: list[float] = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not (-5.0 in seen and seen[-1] == 0.0):
        text = db.remote(node).read_file(db.clock_offset_file(node)).strip()
        if text:  # empty: caught between truncate and write
            seen.append(float(text))
        time.sleep(0.05)
    assert -5.0 in seen and seen[-1] == 0.0 and set(seen) == {-5.0, 0.0}, seen
    nem.invoke({"process": "nemesis", "type": "info", "f": "stop-clock"})
    time.sleep(0.5)
    assert db.remote(node).read_file(db.clock_offset_file(node)).strip() == b"+0.000"


def test_packet_faults_fail_clearly_without_netem(db: KafkaDB) -> None:
    probe = db.remote(db.names[0]).exec(
        "tc qdisc add dev lo root netem delay 0ms && tc qdisc del dev lo root", check=False
    )
    if probe.ok:
        pytest.skip("this kernel has sch_netem; the unavailable path cannot be shown here")
    with pytest.raises(nemeses.PacketFaultsUnavailable, match="sch_netem"):
        nemeses.build(["packet"], db, db.test)


def test_heal_all_is_idempotent_and_leaves_nothing(db: KafkaDB, nem: nemeses.Nemesis) -> None:
    a, b, c = db.names[:3]
    nem.invoke(
        {"process": "nemesis", "type": "info", "f": "start-partition", "value": {"shape": "bridge"}}
    )
    nem.invoke(
        {
            "process": "nemesis",
            "type": "info",
            "f": "start-partition-iptables",
            "value": {"shape": "majorities-ring"},
        }
    )
    db.pause(a)
    db.kill(b)
    nem.invoke(
        {
            "process": "nemesis",
            "type": "info",
            "f": "start-clock",
            "value": {"mode": "bump", "target": "all", "delta_ms": 90_000},
        }
    )
    assert any(_routes(db, n) for n in db.names)
    # a fresh heal_all (as after a harness crash) finds and undoes all of it
    healed = nemeses.heal_all(db)
    assert {"partition", "clock", "pause", "kill"} <= set(healed)
    assert healed["kill"] == [b] and a in healed["pause"]
    for n in db.names:
        assert not _routes(db, n) and not _chain_rules(db, n)
        assert db.broker_state(n) == "running"
        assert db.remote(n).read_file(db.clock_offset_file(n)).strip() == b"+0.000"
    again = nem.heal_all()
    assert "partition" not in again and "kill" not in again and "clock" not in again
    assert _reaches(db, c, a)


def test_an_exception_mid_fault_still_heals(db: KafkaDB) -> None:
    n = nemeses.build(["partition", "pause"], db, db.test)
    with pytest.raises(RuntimeError, match="boom"), nemeses.healing(n):
        n.invoke(
            {
                "process": "nemesis",
                "type": "info",
                "f": "start-partition",
                "value": {"shape": "halves"},
            }
        )
        n.invoke(
            {"process": "nemesis", "type": "info", "f": "start-pause", "value": {"target": "one"}}
        )
        assert any(_routes(db, x) for x in db.names)
        raise RuntimeError("boom")
    assert all(not _routes(db, x) for x in db.names)
    assert all(db.broker_state(x) == "running" for x in db.names)


def test_collect_logs_copies_logs_configs_and_listing(db: KafkaDB, tmp_path: Path) -> None:
    got = db.collect_logs(tmp_path)
    assert sorted(got) == sorted(db.names)
    for name in db.names:
        d = tmp_path / name
        assert "registered in ZooKeeper" in (d / "logs" / "broker.log").read_text()
        assert (d / "broker" / "server.properties").exists()
        listing = (d / "data-listing.txt").read_text()
        assert "broker/data" in listing
    zk_node = db.zk_nodes[0].name
    assert (tmp_path / zk_node / "zk" / "zoo.cfg").exists()
    assert (tmp_path / zk_node / "logs" / "zookeeper.log").exists()


def test_second_install_is_skipped_when_the_build_hash_matches(db: KafkaDB) -> None:
    # one wheelhouse for both calls: other people editing the checkout change the hash
    wheels = build_wheelhouse(progress=db.progress)
    assert set(db.install(wheels).values()) <= {"up to date", "updated"}
    assert set(db.install(wheels).values()) == {"up to date"}


def test_process_fault_ops_record_errors_instead_of_raising(db: KafkaDB) -> None:
    n = nemeses.build(["pause"], db, db.test)
    bad = n.invoke(
        {"process": "nemesis", "type": "info", "f": "start-pause", "value": {"target": "nobody"}}
    )
    assert bad["type"] == "info" and "unknown target" in bad["error"]
    unknown = n.invoke({"process": "nemesis", "type": "info", "f": "start-kill"})
    assert "no fault handles" in unknown["error"]
    assert not n.active


def test_a_schedule_drives_faults_and_the_final_ops_heal_them(db: KafkaDB) -> None:
    kinds = ["partition", "partition-iptables", "pause", "kill", "clock"]
    n = nemeses.build(kinds, db, db.test)
    ops = nemeses.schedule(kinds, 0.05, seed=11, keys=KEYS)
    done = []
    with nemeses.healing(n):
        for op in ops:
            if op["type"] == "sleep":
                time.sleep(op["value"])
                continue
            done.append(n.invoke(op))
            if len(done) == 8:
                break
        for op in nemeses.final_ops(kinds):
            done.append(n.invoke(op))
    assert all("error" not in d for d in done), [d for d in done if "error" in d]
    assert not n.active
    for name in db.names:
        assert not _routes(db, name) and not _chain_rules(db, name)
        assert db.broker_state(name) == "running"
    db.wait_for_brokers(timeout=60)


def test_heal_all_restarts_crashed_brokers_but_not_stopped_ones(db: KafkaDB) -> None:
    crashed, stopped = db.names[3], db.names[4]
    db.kill(crashed)
    db.remote(stopped).stop_daemon(db.broker_pidfile(stopped))
    assert db.broker_state(crashed) == "down" and db.broker_state(stopped) == "stopped"
    healed = nemeses.heal_all(db)
    assert healed["kill"] == [crashed]
    assert db.broker_state(crashed) == "running" and db.broker_state(stopped) == "stopped"
    db.start(stopped)
    db.wait_for_brokers(timeout=60)
