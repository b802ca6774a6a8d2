"""isrlab broker.coordinator: the coordinators that keep their state in internal topics.

- ``group``: the group coordinator and its ``__consumer_offsets`` records
"""
