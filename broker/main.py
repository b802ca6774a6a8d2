"""Process entry point: pick standalone or cluster mode from the config and run until stopped."""

from __future__ import annotations

import gc

from isrlab.broker.config import BrokerConfig
from isrlab.broker.server import KafkaServer


async def run(config: BrokerConfig) -> bool:
    """Serve until stopped; True if the stop wrote everything (the exit status says so)."""
    # The broker's long-lived objects (logs, indexes, codec classes) would be re-scanned by
    # every full collection; collecting young objects less often and freezing what start-up
    # built keeps GC pauses out of produce latencies.
    gc.set_threshold(50_000, 20, 50)
    server: KafkaServer
    if config["zookeeper.connect"]:
        from isrlab.broker.cluster import ClusterKafkaServer

        server = ClusterKafkaServer(config)
    else:
        server = KafkaServer(config)
    gc.freeze()
    return await server.run_forever()
