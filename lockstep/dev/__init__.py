"""The local development stack `lockstep dev` starts: a KRaft broker or cluster, an S3-API server,
the metastore's database, a Spark standalone cluster, the worker, and a change-data-capture source
(PostgreSQL, a schema registry, Kafka Connect), each a child process with a pid file under
``$LOCKSTEP_HOME`` (``service.py``). Only the CLI and the benches use it: beside the CLI that
starts it, not under ``coordinator/`` (the MetaService)."""
