"""Tests of the harness: inventory, ssh, remote, db, cluster, runner, testconfig."""
