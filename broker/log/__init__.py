"""isrlab broker.log."""
