"""The Apache Kafka tier: what only Apache Kafka shows (transactions that isolate, SASL logins
checked against ACLs), on the single-node Apache Kafka kq starts (`broker.kafka.apache`).

`KQ_TEST_TESTCONTAINERS=1` runs it on a testcontainers Kafka instead, where a Docker engine is.
"""
