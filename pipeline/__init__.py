"""isrlab pipeline."""
