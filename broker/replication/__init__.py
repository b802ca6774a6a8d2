"""isrlab broker.replication."""
