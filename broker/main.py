"""Process entry point: pick standalone or cluster mode from the config and run until stopped."""

from __future__ import annotations

from broker.config import BrokerConfig
from broker.server import KafkaServer


async def run(config: BrokerConfig) -> None:
    server: KafkaServer
    if config["zookeeper.connect"]:
        from broker.cluster import ClusterKafkaServer

        server = ClusterKafkaServer(config)
    else:
        server = KafkaServer(config)
    await server.run_forever()
