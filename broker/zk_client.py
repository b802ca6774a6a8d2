"""Kafka's ZooKeeper layout, through kazoo (Kafka's KafkaZkClient).

Paths (under an optional chroot, e.g. `zookeeper.connect=zk1:2181,zk2:2181/isrlab`):

    /brokers/ids/<id>                        ephemeral: {"version":5,"host","port","endpoints",...}
    /controller                              ephemeral: {"version":1,"brokerid":N,"timestamp":..}
    /controller_epoch                        persistent: "N", bumped by every new controller (CAS)
    /brokers/topics/<t>                      {"version":3,"topic_id":..,"partitions":{"0":[1,2,3]}}
    /brokers/topics/<t>/partitions/<p>/state {"controller_epoch","leader","version":1,
                                              "leader_epoch","isr"}  (CAS on the znode version)
    /config/topics/<t>                       {"version":1,"config":{...}}  topic config overrides
    /admin/delete_topics/<t>                 deletion request, acted on by the controller
    /latest_producer_id_block                {"version":1,"broker":N,"block_start":..,"block_end":..}

kazoo is blocking and calls watches on its own thread; every call here is blocking too, and the
asyncio shells run them in a thread (`asyncio.to_thread`) and hop watch events back onto their
loop with `call_soon_threadsafe`.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from isrlab.broker import clock
from isrlab.broker.replication import LeaderAndIsr, TopicPartition, WriteStateZnode
from isrlab.broker.topics import TopicInfo

PRODUCER_ID_BLOCK = 1000
#: how often a registration looks again for an older session's znode to be gone
REGISTRATION_RETRY_S = 0.5


class BrokerIdTaken(RuntimeError):
    """Another live session holds `/brokers/ids/<id>` beyond the registration's wait."""

    def __init__(self, broker_id: int):
        super().__init__(
            f"broker id {broker_id} is already registered in ZooKeeper by a live broker"
        )


def parse_connect(connect: str) -> tuple[str, str]:
    """'h1:2181,h2:2181/chroot' -> ('h1:2181,h2:2181', '/chroot')."""
    if "/" in connect:
        hosts, _, chroot = connect.partition("/")
        return hosts, "/" + chroot.strip("/")
    return connect, ""


class KafkaZkClient:
    """Kafka's ZooKeeper layout on a kazoo client. `kazoo` builds the clients, called as
    `KazooClient(hosts=..., timeout=...)` is (the default; `harness.sim.kazoo_client`'s
    `SimKazooClient` bound to a simulated ensemble is the other)."""

    def __init__(
        self,
        connect: str,
        session_timeout_ms: int = 18000,
        kazoo: Callable[..., KazooClient] = KazooClient,
    ):
        hosts, chroot = parse_connect(connect)
        if chroot:
            # Create the chroot itself first (a chrooted client cannot).
            root = kazoo(hosts=hosts, timeout=session_timeout_ms / 1000)
            root.start(timeout=30)
            root.ensure_path(chroot)
            root.stop()
            root.close()
        self.zk = kazoo(hosts=hosts + chroot, timeout=session_timeout_ms / 1000)

    def start(self, timeout: float = 30) -> None:
        self.zk.start(timeout=timeout)
        for path in ("/brokers/ids", "/brokers/topics", "/config/topics", "/admin/delete_topics"):
            self.zk.ensure_path(path)

    def close(self) -> None:
        try:
            self.zk.stop()
        finally:
            self.zk.close()

    def cluster_id(self) -> str:
        """/cluster/id, created by the first broker (Kafka's layout)."""
        data = json.dumps({"version": "1", "id": clock.uuid4().hex[:22]}).encode()
        try:
            self.zk.create("/cluster/id", data, makepath=True)
        except NodeExistsError:
            pass
        raw, _ = self.zk.get("/cluster/id")
        return str(json.loads(raw)["id"])

    # ----- brokers --------------------------------------------------------------------------

    def register_broker(
        self,
        broker_id: int,
        host: str,
        port: int,
        endpoints: dict[str, tuple[str, int]] | None = None,
        clean_shutdown: bool = True,
    ) -> bool:
        """Create this broker's ephemeral `/brokers/ids/<id>` in the current session; True if
        it was created now, False if the session already holds it.

        A registration that exists belongs to this session (nothing to do), or to an older
        session of ours that has not expired yet, or to another live broker: waited for, then
        refused. Never decided by a plain read (a ZooKeeper follower may still show a znode
        whose session the leader already expired): the create goes through the leader, and the
        owner check follows a sync.

        `endpoints`: listener name -> advertised (host, port), every one PLAINTEXT (default:
        one PLAINTEXT listener at host:port, which also fills Kafka's legacy host/port).

        `clean_shutdown` (isrlab's field, KIP-966's broker registration adapted to ZooKeeper):
        false when this process started from logs its previous run did not close cleanly, so
        the controller takes it out of the eligible leader replicas."""
        data = self.broker_registration_data(host, port, endpoints, clean_shutdown)
        deadline = clock.monotonic() + self.registration_wait_s()
        while True:
            created = self.try_register_broker(broker_id, data)
            if created is not None:
                return created
            if clock.monotonic() >= deadline:
                raise BrokerIdTaken(broker_id)
            # an older session of ours that has not expired yet: wait for it
            clock.sleep(REGISTRATION_RETRY_S)

    def registration_wait_s(self) -> float:
        """How long a registration waits for an older session's znode to go: the session
        timeout, and some."""
        return float(self.zk._session_timeout) / 1000 + 5

    def broker_registration_data(
        self,
        host: str,
        port: int,
        endpoints: dict[str, tuple[str, int]] | None = None,
        clean_shutdown: bool = True,
    ) -> dict[str, Any]:
        """The JSON of `/brokers/ids/<id>` (see `register_broker`)."""
        endpoints = endpoints or {"PLAINTEXT": (host, port)}
        return {
            "version": 5,
            "host": host,
            "port": port,
            "endpoints": [
                f"{name}://{f'[{h}]' if ':' in h else h}:{p}" for name, (h, p) in endpoints.items()
            ],
            "listener_security_protocol_map": {name: "PLAINTEXT" for name in endpoints},
            "jmx_port": -1,
            "timestamp": str(clock.now_ms()),
            "clean_shutdown": clean_shutdown,
        }

    def try_register_broker(self, broker_id: int, data: dict[str, Any]) -> bool | None:
        """One attempt of `register_broker`: True if created now, False if this session
        already holds it, None if another session does (an older one of ours that has not
        expired yet, or another live broker's): the caller waits and tries again, or gives
        up (`BrokerIdTaken`) after `registration_wait_s`."""
        path = f"/brokers/ids/{broker_id}"
        try:
            self.zk.create(path, json.dumps(data).encode(), ephemeral=True)
            return True
        except NodeExistsError:
            self.zk.sync(path)
            stat = self.zk.exists(path)
            if stat is not None and stat.ephemeralOwner == self.zk.client_id[0]:
                return False
        return None

    def broker_ids(self) -> list[int]:
        return sorted(int(c) for c in self.zk.get_children("/brokers/ids"))

    def broker_address(self, broker_id: int) -> tuple[str, int] | None:
        try:
            data, _ = self.zk.get(f"/brokers/ids/{broker_id}")
        except NoNodeError:
            return None
        obj = json.loads(data)
        return obj["host"], int(obj["port"])

    def broker_endpoints(self, broker_id: int) -> dict[str, tuple[str, int]] | None:
        """A live broker's advertised (host, port) per listener name, None if not live."""
        try:
            data, _ = self.zk.get(f"/brokers/ids/{broker_id}")
        except NoNodeError:
            return None
        obj = json.loads(data)
        out: dict[str, tuple[str, int]] = {}
        for url in obj.get("endpoints") or []:
            name, _, rest = str(url).partition("://")
            host, _, port = rest.rpartition(":")
            out[name] = (host.strip("[]"), int(port))
        if not out and obj.get("host"):  # registered before endpoints were written
            out["PLAINTEXT"] = (obj["host"], int(obj["port"]))
        return out

    def broker_registration(self, broker_id: int) -> tuple[int, bool] | None:
        """A live broker's epoch (its registration's czxid, as Kafka's ZooKeeper mode has it)
        and whether it registered after a clean shutdown (true when the field is absent)."""
        try:
            data, stat = self.zk.get(f"/brokers/ids/{broker_id}")
        except NoNodeError:
            return None
        try:
            clean = json.loads(data).get("clean_shutdown", True) is not False
        except (ValueError, AttributeError):
            clean = True
        return stat.czxid, clean

    # ----- controller -----------------------------------------------------------------------

    def try_become_controller(self, broker_id: int) -> int | None:
        """Create the ephemeral /controller; on success bump /controller_epoch and return it.
        Safe to call again after a ConnectionLoss (Kafka's checked ephemeral create): a
        /controller this very session created counts as created."""
        data = json.dumps({"version": 1, "brokerid": broker_id, "timestamp": str(clock.now_ms())})
        try:
            self.zk.create("/controller", data.encode(), ephemeral=True)
        except NodeExistsError:
            session = self.zk.client_id
            try:
                _, stat = self.zk.get("/controller")
            except NoNodeError:
                return None  # gone meanwhile: the watch on it tries again
            if session is None or stat.ephemeralOwner != session[0]:
                return None
        while True:
            try:
                raw, stat = self.zk.get("/controller_epoch")
                epoch = int(raw) + 1
                self.zk.set("/controller_epoch", str(epoch).encode(), version=stat.version)
                return epoch
            except NoNodeError:
                try:
                    self.zk.create("/controller_epoch", b"1")
                    return 1
                except NodeExistsError:
                    continue
            except BadVersionError:
                continue

    def controller_id(self) -> int:
        try:
            data, _ = self.zk.get("/controller")
        except NoNodeError:
            return -1
        return int(json.loads(data)["brokerid"])

    # ----- topics ---------------------------------------------------------------------------

    def topics(self) -> list[str]:
        return sorted(self.zk.get_children("/brokers/topics"))

    def topic(self, name: str) -> TopicInfo | None:
        try:
            data, _ = self.zk.get(f"/brokers/topics/{name}")
        except NoNodeError:
            return None
        obj = json.loads(data)
        config: dict[str, Any] = {}
        try:
            cdata, _ = self.zk.get(f"/config/topics/{name}")
            config = json.loads(cdata).get("config", {})
        except NoNodeError:
            pass
        return TopicInfo(
            name=name,
            topic_id=uuid.UUID(obj["topic_id"])
            if obj.get("topic_id")
            else uuid.uuid5(uuid.NAMESPACE_URL, name),
            assignment={int(p): [int(b) for b in r] for p, r in obj["partitions"].items()},
            config=config,
        )

    def create_topic(self, info: TopicInfo) -> bool:
        """Write config then assignment (the controller reacts to the assignment). False if
        the topic exists."""
        self.zk.ensure_path("/config/topics")
        cfg = json.dumps({"version": 1, "config": info.config}).encode()
        try:
            self.zk.create(f"/config/topics/{info.name}", cfg)
        except NodeExistsError:
            self.zk.set(f"/config/topics/{info.name}", cfg)
        data = json.dumps(
            {
                "version": 3,
                "topic_id": str(info.topic_id),
                "partitions": {str(p): r for p, r in sorted(info.assignment.items())},
                "adding_replicas": {},
                "removing_replicas": {},
            }
        ).encode()
        try:
            self.zk.create(f"/brokers/topics/{info.name}", data)
        except NodeExistsError:
            return False
        return True

    def request_topic_deletion(self, name: str) -> None:
        try:
            self.zk.create(f"/admin/delete_topics/{name}", b"", makepath=True)
        except NodeExistsError:
            pass

    def delete_topic_znodes(self, name: str) -> None:
        for path in (f"/brokers/topics/{name}", f"/config/topics/{name}"):
            try:
                self.zk.delete(path, recursive=True)
            except NoNodeError:
                pass
        try:
            self.zk.delete(f"/admin/delete_topics/{name}")
        except NoNodeError:
            pass

    def deletion_requests(self) -> list[str]:
        return sorted(self.zk.get_children("/admin/delete_topics"))

    # ----- partition state ------------------------------------------------------------------

    def partition_state(self, tp: TopicPartition) -> LeaderAndIsr | None:
        try:
            data, stat = self.zk.get(f"/brokers/topics/{tp.topic}/partitions/{tp.partition}/state")
        except NoNodeError:
            return None
        return LeaderAndIsr.from_json(data, stat.version)

    def write_state(self, action: WriteStateZnode) -> tuple[bool, int]:
        """Compare-and-set of a partition state znode; (ok, new or current version).

        A conflict whose znode holds exactly the data written is this write's own, made by
        an attempt whose reply was lost with the connection (`zk_retry` makes it again):
        success at the znode's version, as Kafka's conditional update checks
        (`checkLeaderAndIsrZkData`)."""
        try:
            if action.expected_version is None or action.expected_version < 0:
                self.zk.create(action.path, action.data, makepath=True)
                return True, 0
            stat = self.zk.set(action.path, action.data, version=action.expected_version)
            return True, stat.version
        except (BadVersionError, NodeExistsError):
            try:
                data, stat = self.zk.get(action.path)
            except NoNodeError:
                return False, -1
            expected = action.expected_version
            ours = 0 if expected is None or expected < 0 else expected + 1  # what it would make
            if data == action.data and stat.version == ours:
                return True, stat.version
            return False, stat.version
        except NoNodeError:
            return False, -1

    # ----- producer ids ---------------------------------------------------------------------

    def allocate_producer_id_block(self, broker_id: int) -> tuple[int, int]:
        """Reserve the next block of producer ids by compare-and-set, as Kafka does."""
        path = "/latest_producer_id_block"
        while True:
            try:
                data, stat = self.zk.get(path)
                start = json.loads(data)["block_end"] + 1
                block = {
                    "version": 1,
                    "broker": broker_id,
                    "block_start": start,
                    "block_end": start + PRODUCER_ID_BLOCK - 1,
                }
                self.zk.set(path, json.dumps(block).encode(), version=stat.version)
                return start, start + PRODUCER_ID_BLOCK - 1
            except NoNodeError:
                block = {
                    "version": 1,
                    "broker": broker_id,
                    "block_start": 0,
                    "block_end": PRODUCER_ID_BLOCK - 1,
                }
                try:
                    self.zk.create(path, json.dumps(block).encode())
                    return 0, PRODUCER_ID_BLOCK - 1
                except NodeExistsError:
                    continue
            except BadVersionError:
                continue
