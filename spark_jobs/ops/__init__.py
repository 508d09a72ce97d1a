"""Operating jobs: register a pipeline, start and supervise its jobs, their status hooks, CTAS
cleanup, and vacuum."""
