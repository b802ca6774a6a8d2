"""The eos workload (consume-transform-produce, exactly-once): `generator` (EosWorkload, run
with the queue workload's phases), `client` (EosCopier and the client factory), `options`
(EosOptions: the queue knobs and the copiers' own). Import the modules themselves: the client
loads librdkafka, which the generator side does not need."""
