"""isrlab harness."""
