"""Deterministic simulation (issue 18): the parts that exist so far.

- `clock`: an asyncio event loop on virtual time (timers fire in virtual time, nothing sleeps),
  and processes on it that can be killed.
- `zookeeper`: a simulated ZooKeeper ensemble, sans-IO, on a virtual clock.
- `kazoo_client`: the kazoo client subset the broker's `KafkaZkClient` uses, on that ensemble.
- `network`: a simulated network (hosts, TCP-like streams, partitions, delays, resets) behind
  the broker's transport seam (`broker.network.transport`).
- `cluster`: N real brokers in ZooKeeper mode as processes on one loop, ensemble and network,
  with crash (kill -9), restart, partition and heal; `invariants`: what is checked after
  every event of such a run.

docs/simulation.md says what is built, how it is tested, and what is not built yet.
"""
