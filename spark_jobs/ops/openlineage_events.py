"""OpenLineage run events for Lockstep's jobs, so lineage tools (Marquez, DataHub, ...) see
them as they see any Spark or Flink job: a job hook (``spark_jobs.ops.hooks``) that sends START
when a job starts, COMPLETE when ``lockstep stop`` finishes it, ABORT when it is cancelled, and
FAIL when its query dies (with the error; a job the Supervisor restarts starts a new run).

A run is one life of the streaming job, as OpenLineage's Flink integration counts it, not one
barrier (a run event a second per job would drown a lineage server). Each event names the job's
inputs (Kafka topics, or the Delta tables it reads) and its output table, with the table's
schema (root tables), the query (derived ones) and column-level lineage (sqlglot). Where
events go is ``LOCKSTEP_OPENLINEAGE``: ``console`` (the log), ``file:PATH`` (JSON lines) or
``http(s)://host:port`` (an OpenLineage endpoint; a path in the URL replaces
``api/v1/lineage``). The Supervisor adds the hook when it is set.

Example::

    LOCKSTEP_OPENLINEAGE=http://127.0.0.1:5000 lockstep run pipelines/shopping.sql
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from importlib.metadata import version
from typing import Any
from urllib.parse import urlsplit

from openlineage.client import OpenLineageClient
from openlineage.client.event_v2 import InputDataset, Job, OutputDataset, Run, RunEvent, RunState
from openlineage.client.facet_v2 import (
    column_lineage_dataset,
    error_message_run,
    job_type_job,
    schema_dataset,
    sql_job,
)

from coordinator.settings import Settings
from spark_jobs.ops.hooks import JobEvent, JobHooks
from spark_jobs.planning.columns import column_lineage
from spark_jobs.planning.pipeline import Pipeline, RootTable

PRODUCER = f"https://pypi.org/project/lockstep-etl/{version('lockstep-etl')}"


def transport_config(target: str) -> dict[str, Any]:
    """The client's transport for a ``LOCKSTEP_OPENLINEAGE`` value (validated by ``Settings``).

    >>> transport_config("http://marquez:5000")
    {'type': 'http', 'url': 'http://marquez:5000', 'endpoint': 'api/v1/lineage'}
    >>> transport_config("file:/tmp/ol.jsonl")["log_file_path"]
    '/tmp/ol.jsonl'
    """
    if target == "console":
        return {"type": "console"}
    if target.startswith("file:"):
        return {"type": "file", "log_file_path": target.removeprefix("file:"), "append": True}
    url = urlsplit(target)
    return {"type": "http", "url": f"{url.scheme}://{url.netloc}", "endpoint": url.path.strip("/") or "api/v1/lineage"}


def dataset_name(location: str) -> tuple[str, str]:
    """OpenLineage's (namespace, name) of a table at ``location``: ``file`` and the path for a
    local folder, ``s3://bucket`` and the key for ``s3a://bucket/key``, else scheme://authority.

    >>> dataset_name("s3a://lake/wh/orders"), dataset_name("/data/wh/orders")
    (('s3://lake', 'wh/orders'), ('file', '/data/wh/orders'))
    """
    url = urlsplit(location)
    if url.scheme in ("", "file"):
        return "file", url.path
    scheme = "s3" if url.scheme in ("s3a", "s3n") else url.scheme
    return f"{scheme}://{url.netloc}", url.path.lstrip("/")


class OpenLineageEvents(JobHooks):
    """The hook (see the module); one client per runner process."""

    def __init__(self, settings: Settings, pipeline: Pipeline, client: OpenLineageClient | None = None) -> None:
        self.settings, self.pipeline = settings, pipeline
        self.client = client or OpenLineageClient(config={"transport": transport_config(settings.openlineage)})
        self.columns = column_lineage(pipeline)
        self.runs: dict[str, str] = {}  # job id -> its current run id

    def on_created(self, event: JobEvent) -> None:
        self._emit(event, RunState.START, new_run=True)

    def on_finished(self, event: JobEvent) -> None:
        self._emit(event, RunState.COMPLETE)

    def on_canceled(self, event: JobEvent) -> None:
        self._emit(event, RunState.ABORT)

    def on_failed(self, event: JobEvent) -> None:
        self._emit(event, RunState.FAIL, error=event.error or event.reason or "failed")
        if event.status == "RUNNING":  # the Supervisor restarts it: a new run
            self._emit(event, RunState.START, new_run=True)

    def _emit(self, event: JobEvent, state: RunState, new_run: bool = False, error: str = "") -> None:
        if new_run or event.job_id not in self.runs:
            self.runs[event.job_id] = str(uuid.uuid4())
        run_facets: dict[str, Any] = {}
        if error:
            run_facets["errorMessage"] = error_message_run.ErrorMessageRunFacet(message=error, programmingLanguage="PYTHON")
        inputs, outputs, job_facets = self._datasets(event.job_id, event.sink)
        self.client.emit(RunEvent(
            eventType=state, eventTime=datetime.now(UTC).isoformat(), producer=PRODUCER,
            run=Run(runId=self.runs[event.job_id], facets=run_facets),
            job=Job(namespace=self.settings.topic_prefix, name=event.job_id, facets=job_facets),
            inputs=inputs, outputs=outputs))

    def _datasets(self, job_id: str, sink: str) -> tuple[list[InputDataset], list[OutputDataset], dict[str, Any]]:
        job = next(j for j in self.pipeline.jobs if j.job_id == job_id)
        table = self.pipeline.table(sink)
        job_facets: dict[str, Any] = {"jobType": job_type_job.JobTypeJobFacet(
            processingType="STREAMING", integration="LOCKSTEP", jobType="ROOT_INGESTION" if job.external_topics else "QUERY")}
        if job.sql:
            job_facets["sql"] = sql_job.SQLJobFacet(query=job.sql, dialect="spark")
        kafka = f"kafka://{self.settings.bootstrap.split(',')[0].strip()}"
        inputs = [InputDataset(namespace=kafka, name=topic) for topic in job.external_topics]
        inputs += [InputDataset(*dataset_name(self.settings.table_location(source))) for source in job.sources]
        output_facets: dict[str, Any] = {}
        if isinstance(table, RootTable):
            output_facets["schema"] = schema_dataset.SchemaDatasetFacet(fields=[
                schema_dataset.SchemaDatasetFacetFields(name=c.name, type=c.type) for c in table.columns])
        elif (columns := self.columns.get(sink)) is not None:
            output_facets["columnLineage"] = column_lineage_dataset.ColumnLineageDatasetFacet(fields={
                column: column_lineage_dataset.Fields(inputFields=[
                    column_lineage_dataset.InputField(*dataset_name(self.settings.table_location(t)), field=c)
                    for t, c in (source.split(".", 1) for source in sources)])
                for column, sources in columns.items()})
        output = OutputDataset(*dataset_name(self.settings.table_location(sink)), facets=output_facets)
        return inputs, [output], job_facets
