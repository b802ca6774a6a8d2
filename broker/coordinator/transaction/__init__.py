"""isrlab broker.coordinator.transaction: transactions, as Kafka 3.x's transaction coordinator.

- ``records``: the ``__transaction_state`` key/value format (TransactionLogKey/Value)
- ``metadata``: one transactional id's state and its legal transitions (TransactionMetadata)
- ``coordinator``: the coordinator's decisions, sans-IO (requests in, replies, appends and
  marker writes out)
- ``service``: the asyncio shell that carries them out
"""
