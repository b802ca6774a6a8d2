"""isrlab broker."""
