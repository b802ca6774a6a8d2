"""`isrlab-broker`: run the reference broker and its tools.

isrlab-broker start --config server.properties [--override key=value ...]
isrlab-broker dump-log --files 00000000000000000000.log [--print-data-log] [--offsets-decoder]
    [--transaction-log-decoder]
isrlab-broker power-loss --log-dirs DIR[,DIR...] [--torn-seed N]
isrlab-broker config-doc
"""

from __future__ import annotations

import asyncio
import logging
import sys
from pathlib import Path
from typing import Annotated

import typer

from isrlab.broker.config import BrokerConfig, ConfigError, config_doc_markdown

app = typer.Typer(
    add_completion=False,
    help="The isrlab reference broker (Kafka wire protocol).",
    context_settings={"help_option_names": ["-h", "--help"]},  # `-h` is `--help`
)


def _fail(message: str) -> None:
    typer.echo(f"isrlab-broker: {message}", err=True)
    raise typer.Exit(2)


@app.command()
def start(
    config: Annotated[
        Path | None, typer.Option("--config", "-c", help="server.properties file")
    ] = None,
    override: Annotated[
        list[str] | None, typer.Option("--override", "-o", help="key=value, wins over the file")
    ] = None,
) -> None:
    """Start a broker and serve until SIGTERM/SIGINT (then shut down cleanly; exit status 1 if
    the shutdown could not write everything, which the next start recovers)."""
    try:
        cfg = BrokerConfig.load(config, override or [])
    except ConfigError as e:
        _fail(str(e))
        return
    logging.basicConfig(
        level=cfg["log.level"],
        format=f"%(asctime)s %(levelname)s [broker {cfg.broker_id}] %(name)s: %(message)s",
        stream=sys.stderr,
    )
    from isrlab.broker.log.errors import KafkaStorageError
    from isrlab.broker.main import run

    try:
        clean = asyncio.run(run(cfg))
    except (OSError, KafkaStorageError) as e:
        _fail(f"cannot start: {e}")
        return
    except RuntimeError as e:
        _fail(str(e))
        return
    if not clean:
        raise typer.Exit(1)


@app.command("dump-log")
def dump_log(
    files: Annotated[
        list[Path], typer.Option("--files", help=".log, .index, .timeindex or .txnindex files")
    ],
    print_data_log: Annotated[
        bool, typer.Option("--print-data-log", help="also print each record")
    ] = False,
    offsets_decoder: Annotated[
        bool,
        typer.Option(
            "--offsets-decoder",
            help="decode records as __consumer_offsets offset commits and group metadata "
            "(implies --print-data-log)",
        ),
    ] = False,
    transaction_log_decoder: Annotated[
        bool,
        typer.Option(
            "--transaction-log-decoder",
            help="decode records as __transaction_state transaction metadata "
            "(implies --print-data-log)",
        ),
    ] = False,
) -> None:
    """Print batches or index entries of segment files, like kafka-dump-log.sh."""
    from isrlab.broker.log.dump import dump_files

    for f in files:
        if not f.exists():
            _fail(f"no such file: {f}")
    if offsets_decoder and transaction_log_decoder:
        _fail("--offsets-decoder and --transaction-log-decoder exclude each other")
    dump_files(
        list(files),
        print_records=print_data_log,
        offsets_decoder=offsets_decoder,
        transaction_log_decoder=transaction_log_decoder,
    )


@app.command("replica-records")
def replica_records_command(
    log_dir: Annotated[Path, typer.Option("--log-dir", help="a log directory (log.dirs)")],
    topics: Annotated[
        str, typer.Option("--topics", help="comma-separated topics (default: every topic)")
    ] = "",
) -> None:
    """Print every data record of a log directory's partitions as JSON lines (topic,
    partition, offset, leader_epoch, producer_id, value), whole batches with a good CRC only."""
    import json

    from isrlab.broker.log.inventory import replica_records

    if not log_dir.is_dir():
        typer.echo(f"isrlab-broker: {log_dir} is not a directory", err=True)
        raise typer.Exit(2)
    wanted = {t for t in topics.split(",") if t} or None
    out = sys.stdout
    for row in replica_records(log_dir, wanted):
        out.write(json.dumps(row, separators=(",", ":")) + "\n")


@app.command("power-loss")
def power_loss(
    log_dirs: Annotated[
        str, typer.Option("--log-dirs", help="comma-separated log directories (log.dirs)")
    ],
    torn_seed: Annotated[
        int | None,
        typer.Option(
            "--torn-seed",
            help="torn tails: each file may keep part of what it never synced, the last page "
            "of it possibly zeros, drawn from this seed (LazyFS's torn writes)",
        ),
    ] = None,
) -> None:
    """Leave log directories as a power loss would: run after kill -9 of their broker. Every
    file is cut back to what its last successful fsync put on disk, and files whose directory
    entry never reached disk are deleted (from the broker's journal, .isrlab-synced; see
    docs/durability.md, "Power loss"). With --torn-seed, a file may keep part of its unsynced
    tail."""
    from isrlab.broker.log.durable import JournalError, apply_power_loss

    dirs = [d for d in log_dirs.split(",") if d]
    if not dirs:
        _fail("--log-dirs names no directory")
    for d in dirs:
        try:
            typer.echo(apply_power_loss(d, torn_seed=torn_seed).summary())
        except (JournalError, OSError) as e:
            _fail(f"power-loss: {e}")


@app.command("config-doc")
def config_doc() -> None:
    """Print the configuration reference (Markdown)."""
    typer.echo(config_doc_markdown(), nl=False)


def main() -> None:
    app()
