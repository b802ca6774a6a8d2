"""The workloads, one home each (Jepsen's one namespace per workload): a workload's
generators, its client and the op shapes they share sit together.

- `queue/`: the Kafka queue workload (send, poll, txn, assign, subscribe, crash):
  `generator.py` (ops and test phases), `client.py` (confluent-kafka); its micro-op shapes
  are `checkers.queue.codec`'s.
- `eos/`: consume-transform-produce (exactly-once): producers fill input keys, copiers in
  one consumer group copy them to output keys in transactions, readers poll the output;
  queue histories, checked with the checker's `eos` keys.
"""
