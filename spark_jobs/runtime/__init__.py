"""What runs inside a job: the SparkSession, the barrier source, one idempotent Delta commit
per barrier, root ingestion and incremental maintenance."""
