"""Durable queue state: a small store interface with memory and RocksDB backends."""
