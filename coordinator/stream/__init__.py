"""Kafka and Faust around the pure core: topics, the state follower, the coordinator app."""
