"""isrlab harness.cluster."""
