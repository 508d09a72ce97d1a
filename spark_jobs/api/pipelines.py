"""Decorators of Python pipeline files (``spark_jobs.planning.python_tables``), as Spark
Declarative Pipelines name them.

Example::

    from spark_jobs.api import pipelines as dp

    @dp.materialized_view
    def slow_clicks(clicks):
        return clicks.where("ms > 200")
"""

from spark_jobs.planning.python_tables import materialized_view, table

__all__ = ["materialized_view", "table"]
