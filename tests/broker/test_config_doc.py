"""docs/configuration.md is generated from broker/config.py and must not drift from it."""

from pathlib import Path

from isrlab.broker.config import config_doc_markdown

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def test_configuration_doc_is_in_step_with_the_config_table():
    assert DOC.read_text() == config_doc_markdown(), (
        "docs/configuration.md is stale: run `isrlab-broker config-doc > docs/configuration.md`"
    )
