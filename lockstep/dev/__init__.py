"""The local development stack: a real single-node Kafka broker started from cached jars."""
