"""isrlab checkers."""
