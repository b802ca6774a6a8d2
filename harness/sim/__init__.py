"""Deterministic simulation (issue 18): the parts that exist so far.

- `clock`: an asyncio event loop on virtual time (timers fire in virtual time, nothing sleeps).
- `zookeeper`: a simulated ZooKeeper ensemble, sans-IO, on a virtual clock.
- `kazoo_client`: the kazoo client subset the broker's `KafkaZkClient` uses, on that ensemble.
- `network`: a simulated network (hosts, TCP-like streams, partitions, delays, resets) behind
  the broker's transport seam (`broker.network.transport`).

docs/simulation.md says what is built, how it is tested, and what is not built yet.
"""
