"""Broker configuration: a `server.properties` file with Kafka's key names, plus overrides.

Every key the broker understands is declared once in `CONFIG_DEFS` with its type, Kafka's default
and a one-line meaning; `docs/configuration.md` is generated from the same table
(`isrlab-broker config-doc`). Parsing is strict: an unknown key, a malformed line or a value of the
wrong type stops start-up with a `ConfigError` that names the key (and the file line), so a typo never
silently falls back to a default.

Values are parsed from strings exactly as Kafka does for its `server.properties`: integers in decimal,
booleans `true`/`false`, lists comma separated. Overrides (`--override key=value` on the CLI) take
precedence over the file.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    """A configuration problem the user must fix; the message says what and where."""


@dataclass(frozen=True)
class ConfigDef:
    name: str
    kind: str  # int | long | bool | string | list | double
    default: Any
    doc: str
    validator: Callable[[Any], str | None] | None = None


def _at_least(n: int) -> Callable[[Any], str | None]:
    def check(v: Any) -> str | None:
        return None if v is None or v >= n else f"must be >= {n}"

    return check


def _one_of(*choices: str) -> Callable[[Any], str | None]:
    def check(v: Any) -> str | None:
        return None if v in choices else f"must be one of {', '.join(choices)}"

    return check


def _one_of_int(*choices: int) -> Callable[[Any], str | None]:
    def check(v: Any) -> str | None:
        return None if v in choices else f"must be one of {', '.join(map(str, choices))}"

    return check


def _ratio(v: Any) -> str | None:
    return None if 0 <= v <= 1 else "must be between 0 and 1"


CLEANUP_POLICIES = ("compact", "delete")


def _cleanup_policy(v: Any) -> str | None:
    # Kafka's ValidList: every item one of the choices (an empty list is allowed, as in Kafka).
    bad = [item for item in v if item not in CLEANUP_POLICIES]
    return f"String must be one of: {', '.join(CLEANUP_POLICIES)}" if bad else None


_LISTENER = re.compile(
    r"^(?P<name>[A-Za-z0-9_]+)://(?P<host>\[[0-9A-Fa-f:.]*\]|[^:\s\[\]]*):(?P<port>\d+)$"
)
# The security protocols Kafka knows; this broker serves the first only.
SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SERVED_PROTOCOLS = ("PLAINTEXT",)


@dataclass(frozen=True)
class Endpoint:
    """One listener: NAME://host:port and the security protocol its name maps to."""

    name: str
    host: str
    port: int
    protocol: str

    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.name}://{host}:{self.port}"


def _listeners(v: Any) -> str | None:
    for item in v:
        m = _LISTENER.match(item)
        if not m:
            return f"'{item}' is not of the form NAME://host:port (e.g. PLAINTEXT://:9092)"
        if int(m.group("port")) > 65535:
            return f"port {m.group('port')} is not between 0 and 65535"
    return None


def _protocol_map(v: Any) -> str | None:
    for item in v:
        name, sep, protocol = item.partition(":")
        if not sep or not _LISTENER.match(f"{name}://:0"):
            return f"'{item}' is not of the form LISTENER_NAME:SECURITY_PROTOCOL"
        if protocol not in SECURITY_PROTOCOLS:
            return f"'{item}': security protocol must be one of {', '.join(SECURITY_PROTOCOLS)}"
    return None


def parse_per_ip_overrides(v: str) -> dict[str, int]:
    """max.connections.per.ip.overrides: host:count[,host:count] (the last ':' splits)."""
    out: dict[str, int] = {}
    for item in (part.strip() for part in v.split(",")):
        if not item:
            continue
        host, sep, count = item.rpartition(":")
        if not sep or not host or not count.isdigit():
            raise ValueError(f"'{item}' is not of the form host:count")
        out[host.strip("[]")] = int(count)
    return out


def _per_ip_overrides(v: Any) -> str | None:
    try:
        parse_per_ip_overrides(v)
    except ValueError as e:
        return str(e)
    return None


DAY_MS = 24 * 3600 * 1000

CONFIG_DEFS: dict[str, ConfigDef] = {
    d.name: d
    for d in [
        ConfigDef("broker.id", "int", 0, "This broker's id in the cluster.", _at_least(0)),
        ConfigDef(
            "listeners",
            "list",
            ["PLAINTEXT://127.0.0.1:9092"],
            "Where to accept Kafka clients: NAME://host:port, comma separated, each name once; "
            "every one is bound (an empty host: every interface). Each name's security "
            "protocol comes from listener.security.protocol.map and must be PLAINTEXT, the "
            "only one this broker serves; any other stops the start.",
            _listeners,
        ),
        ConfigDef(
            "listener.security.protocol.map",
            "list",
            [f"{p}:{p}" for p in SECURITY_PROTOCOLS],
            "Listener name to security protocol, NAME:PROTOCOL comma separated (e.g. "
            "INTERNAL:PLAINTEXT to name a second PLAINTEXT listener).",
            _protocol_map,
        ),
        ConfigDef(
            "advertised.listeners",
            "list",
            None,
            "Addresses given to clients (Metadata, FindCoordinator) and registered for the "
            "other brokers, per listener name, a subset of the names in listeners (unset: "
            "listeners). A client is given the addresses of the listener it connected to. An "
            "empty or 0.0.0.0 host is given as 127.0.0.1, a port 0 as the bound port.",
            _listeners,
        ),
        ConfigDef(
            "inter.broker.listener.name",
            "string",
            None,
            "The listener other brokers (replica fetchers, coordinators) connect to; one of "
            "advertised.listeners (unset: PLAINTEXT, as security.inter.broker.protocol's "
            "default names it).",
        ),
        ConfigDef(
            "log.dirs", "list", ["/tmp/isrlab-logs"], "Data directories (the first is used)."
        ),
        ConfigDef("num.partitions", "int", 1, "Partitions of auto-created topics.", _at_least(1)),
        ConfigDef(
            "default.replication.factor",
            "int",
            1,
            "Replication factor of auto-created topics.",
            _at_least(1),
        ),
        ConfigDef(
            "max.broker.partitions",
            "int",
            None,
            "Most partition replicas this broker hosts (KIP-578); CreateTopics and auto-creation "
            "past it fail with POLICY_VIOLATION and create nothing. Never above what the open-file "
            "limit allows: (ulimit -n minus a quarter for connections, minus 16 pooled older "
            "segments x 3) / 3 descriptors per partition, e.g. 240 at ulimit -n 1024, 4984 at "
            "20000; unset means that.",
            _at_least(1),
        ),
        ConfigDef(
            "auto.create.topics.enable",
            "bool",
            True,
            "Create a topic when a client asks Metadata for an unknown one.",
        ),
        ConfigDef(
            "delete.topic.enable",
            "bool",
            True,
            "Allow DeleteTopics (else TOPIC_DELETION_DISABLED).",
        ),
        ConfigDef(
            "log.segment.bytes", "int", 1 << 30, "Roll a segment at this size.", _at_least(14)
        ),
        ConfigDef("log.roll.ms", "long", 7 * DAY_MS, "Roll a segment this old.", _at_least(1)),
        ConfigDef(
            "log.index.size.max.bytes",
            "int",
            10 * 1024 * 1024,
            "Size of an offset/time index; a full index rolls the segment.",
            _at_least(24),
        ),
        ConfigDef(
            "log.index.interval.bytes",
            "int",
            4096,
            "Bytes of log between two sparse index entries.",
            _at_least(0),
        ),
        ConfigDef(
            "log.retention.ms",
            "long",
            7 * DAY_MS,
            "Delete segments whose newest record is older (-1: keep forever).",
            _at_least(-1),
        ),
        ConfigDef(
            "log.retention.bytes",
            "long",
            -1,
            "Delete old segments while a partition is larger (-1: no limit).",
            _at_least(-1),
        ),
        ConfigDef(
            "log.retention.check.interval.ms",
            "long",
            300000,
            "How often retention runs.",
            _at_least(1),
        ),
        ConfigDef(
            "log.cleanup.policy",
            "list",
            ["delete"],
            "Default cleanup.policy of topics: delete (retention by time and size), compact "
            "(keep the latest record of every key, docs/compaction.md) or both.",
            _cleanup_policy,
        ),
        ConfigDef(
            "log.cleaner.enable",
            "bool",
            True,
            "Run the log cleaner, which compacts topics with cleanup.policy=compact.",
        ),
        ConfigDef(
            "log.cleaner.threads",
            "int",
            1,
            "Log cleaner threads (each cleans one log at a time).",
            _at_least(0),
        ),
        ConfigDef(
            "log.cleaner.backoff.ms",
            "long",
            15000,
            "How long the cleaner sleeps when no log needs cleaning.",
            _at_least(0),
        ),
        ConfigDef(
            "log.cleaner.dedupe.buffer.size",
            "long",
            128 * 1024 * 1024,
            "Memory for the cleaner's offset maps (24 bytes per key, as Kafka counts it, shared "
            "by the threads); a dirty section with more keys is cleaned in several passes.",
            _at_least(1024 * 1024),
        ),
        ConfigDef(
            "log.cleaner.io.buffer.size",
            "int",
            512 * 1024,
            "Bytes the cleaner reads from a segment at a time.",
            _at_least(0),
        ),
        ConfigDef(
            "log.cleaner.min.cleanable.ratio",
            "double",
            0.5,
            "Default min.cleanable.dirty.ratio: a log is cleaned once its dirty (not yet "
            "compacted) bytes are at least this share of its bytes.",
            _ratio,
        ),
        ConfigDef(
            "log.cleaner.min.compaction.lag.ms",
            "long",
            0,
            "Default min.compaction.lag.ms: a record stays uncompacted at least this long.",
            _at_least(0),
        ),
        ConfigDef(
            "log.cleaner.delete.retention.ms",
            "long",
            DAY_MS,
            "Default delete.retention.ms: how long a tombstone (null value) is kept after the "
            "cleaner first rewrites it.",
            _at_least(0),
        ),
        ConfigDef(
            "log.flush.interval.messages",
            "long",
            None,
            "fsync after this many messages (unset: rely on the page cache, as Kafka does).",
            _at_least(1),
        ),
        ConfigDef(
            "log.flush.interval.ms",
            "long",
            None,
            "fsync when data is this old (unset: rely on the page cache).",
            _at_least(0),
        ),
        ConfigDef(
            "isrlab.power.journal.enable",
            "bool",
            True,
            "isrlab's own key (Kafka has none): record, after each successful fsync, how much of "
            "each file reached disk, in `.isrlab-synced` in the log dir (compacted at start-up). The "
            "power-loss nemesis (`isrlab-broker power-loss`) cuts files back to it; false "
            "records nothing (and removes an old journal), so a power loss cannot be applied.",
        ),
        ConfigDef(
            "log.flush.scheduler.interval.ms",
            "long",
            1000,
            "How often the time-based flush policy is checked.",
            _at_least(1),
        ),
        ConfigDef(
            "log.flush.offset.checkpoint.interval.ms",
            "long",
            60000,
            "How often recovery points are written to recovery-point-offset-checkpoint (a "
            "restart after a crash rescans the segments written since).",
            _at_least(1),
        ),
        ConfigDef(
            "log.flush.start.offset.checkpoint.interval.ms",
            "long",
            60000,
            "How often log start offsets are written to log-start-offset-checkpoint.",
            _at_least(1),
        ),
        ConfigDef(
            "message.max.bytes",
            "int",
            1048588,
            "Largest record batch a producer may send.",
            _at_least(0),
        ),
        ConfigDef(
            "socket.request.max.bytes",
            "int",
            104857600,
            "Largest request frame; bigger frames close the connection.",
            _at_least(1),
        ),
        ConfigDef(
            "queued.max.request.bytes",
            "long",
            None,
            "Bytes of request frames held at once over all connections, each from its size "
            "prefix until its handler has taken it (Kafka's request memory pool); a frame that "
            "does not fit waits and its connection is not read meanwhile. Unset: "
            "socket.request.max.bytes; -1 (Kafka's default): no bound. Otherwise at least "
            "socket.request.max.bytes.",
            _at_least(-1),
        ),
        ConfigDef(
            "max.connections",
            "int",
            2147483647,
            "Most client connections open at once over all listeners; past it new connections "
            "wait in the listen backlog until one closes (Kafka's blocking accept).",
            _at_least(0),
        ),
        ConfigDef(
            "max.connections.per.ip",
            "int",
            2147483647,
            "Most connections from one IP address; a connection past it is closed at once.",
            _at_least(0),
        ),
        ConfigDef(
            "max.connections.per.ip.overrides",
            "string",
            "",
            "Per-address exceptions to max.connections.per.ip: host:count[,host:count] (a "
            "host name is resolved at start).",
            _per_ip_overrides,
        ),
        ConfigDef(
            "connections.max.idle.ms",
            "long",
            600000,
            "Close a connection that has neither sent nor been sent anything for this long "
            "(and has no request being handled).",
            _at_least(1),
        ),
        ConfigDef(
            "request.read.timeout.ms",
            "long",
            30000,
            "isrlab's own key (Kafka has none): a request frame whose first byte arrived but "
            "which is not complete after this long (a client trickling bytes) closes its "
            "connection. Time a frame waits for queued.max.request.bytes does not count.",
            _at_least(1),
        ),
        ConfigDef(
            "zero.copy.threshold.bytes",
            "int",
            65536,
            "Fetch data at least this large is sent with sendfile (zero-copy); smaller is copied.",
            _at_least(0),
        ),
        ConfigDef(
            "min.insync.replicas",
            "int",
            1,
            "acks=all needs at least this many in-sync replicas.",
            _at_least(1),
        ),
        ConfigDef(
            "replica.lag.time.max.ms",
            "long",
            10000,
            "A follower not caught up for this long leaves the ISR.",
            _at_least(1),
        ),
        ConfigDef(
            "replica.fetch.wait.max.ms", "int", 500, "Follower fetch long-poll time.", _at_least(0)
        ),
        ConfigDef("replica.fetch.max.bytes", "int", 1048576, "Follower fetch size.", _at_least(1)),
        ConfigDef(
            "replica.high.watermark.checkpoint.interval.ms",
            "long",
            5000,
            "How often high watermarks are written to replication-offset-checkpoint.",
            _at_least(1),
        ),
        ConfigDef(
            "unclean.leader.election.enable",
            "bool",
            False,
            "HISTORIC FAILURE SWITCH: elect an out-of-sync replica when no ISR member is alive.",
        ),
        ConfigDef(
            "eligible.leader.replicas.enable",
            "bool",
            True,
            "KIP-966 eligible leader replicas: replicas leaving an ISR below min.insync.replicas "
            "stay electable, and a replica that restarted after an unclean shutdown is not "
            "elected while an eligible one may return. HISTORIC FAILURE SWITCH when false: the "
            "last ISR member is elected again whatever it lost. Set it alike on every broker.",
        ),
        ConfigDef(
            "replica.truncation.mode",
            "string",
            "leader-epoch",
            "leader-epoch (KIP-101 + KIP-279), or HISTORIC FAILURE SWITCHES: leader-epoch-v0 "
            "(KIP-101 without KIP-279) and high-watermark (pre-KIP-101).",
            _one_of("leader-epoch", "leader-epoch-v0", "high-watermark"),
        ),
        ConfigDef(
            "offsets.topic.num.partitions",
            "int",
            50,
            "Partitions of __consumer_offsets (fixed once the topic exists); the coordinator of "
            "group g leads partition abs(hash(g)) % this.",
            _at_least(1),
        ),
        ConfigDef(
            "offsets.topic.replication.factor",
            "int",
            3,
            "Replication factor of __consumer_offsets (capped by the live brokers).",
            _at_least(1),
        ),
        ConfigDef(
            "offsets.topic.segment.bytes",
            "int",
            100 * 1024 * 1024,
            "Segment size of __consumer_offsets (kept small so compaction can clean it).",
            _at_least(14),
        ),
        ConfigDef(
            "offsets.commit.required.acks",
            "int",
            -1,
            "HISTORIC FAILURE SWITCH at 1 (Kafka before 2.x could be set so): acknowledge an "
            "offset commit once the coordinator appended it, not once it is replicated; under "
            "coordinator failover a committed offset can go backwards. -1: acks=all.",
            _one_of_int(-1, 1),
        ),
        ConfigDef(
            "offsets.commit.timeout.ms",
            "int",
            5000,
            "How long an offset commit waits for its record to be replicated.",
            _at_least(1),
        ),
        ConfigDef(
            "offsets.retention.minutes",
            "int",
            7 * 24 * 60,
            "Committed offsets of a group that has been empty this long are deleted (KIP-211).",
            _at_least(1),
        ),
        ConfigDef(
            "offsets.retention.check.interval.ms",
            "long",
            600000,
            "How often expired offsets are looked for.",
            _at_least(1),
        ),
        ConfigDef(
            "offset.metadata.max.bytes",
            "int",
            4096,
            "Largest metadata string of an offset commit (else OFFSET_METADATA_TOO_LARGE).",
            _at_least(0),
        ),
        ConfigDef(
            "group.min.session.timeout.ms",
            "int",
            6000,
            "Smallest session.timeout.ms a member may ask for (else INVALID_SESSION_TIMEOUT).",
            _at_least(1),
        ),
        ConfigDef(
            "group.max.session.timeout.ms",
            "int",
            1800000,
            "Largest session.timeout.ms a member may ask for (else INVALID_SESSION_TIMEOUT).",
            _at_least(1),
        ),
        ConfigDef(
            "group.initial.rebalance.delay.ms",
            "int",
            3000,
            "An empty group's first rebalance waits this long for more members (extended by "
            "each new member, never past the rebalance timeout).",
            _at_least(0),
        ),
        ConfigDef(
            "group.max.size",
            "int",
            2147483647,
            "Most members of one group (else GROUP_MAX_SIZE_REACHED).",
            _at_least(1),
        ),
        ConfigDef("zookeeper.connect", "string", None, "host:port[,host:port][/chroot]."),
        ConfigDef(
            "zookeeper.session.timeout.ms",
            "int",
            18000,
            "ZooKeeper session timeout.",
            _at_least(1),
        ),
        ConfigDef(
            "controlled.shutdown.enable",
            "bool",
            True,
            "Move leadership away before a clean shutdown.",
        ),
        ConfigDef(
            "shutdown.timeout.ms",
            "long",
            30000,
            "A stop (SIGTERM/SIGINT) that has not finished after this long (a hung disk) is "
            "logged and the process exits with status 1; the next start recovers the logs. "
            "isrlab's own key: a Kafka broker's shutdown has no bound.",
            _at_least(1),
        ),
        ConfigDef(
            "transactional.id.expiration.ms",
            "long",
            7 * DAY_MS,
            "The transaction coordinator forgets a transactional id that has had no transaction "
            "for this long (its state record is deleted).",
            _at_least(1),
        ),
        ConfigDef(
            "transaction.state.log.num.partitions",
            "int",
            50,
            "Partitions of __transaction_state (fixed once the topic exists): the coordinator of "
            "a transactional id is the leader of partition abs(hash(id)) % this.",
            _at_least(1),
        ),
        ConfigDef(
            "transaction.state.log.replication.factor",
            "int",
            3,
            "Replication factor of __transaction_state (capped at the live brokers when the "
            "topic is created on the first FindCoordinator for a transactional id).",
            _at_least(1),
        ),
        ConfigDef(
            "transaction.state.log.min.isr",
            "int",
            2,
            "min.insync.replicas of __transaction_state (capped at its replication factor).",
            _at_least(1),
        ),
        ConfigDef(
            "transaction.state.log.segment.bytes",
            "int",
            104857600,
            "segment.bytes of __transaction_state.",
            _at_least(1024),
        ),
        ConfigDef(
            "transaction.max.timeout.ms",
            "int",
            900000,
            "Largest transaction.timeout.ms a producer may ask for (else "
            "INVALID_TRANSACTION_TIMEOUT).",
            _at_least(1),
        ),
        ConfigDef(
            "transaction.abort.timed.out.transaction.cleanup.interval.ms",
            "int",
            10000,
            "How often the coordinator looks for transactions past their timeout (and aborts "
            "them, fencing the producer's epoch).",
            _at_least(1),
        ),
        ConfigDef(
            "transaction.remove.expired.transaction.cleanup.interval.ms",
            "int",
            3600000,
            "How often the coordinator looks for transactional ids to expire.",
            _at_least(1),
        ),
        ConfigDef(
            "transaction.add.partitions.wait.ms",
            "long",
            1000,
            "An AddPartitionsToTxn or AddOffsetsToTxn that finds the producer's previous "
            "transaction still writing its markers waits up to this long for it to complete "
            "before CONCURRENT_TRANSACTIONS is answered (the client then retries after its "
            "back-off). isrlab's own key; 0 answers at once, as Kafka 3.x does. Only latency "
            "differs: the next transaction starts after the previous one is complete either way.",
            _at_least(0),
        ),
        ConfigDef(
            "transaction.partition.verification.enable",
            "bool",
            True,
            "KIP-890 part 1: before appending a transactional batch for a producer with no "
            "transaction open in the partition, the leader asks the coordinator whether the "
            "partition was added to an ongoing transaction (else INVALID_TXN_STATE). false is "
            "the historic, unsafe behaviour before Kafka 3.6: a produce delayed past its "
            "transaction's end opens a hanging transaction.",
        ),
        ConfigDef(
            "transaction.producer.epoch.fencing.enable",
            "bool",
            True,
            "HISTORIC FAILURE SWITCH at false (isrlab's own key, unsafe; also a topic config): "
            "a partition leader accepts batches and transaction markers of a producer epoch "
            "older than the one it knows instead of refusing them with INVALID_PRODUCER_EPOCH, "
            "so a fenced zombie producer still writes. true: Kafka's behaviour.",
        ),
        ConfigDef(
            "transaction.marker.required.acks",
            "int",
            -1,
            "HISTORIC FAILURE SWITCH at 1 (isrlab's own key, unsafe): a partition leader "
            "answers WriteTxnMarkers once it appended the marker, before its followers have it, "
            "so the coordinator completes a transaction whose marker a leader failover can "
            "still lose. -1 (Kafka's behaviour): once the ISR has it.",
            _one_of_int(-1, 1),
        ),
        ConfigDef(
            "producer.id.expiration.ms",
            "long",
            DAY_MS,
            "Forget idle idempotent producers after this long.",
            _at_least(1),
        ),
        ConfigDef(
            "request.timeout.ms.max",
            "int",
            300000,
            "Upper bound on a client's produce timeout.",
            _at_least(1),
        ),
        ConfigDef(
            "log.level",
            "string",
            "INFO",
            "Logging level.",
            _one_of("DEBUG", "INFO", "WARNING", "ERROR"),
        ),
    ]
}

# Topic-level keys (CreateTopics configs) and the broker key that supplies their default.
TOPIC_CONFIG_KEYS: dict[str, str] = {
    "segment.bytes": "log.segment.bytes",
    "segment.ms": "log.roll.ms",
    "segment.index.bytes": "log.index.size.max.bytes",
    "index.interval.bytes": "log.index.interval.bytes",
    "retention.ms": "log.retention.ms",
    "retention.bytes": "log.retention.bytes",
    "flush.messages": "log.flush.interval.messages",
    "flush.ms": "log.flush.interval.ms",
    "max.message.bytes": "message.max.bytes",
    "min.insync.replicas": "min.insync.replicas",
    "unclean.leader.election.enable": "unclean.leader.election.enable",
    "cleanup.policy": "log.cleanup.policy",
    "min.cleanable.dirty.ratio": "log.cleaner.min.cleanable.ratio",
    "min.compaction.lag.ms": "log.cleaner.min.compaction.lag.ms",
    "delete.retention.ms": "log.cleaner.delete.retention.ms",
    "transaction.producer.epoch.fencing.enable": "transaction.producer.epoch.fencing.enable",
}


def parse_value(d: ConfigDef, raw: str) -> Any:
    """Parse one raw string for key `d`; raise ConfigError naming the key on a bad value."""
    raw = raw.strip()
    try:
        if d.kind in ("int", "long"):
            value: Any = int(raw)
        elif d.kind == "double":
            value = float(raw)
        elif d.kind == "bool":
            low = raw.lower()
            if low not in ("true", "false"):
                raise ValueError("expected true or false")
            value = low == "true"
        elif d.kind == "list":
            value = [part.strip() for part in raw.split(",") if part.strip()]
        else:
            value = raw
    except ValueError as e:
        raise ConfigError(f"{d.name}: invalid value {raw!r} ({d.kind} expected: {e})") from None
    if d.validator is not None:
        problem = d.validator(value)
        if problem:
            raise ConfigError(f"{d.name}: invalid value {raw!r}: {problem}")
    return value


_PROPERTIES_WHITESPACE = " \t\f"
_PROPERTIES_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def _logical_lines(text: str) -> Iterable[tuple[int, str]]:
    """java.util.Properties' logical lines with the number of the line each starts on: comment
    and blank lines dropped, a line ending in an odd number of backslashes joined to the next
    one without that next line's leading whitespace (a comment line is never continued)."""
    natural = re.split(r"\r\n|\r|\n", text)
    i = 0
    while i < len(natural):
        lineno = i + 1
        line = natural[i].lstrip(_PROPERTIES_WHITESPACE)
        i += 1
        if not line or line[0] in "#!":
            continue
        parts: list[str] = []
        while True:
            trailing = len(line) - len(line.rstrip("\\"))
            if trailing % 2 == 0:
                parts.append(line)
                break
            parts.append(line[:-1])
            if i >= len(natural):
                break
            line = natural[i].lstrip(_PROPERTIES_WHITESPACE)
            i += 1
        yield lineno, "".join(parts)


def _unescape(raw: str, where: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(raw):
        c = raw[i]
        i += 1
        if c != "\\" or i >= len(raw):
            out.append(c)
            continue
        c = raw[i]
        i += 1
        if c == "u":
            digits = raw[i : i + 4]
            if len(digits) < 4 or any(d not in "0123456789abcdefABCDEF" for d in digits):
                raise ConfigError(f"{where}: malformed \\uxxxx escape {raw[i - 2 : i + 4]!r}")
            out.append(chr(int(digits, 16)))
            i += 4
        else:
            out.append(_PROPERTIES_ESCAPES.get(c, c))
    return "".join(out)


def parse_properties(text: str, source: str = "<string>") -> dict[str, str]:
    """Read a properties file with java.util.Properties.load's rules (as Kafka reads
    server.properties): the key ends at the first unescaped `=`, `:` or whitespace; whitespace,
    then one `=` or `:`, then whitespace separate it from the value; `\\` continues a line;
    `#` and `!` start comments; escapes `\\uXXXX`, `\\t`, `\\n`, `\\r`, `\\f` and `\\` before
    any other character (`\\:`, `\\=`, `\\ `, `\\\\`). A later duplicate key wins."""
    out: dict[str, str] = {}
    for lineno, line in _logical_lines(text):
        where = f"{source}:{lineno}"
        i, n = 0, len(line)
        while i < n and line[i] not in "=:" + _PROPERTIES_WHITESPACE:
            i += 2 if line[i] == "\\" else 1
        key_end = min(i, n)
        while i < n and line[i] in _PROPERTIES_WHITESPACE:
            i += 1
        if i < n and line[i] in "=:":
            i += 1
        while i < n and line[i] in _PROPERTIES_WHITESPACE:
            i += 1
        out[_unescape(line[:key_end], where)] = _unescape(line[i:], where)
    return out


def read_properties_file(path: Path) -> dict[str, str]:
    """A server.properties file's entries; ConfigError if it cannot be read or is not text."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise ConfigError(f"cannot read config file {path}: {e.strerror}") from None
    try:
        nul = data.find(b"\0")
        if nul >= 0:
            raise ValueError(f"a NUL byte at offset {nul}")
        text = data.decode("utf-8")
    except (ValueError, UnicodeDecodeError) as e:
        why = f"invalid UTF-8 at offset {e.start}" if isinstance(e, UnicodeDecodeError) else e
        raise ConfigError(
            f"{path} is not a text properties file ({why}); give --config a server.properties "
            "of key=value lines"
        ) from None
    return parse_properties(text, str(path))


class BrokerConfig(Mapping[str, Any]):
    """The broker's effective configuration: defaults < file < overrides."""

    def __init__(self, values: Mapping[str, str] | None = None, source: str = "<overrides>"):
        self._values: dict[str, Any] = {name: d.default for name, d in CONFIG_DEFS.items()}
        self._explicit: set[str] = set()
        # listener.name.<name>.max.connections, by listener name (upper case, as in listeners)
        self.listener_max_connections: dict[str, int] = {}
        self.update_raw(values or {}, source)
        self.check()

    def update_raw(self, raw: Mapping[str, str], source: str) -> None:
        for key, value in raw.items():
            d = CONFIG_DEFS.get(key)
            if d is None and key.startswith(LISTENER_PREFIX):
                self._set_listener_key(key, value, source)
                continue
            if d is None:
                close = [k for k in CONFIG_DEFS if k.split(".")[-1] == key.split(".")[-1]]
                hint = f" (did you mean {close[0]}?)" if close else ""
                raise ConfigError(
                    f"{source}: unknown configuration key {key!r}{hint}; "
                    "see `isrlab-broker config-doc` for the keys this broker understands"
                )
            self._values[key] = parse_value(d, value)
            self._explicit.add(key)

    def _set_listener_key(self, key: str, value: str, source: str) -> None:
        """Kafka's listener-prefixed keys: `listener.name.<listener, lower case>.<key>`. Of the
        keys Kafka takes per listener, this broker serves max.connections (no TLS, no SASL)."""
        name, _, rest = key[len(LISTENER_PREFIX) :].partition(".")
        if rest not in LISTENER_KEYS or not name:
            raise ConfigError(
                f"{source}: unknown configuration key {key!r}: of Kafka's per-listener keys "
                f"(listener.name.<listener>.<key>) this broker understands "
                f"{', '.join(LISTENER_KEYS)} only"
            )
        if name != name.lower():
            raise ConfigError(
                f"{source}: {key}: the listener name in a listener.name. key is written in lower "
                f"case, as Kafka reads it: listener.name.{name.lower()}.{rest}"
            )
        parsed = parse_value(dataclasses.replace(LISTENER_KEYS[rest], name=key), value)
        self.listener_max_connections[name.upper()] = int(parsed)

    @classmethod
    def load(cls, path: Path | None, overrides: Iterable[str] = ()) -> BrokerConfig:
        cfg = cls()
        if path is not None:
            cfg.update_raw(read_properties_file(Path(path)), str(path))
        parsed: dict[str, str] = {}
        for item in overrides:
            if "=" not in item:
                raise ConfigError(f"override {item!r} is not of the form key=value")
            k, v = item.split("=", 1)
            parsed[k.strip()] = v
        cfg.update_raw(parsed, "--override")
        cfg.check()
        return cfg

    def check(self) -> None:
        """Rules that span keys (each key's own rules are checked as it is parsed)."""
        names = [e.name for e in self.listener_endpoints()]
        for name in self.listener_max_connections:
            if name not in names:
                raise ConfigError(
                    f"listener.name.{name.lower()}.max.connections: there is no listener named "
                    f"{name} in listeners ({','.join(self['listeners'])})"
                )
        self.advertised_endpoints()
        self.inter_broker_listener()
        queued, frame = self["queued.max.request.bytes"], self["socket.request.max.bytes"]
        if queued is not None and 0 < queued < frame:
            raise ConfigError(
                f"queued.max.request.bytes={queued} is smaller than socket.request.max.bytes="
                f"{frame}: a request of that size could never be read; raise it or leave it "
                "unset"
            )

    @property
    def queued_max_request_bytes(self) -> int | None:
        """The request-memory budget in bytes; None means no bound (Kafka's -1)."""
        queued = self["queued.max.request.bytes"]
        if queued is None:
            return int(self["socket.request.max.bytes"])
        return int(queued) if queued > 0 else None

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def is_explicit(self, key: str) -> bool:
        return key in self._explicit

    # Convenience accessors used across the broker.
    @property
    def broker_id(self) -> int:
        return int(self["broker.id"])

    @property
    def log_dir(self) -> Path:
        return Path(self["log.dirs"][0])

    def _protocols(self) -> dict[str, str]:
        return dict(item.split(":", 1) for item in self["listener.security.protocol.map"])

    def _endpoints(self, key: str, items: list[str]) -> list[Endpoint]:
        protocols = self._protocols()
        seen: dict[str, str] = {}
        ports: dict[int, str] = {}
        out = []
        for item in items:
            m = _LISTENER.match(item)
            assert m is not None  # validated on parse
            name, host, port = m.group("name"), m.group("host").strip("[]"), int(m.group("port"))
            map_note = (
                f" (listener.security.protocol.map={','.join(self['listener.security.protocol.map'])})"
                if self.is_explicit("listener.security.protocol.map")
                else ""
            )
            protocol = protocols.get(name)
            if protocol is None:
                raise ConfigError(
                    f"{key}: listener {item} has no security protocol in "
                    f"listener.security.protocol.map{map_note}; add {name}:PLAINTEXT to it"
                )
            if protocol not in SERVED_PROTOCOLS:
                raise ConfigError(
                    f"{key}: listener {item} uses security protocol {protocol}{map_note}; this "
                    f"broker serves {', '.join(SERVED_PROTOCOLS)} only (no TLS, no SASL)"
                )
            if name in seen:
                raise ConfigError(
                    f"{key}: listener name {name} is used twice ({seen[name]}, {item}); each "
                    "listener needs its own name"
                )
            if port != 0 and port in ports and key == "listeners":
                raise ConfigError(
                    f"{key}: {ports[port]} and {item} use the same port; each listener needs "
                    "its own port"
                )
            seen[name] = item
            ports[port] = item
            out.append(Endpoint(name, host, port, protocol))
        return out

    def listener_endpoints(self) -> list[Endpoint]:
        """The listeners to bind, in the order given (an empty host: every interface)."""
        if not self["listeners"]:
            raise ConfigError("listeners: at least one listener is needed")
        return self._endpoints("listeners", self["listeners"])

    def advertised_endpoints(self) -> list[Endpoint]:
        """The addresses given out per listener name (0 ports are filled in once bound)."""
        if self["advertised.listeners"] is None:
            endpoints = self.listener_endpoints()
        else:
            endpoints = self._endpoints("advertised.listeners", self["advertised.listeners"])
            bound = {e.name for e in self.listener_endpoints()}
            for e in endpoints:
                if e.name not in bound:
                    raise ConfigError(
                        f"advertised.listeners: listener name {e.name} is not in listeners "
                        f"({','.join(self['listeners'])}); advertised.listeners names a subset"
                    )
        return [
            Endpoint(
                e.name, "127.0.0.1" if e.host in ("", "0.0.0.0") else e.host, e.port, e.protocol
            )
            for e in endpoints
        ]

    def inter_broker_listener(self) -> str:
        """The listener name other brokers connect to."""
        name = self["inter.broker.listener.name"] or "PLAINTEXT"
        advertised = [e.name for e in self.advertised_endpoints()]
        if name not in advertised:
            how = (
                "inter.broker.listener.name"
                if self["inter.broker.listener.name"]
                else "inter.broker.listener.name (unset, so PLAINTEXT)"
            )
            raise ConfigError(
                f"{how} must be one of the advertised listener names ({', '.join(advertised)}); "
                "set inter.broker.listener.name"
            )
        return str(name)

    def topic_defaults(self) -> dict[str, Any]:
        return {topic_key: self[broker_key] for topic_key, broker_key in TOPIC_CONFIG_KEYS.items()}


def parse_topic_configs(
    raw: Mapping[str, str | None], defaults: Mapping[str, Any]
) -> dict[str, Any]:
    """Validate CreateTopics configs against the topic keys; return the effective topic config."""
    out = dict(defaults)
    for key, value in raw.items():
        broker_key = TOPIC_CONFIG_KEYS.get(key)
        if broker_key is None:
            raise ConfigError(
                f"unknown topic config {key!r}; known: {', '.join(TOPIC_CONFIG_KEYS)}"
            )
        if value is None:
            continue
        d = CONFIG_DEFS[broker_key]
        out[key] = parse_value(ConfigDef(key, d.kind, d.default, d.doc, d.validator), value)
    return out


LISTENER_PREFIX = "listener.name."
#: The keys Kafka lets a listener override (`listener.name.<listener>.<key>`) that this broker
#: serves, each with its own definition.
LISTENER_KEYS: dict[str, ConfigDef] = {
    "max.connections": ConfigDef(
        "listener.name.<listener>.max.connections",
        "int",
        None,
        "Most connections open at once on this listener (its name in lower case, e.g. "
        "listener.name.internal.max.connections); a new one waits in the listen backlog while the "
        "listener or the broker (max.connections) is full. The inter-broker listener may pass "
        "max.connections but not its own limit.",
        _at_least(0),
    ),
}


def config_doc_markdown() -> str:
    lines = [
        "# Broker configuration",
        "",
        "Generated by `isrlab-broker config-doc` from `broker/config.py`. Keys are Kafka's; a "
        "`server.properties` file is read as Java reads a properties file (`key=value`, `key: value` or "
        "`key value`, `\\` continuation lines, `#`/`!` comments, `\\uXXXX` escapes) and "
        "`--override key=value` wins over it.",
        "",
        "| key | type | default | meaning |",
        "|---|---|---|---|",
    ]
    for d in CONFIG_DEFS.values():
        default = ",".join(d.default) if isinstance(d.default, list) else d.default
        default = (
            "(unset)"
            if default is None
            else str(default).lower()
            if isinstance(default, bool)
            else default
        )
        lines.append(f"| `{d.name}` | {d.kind} | `{default}` | {d.doc} |")
    lines += [
        "",
        "Per-listener keys (Kafka's `listener.name.<listener>.` prefix, the listener's name in "
        "lower case); unset, the broker-wide key alone applies:",
        "",
        "| key | type | default | meaning |",
        "|---|---|---|---|",
    ]
    lines += [f"| `{d.name}` | {d.kind} | (unset) | {d.doc} |" for d in LISTENER_KEYS.values()]
    lines += [
        "",
        "Topic-level keys accepted by CreateTopics (default from the broker key):",
        "",
        "| topic key | broker default key |",
        "|---|---|",
    ]
    lines += [f"| `{t}` | `{b}` |" for t, b in TOPIC_CONFIG_KEYS.items()]
    return "\n".join(lines) + "\n"
