"""Pipelines in SQL and the plan of each table: pure (sqlglot only, no Spark), so `lockstep
explain` and pipeline checks start no JVM."""
