"""The I/O shell around the engine: Kafka in, engine, Kafka and RocksDB out."""
