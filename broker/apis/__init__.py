"""Request handlers, one module per API (Kafka's KafkaApis, split up)."""
