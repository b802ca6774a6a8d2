"""isrlab broker.coordinator.group: consumer groups, as Kafka 3.x's group coordinator.

- ``records``: the ``__consumer_offsets`` key/value format (offset commits, group metadata)
"""
