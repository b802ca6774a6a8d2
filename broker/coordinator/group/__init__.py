"""isrlab broker.coordinator.group: consumer groups, as Kafka 3.x's group coordinator.

- ``records``: the ``__consumer_offsets`` key/value format (offset commits, group metadata)
- ``group``: one group's members and states, and the rules that need no clock
- ``coordinator``: the coordinator's decisions, sans-IO (requests in, replies and appends out)
- ``service``: the asyncio shell that carries them out (appends, timers, partition loading)
"""
