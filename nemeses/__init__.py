"""isrlab nemeses."""
