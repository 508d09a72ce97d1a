"""Keeping a derived table equal to its query at each barrier, one module per way.

* ``table``: what a barrier's maintenance works with (the sources at versions, their changes,
  the sink, the phases), and small frame helpers;
* ``change_rows``: the sources' changes as weighted change rows, by the plan's shape;
* ``aggregates``: an aggregate's groups folded with their change rows, and the groups that
  need recomputing (MIN/MAX that lost their extreme value, COUNT(DISTINCT));
* ``writes``: committing them (appended, a small table rewritten, a large one MERGEd), or a
  whole result;
* ``functions``: Python tables (row-wise functions over changed rows, dead letters);
* ``keyed``: tables kept by key in Spark's state store (``WITH ('state' = 'keyed')``);
* ``changelog_changes``: a changelog table's changes, for the tables that read it, from a
  state of each key's last two rows;
* ``state_stream``: the streaming query over staged rows that those two run on.

``spark_jobs.runtime.ivm.TableMaintainer`` picks the way for each barrier.
"""
