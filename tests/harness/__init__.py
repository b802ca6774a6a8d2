"""Tests of harness.control and harness.cluster."""
