"""Lockstep's data plane: PySpark jobs that commit one Delta version per barrier.

Four rooms for four audiences, importing downward only (tests/test_layers.py):

* ``planning`` -- pipelines in SQL and how each table is maintained (sqlglot only, no Spark);
* ``runtime`` -- what runs inside a job: the session, the barrier source, commits, ingestion,
  incremental maintenance;
* ``ops`` -- running and supervising jobs, status hooks, CTAS cleanup, vacuum;
* ``api`` -- what Spark users call: consistent snapshots, the CTAS builder, lineage views;
* ``demo`` -- the demo's data generator and probes.
"""
