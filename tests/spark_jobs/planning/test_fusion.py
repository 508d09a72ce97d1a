"""Fused groups: the jobs of one run that read only its tables follow its root jobs' commits."""

from __future__ import annotations

from spark_jobs.planning.fusion import fused_groups
from spark_jobs.planning.pipeline import Job


def root(name: str) -> Job:
    return Job(f"ingest_{name}", name, external_topics=(f"{name}_topic",))


def derived(name: str, *sources: str) -> Job:
    return Job(f"maintain_{name}", name, sources=sources)


def test_members_are_the_jobs_that_read_only_tables_of_the_run_however_deep() -> None:
    jobs = [derived("top", "totals"), root("orders"), derived("totals", "orders"), derived("counts", "orders")]
    assert fused_groups(jobs) == {"ingest_orders": ("maintain_top", "maintain_totals", "maintain_counts")}


def test_a_job_that_reads_a_table_written_elsewhere_keeps_its_own_query() -> None:
    jobs = [root("orders"), derived("enriched", "orders", "customers"), derived("later", "enriched")]
    assert fused_groups(jobs) == {}
    assert fused_groups([derived("totals", "orders")]) == {}  # its root job runs elsewhere (`--job`)


def test_a_join_of_two_roots_makes_one_group_led_by_the_first() -> None:
    jobs = [root("orders"), root("customers"), derived("per_customer", "customers"),
            derived("joined", "orders", "customers")]
    assert fused_groups(jobs) == {"ingest_orders": ("maintain_per_customer", "maintain_joined")}
    assert fused_groups([root("a"), root("b"), derived("x", "a"), derived("y", "b")]) == {
        "ingest_a": ("maintain_x",), "ingest_b": ("maintain_y",)}
