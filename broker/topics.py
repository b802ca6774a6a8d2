"""Topic names, ids and assignments, and where they are kept.

A topic is a name, a 16-byte topic id, a replica assignment (partition -> broker ids, first one the
preferred leader) and topic-level config overrides. Two stores keep them with the same interface:

- `LocalTopicStore`: a JSON file in the log dir, for a standalone broker (no ZooKeeper). Written
  atomically (tmp + fsync + rename) so a crash leaves the old or the new version, never half of one.
- `broker.zk.ZkTopicStore`: `/brokers/topics/<t>` in ZooKeeper, Kafka's layout, for a cluster.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from isrlab.broker.log import durable

LEGAL_TOPIC = re.compile(r"^[a-zA-Z0-9._-]+$")
MAX_TOPIC_LENGTH = 249


def topic_name_problem(name: str | None) -> str | None:
    """Kafka's topic-name rules; returns why a name is illegal, or None."""
    if not name:
        return "topic name is empty"
    if name in (".", ".."):
        return "topic name cannot be '.' or '..'"
    if len(name) > MAX_TOPIC_LENGTH:
        return f"topic name is longer than {MAX_TOPIC_LENGTH} characters"
    if not LEGAL_TOPIC.match(name):
        return "topic name may contain only ASCII letters, digits, '.', '_' and '-'"
    return None


@dataclass
class TopicInfo:
    name: str
    topic_id: uuid.UUID
    assignment: dict[int, list[int]]  # partition -> replicas
    config: dict[str, Any] = field(default_factory=dict)  # overrides only

    @property
    def num_partitions(self) -> int:
        return len(self.assignment)

    @property
    def replication_factor(self) -> int:
        return len(next(iter(self.assignment.values()))) if self.assignment else 0

    def to_json(self) -> dict[str, Any]:
        return {
            "id": str(self.topic_id),
            "partitions": {str(p): r for p, r in sorted(self.assignment.items())},
            "config": self.config,
        }

    @classmethod
    def from_json(cls, name: str, data: dict[str, Any]) -> TopicInfo:
        return cls(
            name=name,
            topic_id=uuid.UUID(data["id"]),
            assignment={int(p): [int(b) for b in r] for p, r in data["partitions"].items()},
            config=dict(data.get("config", {})),
        )


class TopicStore(Protocol):
    def all(self) -> dict[str, TopicInfo]: ...

    def create(self, info: TopicInfo) -> None: ...

    def delete(self, name: str) -> None: ...


class LocalTopicStore:
    FILE = "isrlab-topics.json"

    def __init__(self, log_dir: Path):
        self.path = Path(log_dir) / self.FILE
        self._topics: dict[str, TopicInfo] = {}
        if self.path.exists():
            try:
                raw = json.loads(self.path.read_text())
                self._topics = {n: TopicInfo.from_json(n, d) for n, d in raw.items()}
            except (ValueError, KeyError, TypeError) as e:
                raise RuntimeError(
                    f"{self.path} is not a valid topic store ({e}); restore it or remove the log dir"
                ) from None

    def all(self) -> dict[str, TopicInfo]:
        return dict(self._topics)

    def create(self, info: TopicInfo) -> None:
        self._topics[info.name] = info
        self._save()

    def delete(self, name: str) -> None:
        self._topics.pop(name, None)
        self._save()

    def _save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        data = json.dumps({n: t.to_json() for n, t in self._topics.items()}, indent=1)
        with open(tmp, "w") as f:
            f.write(data)
            f.flush()
            durable.fsync_fd(f.fileno(), tmp)
        durable.replace(tmp, self.path)
        durable.fsync_dir(self.path.parent)


def assign_replicas(
    num_partitions: int, replication_factor: int, brokers: list[int], start: int = 0
) -> dict[int, list[int]]:
    """Round-robin assignment without racks, as Kafka's AdminUtils does (leader shifted per partition,
    followers spread by an increasing shift)."""
    brokers = sorted(brokers)
    n = len(brokers)
    if replication_factor > n:
        raise ValueError(f"replication factor {replication_factor} is larger than {n} live brokers")
    out: dict[int, list[int]] = {}
    shift = start % n if n else 0
    for p in range(num_partitions):
        first = (start + p) % n
        if p > 0 and p % n == 0:
            shift += 1
        replicas = [brokers[first]]
        for j in range(replication_factor - 1):
            replicas.append(brokers[(first + 1 + (shift + j) % (n - 1)) % n])
        out[p] = replicas
    return out
