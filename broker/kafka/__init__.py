"""The only package that imports confluent_kafka."""
