"""Owns every partition log in the broker's log dir (Kafka's LogManager).

Opens the `<topic>-<partition>` directories at start-up (recovering those that were not shut down
cleanly, from the recovery point in `recovery-point-offset-checkpoint`), creates and deletes
partition logs, runs the retention and flush schedulers, and writes the log-dir checkpoints
(`recovery-point-offset-checkpoint`, `log-start-offset-checkpoint`). The high watermark checkpoint
(`replication-offset-checkpoint`) belongs to the ReplicaManager.

Storage failures: a partition log that cannot be opened (recovery cannot write on a full disk)
stops the start with one KafkaStorageError naming it. A checkpoint that cannot be written at
start, after retention or at close is logged and the broker goes on: the periodic writers retry,
and an older checkpoint only means a longer recovery. `close` closes every log it can and
reports what it could not, so a shutdown never stops half-way.

Log directory failure: a read that meets a corrupt batch no recovery checked
(``recovery.CorruptLogData``), or a failed fsync of a segment (after which the page cache cannot
be trusted: the append already in the log stays unacknowledged, and no retry of the fsync may
declare it durable), takes the log directory offline, as Kafka's LogDirFailureChannel does with
a KafkaStorageException. The broker has one log dir, so, like Kafka when its last log
dir fails, it halts (exit status 1) after one ERROR line naming the file, the byte offset and
what to do; it leaves every ISR when its ZooKeeper session ends and the controller elects other
leaders. Before halting it writes the partition's recovery point back to the damaged segment's
base offset, so the next start rescans that segment and refuses the directory with
``LogDirFailure``'s one line instead of serving the batch again.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import logging
import os
import shutil
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from isrlab.broker import clock as broker_clock
from isrlab.broker.config import BrokerConfig
from isrlab.broker.log import durable
from isrlab.broker.log.checkpoint import OffsetCheckpointFile
from isrlab.broker.log.cleaner import CleanerConfig, LogCleaner
from isrlab.broker.log.errors import KafkaStorageError
from isrlab.broker.log.log import Log, LogConfig
from isrlab.broker.log.recovery import CorruptLogData, LogDirFailure

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]
T = TypeVar("T")


def log_config_from(topic_config: dict[str, Any]) -> LogConfig:
    """Map topic-level keys (segment.bytes, ...) to the storage layer's LogConfig."""
    return LogConfig(
        segment_bytes=int(topic_config["segment.bytes"]),
        segment_ms=int(topic_config["segment.ms"]),
        segment_index_bytes=int(topic_config["segment.index.bytes"]),
        index_interval_bytes=int(topic_config["index.interval.bytes"]),
        retention_ms=int(topic_config["retention.ms"]),
        retention_bytes=int(topic_config["retention.bytes"]),
        flush_interval_messages=topic_config["flush.messages"],
        flush_interval_ms=topic_config["flush.ms"],
        max_message_bytes=int(topic_config["max.message.bytes"]),
        cleanup_policy=_policy(topic_config["cleanup.policy"]),
        min_cleanable_dirty_ratio=float(topic_config["min.cleanable.dirty.ratio"]),
        min_compaction_lag_ms=int(topic_config["min.compaction.lag.ms"]),
        delete_retention_ms=int(topic_config["delete.retention.ms"]),
    )


def _policy(value: str | list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """cleanup.policy as parsed (a list) or as written ("compact,delete")."""
    if isinstance(value, str):
        value = value.split(",")
    return tuple(item.strip() for item in value if item.strip())


def halt(status: int) -> None:
    """Kafka's Exit.halt: end the process now, without shutdown hooks (after the log lines)."""
    logging.shutdown()
    sys.stderr.flush()
    os._exit(status)


def parse_dir_name(name: str) -> TopicPartition | None:
    topic, sep, part = name.rpartition("-")
    if not sep or not part.isdigit() or not topic:
        return None
    return topic, int(part)


class LogManager:
    RECOVERY_POINT = "recovery-point-offset-checkpoint"
    LOG_START = "log-start-offset-checkpoint"

    def __init__(self, config: BrokerConfig):
        self.config = config
        self.dir = config.log_dir
        self.dir.mkdir(parents=True, exist_ok=True)
        # Record what reaches disk (isrlab's power-loss nemesis cuts files back to it); first,
        # before any file here is written.
        durable.attach(self.dir, enabled=config["isrlab.power.journal.enable"])
        self.logs: dict[TopicPartition, Log] = {}
        self._recovery_cp = OffsetCheckpointFile(self.dir / self.RECOVERY_POINT)
        self._log_start_cp = OffsetCheckpointFile(self.dir / self.LOG_START)
        self._tasks: list[asyncio.Task[None]] = []
        # Retention never deletes data consumers cannot have read yet (the ReplicaManager
        # supplies each partition's high watermark).
        self.high_watermark: Callable[[TopicPartition], int | None] = lambda tp: None
        # The cleaner never cleans past the last stable offset (Kafka's first uncleanable
        # offset): a record of an open transaction may still be aborted, and the value it
        # would supersede must stay. None falls back to the high watermark.
        self.last_stable_offset: Callable[[TopicPartition], int | None] = lambda tp: None
        self._loop: asyncio.AbstractEventLoop | None = None
        #: how the broker ends when its log dir goes offline (tests replace it)
        self.halt: Callable[[int], None] = halt
        self.offline_reason: str | None = None
        # Log compaction (cleanup.policy=compact): threads started with the schedulers (a task
        # on the loop when the clock allows no worker threads); they plan and swap on the
        # event loop (_run_on_loop), the logs' only thread.
        self.cleaner = LogCleaner(
            self.dir,
            CleanerConfig.from_broker(config),
            logs=lambda: self.logs,
            high_watermark=self._cleanable_bound,
            run_on_owner=self._run_on_loop,
        )

    def _cleanable_bound(self, tp: TopicPartition) -> int | None:
        lso = self.last_stable_offset(tp)
        return self.high_watermark(tp) if lso is None else lso

    def load(self, topic_configs: dict[str, dict[str, Any]]) -> None:
        """Open every partition directory of a known topic; recover unclean ones."""
        recovery = self._read_cp(self._recovery_cp)
        starts = self._read_cp(self._log_start_cp)
        for child in sorted(self.dir.iterdir()):
            if not child.is_dir():
                continue
            tp = parse_dir_name(child.name)
            if tp is None:
                continue
            if tp[0] not in topic_configs:
                log.warning("log dir %s belongs to no known topic; removing it", child)
                shutil.rmtree(child, ignore_errors=True)
                continue
            t0 = broker_clock.monotonic()
            try:
                self.logs[tp] = Log.open(
                    child,
                    log_config_from(topic_configs[tp[0]]),
                    recovery_point=recovery.get(tp, 0),
                    log_start_offset=starts.get(tp),
                    clock=broker_clock.time,
                )
            except LogDirFailure:
                raise  # names the damaged file and what to do already
            except (KafkaStorageError, OSError) as e:
                raise KafkaStorageError(
                    f"cannot load partition log {child}: {e}; fix the log dir (free space on a "
                    "full disk) and start again"
                ) from e
            lg = self.logs[tp]
            lg.on_storage_failure = functools.partial(self._log_dir_failed, tp)
            lg.on_truncate = functools.partial(self.cleaner.truncated, tp)
            log.info(
                "loaded %s-%d: log start %d, end %d (%.1f ms)",
                tp[0],
                tp[1],
                lg.log_start_offset,
                lg.log_end_offset,
                (broker_clock.monotonic() - t0) * 1000,
            )

    @staticmethod
    def _read_cp(cp: OffsetCheckpointFile) -> dict[TopicPartition, int]:
        try:
            return dict(cp.read())
        except FileNotFoundError:
            return {}
        except Exception as e:
            log.warning("ignoring unreadable checkpoint %s: %s", cp.path, e)
            return {}

    def get_or_create(self, tp: TopicPartition, topic_config: dict[str, Any]) -> Log:
        lg = self.logs.get(tp)
        if lg is None:
            path = self.dir / f"{tp[0]}-{tp[1]}"
            path.mkdir(parents=True, exist_ok=True)
            lg = Log.open(path, log_config_from(topic_config), clock=broker_clock.time)
            lg.on_storage_failure = functools.partial(self._log_dir_failed, tp)
            lg.on_truncate = functools.partial(self.cleaner.truncated, tp)
            self.logs[tp] = lg
        return lg

    def _log_dir_failed(self, tp: TopicPartition, exc: KafkaStorageError) -> None:
        """Take the log dir offline: the broker halts (see the module docstring)."""
        if self.offline_reason is not None:
            return
        part_dir = self.dir / f"{tp[0]}-{tp[1]}"
        self.offline_reason = str(exc)
        if isinstance(exc, CorruptLogData):
            offsets = self._recovery_points()
            offsets[tp] = min(offsets.get(tp, 0), exc.segment_base)
            try:
                self._recovery_cp.write(offsets)
            except (KafkaStorageError, OSError) as e:
                log.error("could not write %s: %s", self._recovery_cp.path, e)
        if isinstance(exc, CorruptLogData):
            log.error(
                "Shutdown broker because all log dirs in %s have failed: %s. The next start "
                "rescans the segment and refuses %s until it is restored from a replica (move "
                "the directory away and restart; it re-replicates)",
                self.dir,
                exc,
                part_dir,
            )
        else:
            log.error(
                "Shutdown broker because all log dirs in %s have failed: %s. Nothing written "
                "to %s since its last good fsync can be trusted to be on disk; check the "
                "device (dmesg), then restart: the next start recovers the unflushed tail",
                self.dir,
                exc,
                part_dir,
            )
        self.halt(1)

    def delete(self, tp: TopicPartition) -> None:
        self.cleaner.abort(tp)
        lg = self.logs.pop(tp, None)
        if lg is not None:
            lg.delete()

    def _recovery_points(self) -> dict[TopicPartition, int]:
        return {tp: lg.recovery_point for tp, lg in self.logs.items()}

    def _log_start_offsets(self) -> dict[TopicPartition, int]:
        return {tp: lg.log_start_offset for tp, lg in self.logs.items()}

    def checkpoint(self) -> None:
        self._recovery_cp.write(self._recovery_points())
        self._log_start_cp.write(self._log_start_offsets())

    def try_checkpoint(self) -> int:
        """Write both checkpoints; one that cannot be written is logged, not raised (an older
        checkpoint is still correct: the next start recovers more). Returns the failures."""
        failures = 0
        for cp, offsets in (
            (self._recovery_cp, self._recovery_points()),
            (self._log_start_cp, self._log_start_offsets()),
        ):
            try:
                cp.write(offsets)
            except (KafkaStorageError, OSError) as e:
                failures += 1
                log.error("could not write %s: %s", cp.path, e)
        return failures

    def _run_on_loop(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the event loop that owns the logs and wait for its result (called from
        the cleaner threads; runs ``fn`` directly without a loop or on the loop itself: the
        cleaner's task when the clock allows no worker threads)."""
        loop = self._loop
        if loop is None:
            return fn()
        try:
            if asyncio.get_running_loop() is loop:
                return fn()
        except RuntimeError:
            pass
        done: concurrent.futures.Future[T] = concurrent.futures.Future()

        def call() -> None:
            try:
                done.set_result(fn())
            except BaseException as e:
                done.set_exception(e)

        loop.call_soon_threadsafe(call)
        return done.result()

    def start_schedulers(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.cleaner.start()
        self._tasks.append(asyncio.create_task(self._retention_loop()))
        self._tasks.append(asyncio.create_task(self._flush_loop()))
        # Kafka's periodic checkpoint tasks, written off the event loop
        self._tasks.append(
            asyncio.create_task(
                self._recovery_cp.write_every(
                    self.config["log.flush.offset.checkpoint.interval.ms"] / 1000,
                    self._recovery_points,
                )
            )
        )
        self._tasks.append(
            asyncio.create_task(
                self._log_start_cp.write_every(
                    self.config["log.flush.start.offset.checkpoint.interval.ms"] / 1000,
                    self._log_start_offsets,
                )
            )
        )

    async def _retention_loop(self) -> None:
        interval = self.config["log.retention.check.interval.ms"] / 1000
        while True:
            await asyncio.sleep(interval)
            self.run_retention()

    def run_retention(self) -> int:
        deleted = 0
        for tp, lg in list(self.logs.items()):
            try:
                n = lg.delete_old_segments(self.high_watermark(tp))
            except Exception:
                log.exception("retention failed for %s-%d", *tp)
                continue
            if n:
                log.info("retention deleted %d segment(s) of %s-%d", n, *tp)
                deleted += n
        if deleted:
            self.try_checkpoint()
        return deleted

    async def _flush_loop(self) -> None:
        interval = self.config["log.flush.scheduler.interval.ms"] / 1000
        while True:
            await asyncio.sleep(interval)
            for tp, lg in list(self.logs.items()):
                try:
                    lg.maybe_flush()
                except Exception:
                    log.exception("flush failed for %s-%d", *tp)

    async def stop_schedulers(self) -> None:
        # The loop keeps running while the cleaner threads finish: a swap they wait for on it
        # completes (or sees the stop and is dropped).
        await asyncio.to_thread(self.cleaner.stop)
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self._tasks.clear()

    def close(self) -> int:
        """Close every log (flush, trim the indexes, clean-shutdown marker), then write the
        checkpoints. A log or checkpoint that cannot be written is logged and the others are
        still closed; that log keeps no clean-shutdown marker, so the next start recovers it
        from its recovery point. Returns how many could not be written."""
        failures = 0
        for tp, lg in self.logs.items():
            # a stop ends whatever fails: a failed fsync here is reported, not a halt
            lg.on_storage_failure = None
            try:
                lg.close()
            except (KafkaStorageError, OSError) as e:
                failures += 1
                log.error("could not close %s-%d cleanly: %s; the next start recovers it", *tp, e)
            except Exception:
                failures += 1
                log.exception("could not close %s-%d cleanly; the next start recovers it", *tp)
        return failures + self.try_checkpoint()
