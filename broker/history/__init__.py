"""Reading what kq and its producers wrote to Kafka: journals and underlying topics, for the
`kq journal` commands and the Spark pipeline. Reads Kafka only: works while the service is
down."""
