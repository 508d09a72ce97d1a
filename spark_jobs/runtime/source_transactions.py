"""Transaction-aligned ingestion of a Debezium source (root option ``'transactions' =
'kafka:<prefix>.transaction'``): every barrier holds whole source transactions, the same ones in
every table of the database, so a join or a sum across them never sees half a transaction.

The rule is ``coordinator.domain.source_transactions``; this applies it with Spark, per barrier:
read the END markers between the barrier's cuts of the transaction topic (a few records, to the
driver), then scan the table's records from where its last barrier ended to its data cut,
aggregated on the executors to a few numbers per partition (the first record of a transaction
that has not ended, the last of one that has, events per ended transaction). If an ended
transaction's events are still on their way to this table's topic, read on past the cut until
they are in. The barrier then ingests ``[start, end)``; the end is published with its
completion, so the next barrier (and a restarted job) starts there.

Example::

    alignment = TransactionAlignment(spark, table, kafka_options)
    ranges = alignment.align(work, schemas)  # the barrier's offset ranges, whole transactions only
    ...                                      # ingest them, commit, publish the completion with them
    alignment.committed(work, ranges)        # the next barrier starts where they end
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from coordinator.domain.events import OffsetRange
from coordinator.domain.source_transactions import PartitionScan, TransactionEnded, aligned
from coordinator.domain.work import BarrierWork
from spark_jobs.planning.pipeline import RootTable
from spark_jobs.runtime.confluent import Rejected, decoded, transaction_id
from spark_jobs.runtime.kafka_ranges import LATEST, read_ranges

log = logging.getLogger(__name__)
WAIT_NOTE_S = 10.0  # how often a barrier waiting for a transaction's events says so
WAIT_LIMIT_S = 120.0  # then the barrier fails (and the job restarts) rather than hold its query for ever


def markers(values: list[bytes | None], table: RootTable, schemas: Mapping[int, str],
            registry_url: str) -> dict[str, TransactionEnded]:
    """The END markers among the transaction topic's records ``values`` (BEGINs are skipped),
    keyed by source transaction (Postgres: the txId before the ``:LSN`` Debezium appends)."""
    ended: dict[str, TransactionEnded] = {}
    for value in values:
        if value is None:
            continue
        marker = _marker(value, table, schemas, registry_url)
        if marker.get("status") == "END":
            tx = str(marker["id"]).split(":", 1)[0]
            counts = {c["data_collection"]: int(c["event_count"]) for c in marker.get("data_collections") or ()}
            ended[tx] = TransactionEnded(tx, counts)
    return ended


def _marker(value: bytes, table: RootTable, schemas: Mapping[int, str], registry_url: str) -> dict[str, Any]:
    try:
        if table.format == "debezium-json":
            body = json.loads(value)
            return body["payload"] if isinstance(body, dict) and "payload" in body and "schema" in body else body
        return decoded(value, "value", schemas, registry_url)[1]
    except (Rejected, ValueError) as exc:
        raise RuntimeError(f"table {table.name}: a record of Debezium's transaction topic {table.transactions} cannot "
                           f"be read ({exc}); is it the topic of the connector that writes {table.topic}?") from exc


def transaction_column(raw: DataFrame, table: RootTable, schemas: Mapping[int, str], registry_url: str) -> Column:
    """Each record's source transaction (NULL outside one, as a snapshot's records are, and for
    a tombstone): the part of ``transaction.id`` before the first colon."""
    if table.format == "debezium-json":
        text = F.col("value").cast("string")
        tx = F.coalesce(F.get_json_object(text, "$.payload.transaction.id"), F.get_json_object(text, "$.transaction.id"))
    else:
        known, url = dict(schemas), registry_url
        tx = F.udf(lambda value: transaction_id(value, known, url), "string")(F.col("value"))
    return F.substring_index(tx, ":", 1)


@dataclass
class TransactionAlignment:
    spark: SparkSession
    table: RootTable
    kafka_options: Mapping[str, str]
    registry_url: str = ""
    # where this process's last committed barrier ended reading: (barrier, generation) -> ends
    read_to: tuple[tuple[int, int], dict[tuple[str, int], int]] = ((-1, -1), {})

    def align(self, work: BarrierWork, schemas: Mapping[int, str]) -> list[OffsetRange]:
        """The barrier's ranges: the transaction topic's as cut, the table's ending after the
        last whole transaction that ended below the cut (reading on past it when needed). A
        barrier planned before the completion of the one before it was known starts where that
        one really ended (``committed``), not at its cut."""
        (barrier, generation), ends = self.read_to
        if work.restore_to is None and generation == work.generation and barrier < work.barrier:
            ranges = [replace(r, start=ends.get((r.topic, r.partition), r.start)) for r in work.offsets]
        else:  # revised, or the same barrier again: its own starts hold
            ranges = list(work.offsets)
        tx_ranges = [r for r in ranges if r.topic == self.table.transactions]
        data = [r for r in ranges if r.topic == self.table.topic]
        if not data:
            # a cut taken when this table's topic did not exist yet (a cut that did not measure it
            # is never this job's work: ``work_for``): none of the table's events, so none of the
            # ENDs either; they stay for the next barrier (Debezium creates a table's topic with
            # its first event, before the END of the transaction that wrote it)
            return [replace(r, end=r.start) for r in tx_ranges]
        raw = read_ranges(self.spark, self.kafka_options, self.table.transactions or "", tx_ranges)
        ended = markers([r.value for r in raw.select("value").collect()] if raw is not None else [],
                        self.table, schemas, self.registry_url)
        below, seen = self._scan(data, ended, schemas)
        result = aligned(below, [], seen, ended, self.table.collection)
        started = time.monotonic()
        noted = started
        while result.missing:
            onward = [OffsetRange(self.table.topic, s.partition, s.end, LATEST) for s in below if s.first_open is None]
            past, more = self._scan(onward, ended, schemas)
            result = aligned(below, past, seen + more, ended, self.table.collection)
            if result.missing and time.monotonic() - noted >= WAIT_NOTE_S:
                noted = time.monotonic()
                log.warning("table %s (barrier %d) waits for %d event(s) of source transaction(s) %s whose END is in "
                            "%s but whose events are not in %s from %s on (%.0f s so far)", self.table.name,
                            work.barrier, sum(result.missing.values()), ", ".join(sorted(result.missing)[:5]),
                            self.table.transactions, self.table.topic,
                            ", ".join(f"{r.partition}@{r.start}" for r in data), noted - started)
            if result.missing and time.monotonic() - started > WAIT_LIMIT_S:
                raise RuntimeError(f"table {self.table.name}: {sum(result.missing.values())} event(s) of source "
                                   f"transaction(s) {', '.join(sorted(result.missing)[:5])}, whose END is in "
                                   f"{self.table.transactions}, did not reach {self.table.topic} in "
                                   f"{WAIT_LIMIT_S:.0f} s; is the connector running?")
            if result.missing:
                time.sleep(0.2)
        return [replace(r, end=result.ends.get(r.partition, r.end)) for r in data] + tx_ranges

    def committed(self, work: BarrierWork, ranges: list[OffsetRange]) -> None:
        """The barrier committed and published ``ranges``: the next one starts where they end."""
        self.read_to = ((work.barrier, work.generation), {(r.topic, r.partition): r.end for r in ranges})

    def _scan(self, ranges: list[OffsetRange], ended: Mapping[str, TransactionEnded],
              schemas: Mapping[int, str]) -> tuple[list[PartitionScan], Counter[str]]:
        """One aggregate over the records of ``ranges``: per partition, its first record of a
        transaction not in ``ended``, its last of one in it, and events per ended transaction."""
        scans = {r.partition: PartitionScan(r.partition, None, None, max(r.start, r.end)) for r in ranges}
        raw = read_ranges(self.spark, self.kafka_options, self.table.topic, ranges)
        seen: Counter[str] = Counter()
        if raw is None:
            return list(scans.values()), seen
        tx = transaction_column(raw, self.table, schemas, self.registry_url)
        records = raw.select("partition", "offset", tx.alias("tx"), F.col("value").isNull().alias("tombstone"))
        done = F.col("tx").isin(list(ended)) if ended else F.lit(False)
        rows = (records.groupBy("partition", F.when(done, F.col("tx")).alias("ended_tx"))
                .agg(F.min(F.when(F.col("tx").isNotNull() & ~done, F.col("offset"))).alias("first_open"),
                     F.max(F.when(done, F.col("offset"))).alias("last_ended"),
                     F.max("offset").alias("last"),
                     F.sum(F.when(done & ~F.col("tombstone"), 1).otherwise(0)).alias("events"))
                .collect())
        for row in rows:
            before = scans.get(row["partition"]) or PartitionScan(row["partition"], None, None, 0)
            first = min((o for o in (before.first_open, row["first_open"]) if o is not None), default=None)
            last = max((o for o in (before.last_ended, row["last_ended"]) if o is not None), default=None)
            scans[row["partition"]] = PartitionScan(row["partition"], first, last, max(before.end, row["last"] + 1))
            if row["ended_tx"] is not None:
                seen[row["ended_tx"]] += int(row["events"])
        return list(scans.values()), seen
