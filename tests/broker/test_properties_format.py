"""server.properties is read with java.util.Properties.load's rules (its Javadoc's examples):
`=`, `:` or whitespace between key and value, `\\` continuation lines, `#`/`!` comments, escapes
(`\\uXXXX`, `\\:`, `\\=`, `\\ `, `\\t`...). A file that is not text is a one-line error."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from isrlab.broker.config import BrokerConfig, ConfigError, parse_properties


def test_the_three_separators_of_the_javadoc() -> None:
    # "Truth = Beauty", "Truth:Beauty" and "Truth                    :Beauty" all give the same
    text = "Truth = Beauty\n  Truth2:Beauty\nTruth3                    :Beauty\nTruth4 Beauty\n"
    assert parse_properties(text) == {
        "Truth": "Beauty",
        "Truth2": "Beauty",
        "Truth3": "Beauty",
        "Truth4": "Beauty",
    }


def test_continuation_lines_drop_the_next_lines_leading_whitespace() -> None:
    text = (
        "fruits                           apple, banana, pear, \\\n"
        "                                  cantaloupe, watermelon, \\\n"
        "                                  kiwi, mango\n"
    )
    assert parse_properties(text) == {
        "fruits": "apple, banana, pear, cantaloupe, watermelon, kiwi, mango"
    }


def test_an_even_number_of_backslashes_is_no_continuation() -> None:
    assert parse_properties("a=x\\\\\nb=y\n") == {"a": "x\\", "b": "y"}


def test_a_key_alone_has_the_empty_value() -> None:
    assert parse_properties("cheeses\n") == {"cheeses": ""}


def test_comments_blank_lines_and_line_endings() -> None:
    text = "# comment\r\n   ! also a comment \\\nkey=v\r\n\n\t\f\nother = w \rthird=z"
    assert parse_properties(text) == {"key": "v", "other": "w ", "third": "z"}


def test_a_comment_line_is_never_continued() -> None:
    assert parse_properties("# ends with \\\nkey=v\n") == {"key": "v"}


def test_escapes_in_keys_and_values() -> None:
    text = "a\\:b\\=c\\ d = \\u0041\\t\\n\\\\x\\q\n"
    assert parse_properties(text) == {"a:b=c d": "A\t\n\\xq"}


def test_only_the_first_separator_counts() -> None:
    assert parse_properties("url=PLAINTEXT://h:9092\nk := v\n") == {
        "url": "PLAINTEXT://h:9092",
        "k": "= v",
    }


def test_a_malformed_unicode_escape_names_the_line() -> None:
    with pytest.raises(ConfigError, match=r"f:2: malformed \\uxxxx escape"):
        parse_properties("a=1\nb=\\u00zz\n", "f")


def test_the_last_duplicate_wins() -> None:
    assert parse_properties("a=1\na=2\n") == {"a": "2"}


def test_a_real_server_properties_with_continuations_loads(tmp_path: Path) -> None:
    path = tmp_path / "server.properties"
    path.write_text("broker.id 3\nlog.dirs: /tmp/a,\\\n          /tmp/b\nnum.partitions = 4\n")
    cfg = BrokerConfig.load(path)
    assert cfg["broker.id"] == 3
    assert cfg["log.dirs"] == ["/tmp/a", "/tmp/b"]
    assert cfg["num.partitions"] == 4


def test_a_binary_config_file_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "server.properties"
    path.write_bytes(bytes(range(256)) * 4)
    with pytest.raises(ConfigError, match="not a text properties file"):
        BrokerConfig.load(path)
    run = subprocess.run(
        [sys.executable, "-m", "isrlab.broker", "start", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2
    assert "Traceback" not in run.stderr
    assert "not a text properties file" in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1
