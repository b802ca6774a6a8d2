"""The Kafka queue workload: `generator` (QueueWorkload, queue_test) and `client`
(QueueClient). Import the modules themselves: the client loads librdkafka, which the
generator side does not need."""
