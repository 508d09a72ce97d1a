"""The pipelines the freshness benches run: a root table fed from Kafka, two aggregates over
it and the read that joins them (``shopping``, ``counts``), with the records a generator makes
for each and the rows no consistent read could return.

``bench.freshness`` runs them; ``bench.reads`` and ``bench.soak`` feed (and read) ``shopping``
through its child processes. Kept apart from that runner so that its report
(``bench.freshness_report``) and those benches need not import it.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from spark_jobs.demo.datagen import RecordMaker


@dataclass(frozen=True)
class Topology:
    """A root table from ``topic``, two aggregates over it, and a read that joins them."""

    name: str
    topic: str
    root: str
    root_ddl: str
    aggregates: dict[str, str]  # table -> query over the root table
    read: str  # the reader's query; yields newest_ts per row and what ``anomalies`` checks
    keys: int

    @property
    def read_tables(self) -> list[str]:
        """The aggregates the reader's query joins (a snapshot of just those)."""
        return [t for t in self.aggregates if re.search(rf"\b{t}\b", self.read)]

    def pipeline(self) -> str:
        create = [f"CREATE TABLE {self.root} ({self.root_ddl}) WITH ('source' = 'kafka:{self.topic}', 'format' = 'json');"]
        return "\n".join(create + [f"CREATE TABLE {t} AS {q};" for t, q in self.aggregates.items()])


SHOPPING = Topology(
    "shopping", "shopping_source", "shopping", "user_id BIGINT, item_id BIGINT, amount BIGINT, price DOUBLE, ts BIGINT",
    {"user_item_amount": "SELECT user_id, item_id, SUM(amount) AS total_amount, MAX(ts) AS newest_ts "
                         "FROM shopping GROUP BY user_id, item_id",
     "user_item_price": "SELECT user_id, item_id, SUM(price) AS total_price, MAX(ts) AS newest_ts "
                        "FROM shopping GROUP BY user_id, item_id"},
    "SELECT a.item_id, p.total_price / a.total_amount AS avg_price, GREATEST(a.newest_ts, p.newest_ts) AS newest_ts "
    "FROM user_item_amount a JOIN user_item_price p ON a.user_id = p.user_id AND a.item_id = p.item_id",
    keys=100 * 20)
COUNTS = Topology(
    "counts", "events_source", "events", "k BIGINT, v BIGINT, ts BIGINT",
    {"totals": "SELECT k, SUM(v) AS total, COUNT(*) AS n, MAX(ts) AS newest_ts FROM events GROUP BY k",
     "spans": "SELECT k, COUNT(*) AS n, MIN(v) AS lo, MAX(v) AS hi, MAX(ts) AS newest_ts FROM events GROUP BY k"},
    "SELECT t.n AS n1, s.n AS n2, GREATEST(t.newest_ts, s.newest_ts) AS newest_ts "
    "FROM totals t FULL OUTER JOIN spans s ON t.k = s.k",
    keys=1000)
TOPOLOGIES = {t.name: t for t in (SHOPPING, COUNTS)}


def with_siblings(topology: Topology, siblings: int) -> Topology:
    """``counts`` with ``siblings`` aggregates over its root (0: as it is, two): one reads
    ``totals`` alone; more add aggregates the read does not join, whose jobs compete for the
    same CPU and barriers (the cost of a topology that grows)."""
    if not siblings or siblings == len(topology.aggregates):
        return topology
    if topology is not COUNTS:
        raise SystemExit("--siblings applies to the counts topology")
    if siblings == 1:
        return replace(topology, aggregates={"totals": topology.aggregates["totals"]},
                       read="SELECT n AS n1, n AS n2, newest_ts FROM totals")
    extra = {f"extra_{i}": f"SELECT k, COUNT(*) AS n, SUM(v * {i + 2}) AS total, MAX(ts) AS newest_ts FROM events GROUP BY k"
             for i in range(siblings - 2)}  # maintained as totals is (`lockstep explain`: incremental aggregate)
    return replace(topology, aggregates={**topology.aggregates, **extra})


def anomalies(topology: Topology, rows: list[Any]) -> int:
    """Rows no consistent state could hold: an average price that is not the unit price
    (shopping), or two counts of the same key that differ (counts)."""
    if topology is SHOPPING:
        from spark_jobs.demo.probes import wrong_prices

        return wrong_prices(rows)
    return sum(1 for r in rows if r["n1"] != r["n2"])


def record_maker(topology: Topology) -> RecordMaker:
    from spark_jobs.demo.datagen import purchases

    if topology is SHOPPING:
        return purchases(users=100, items=20)

    def event(rng: random.Random, ts: int) -> tuple[str, dict[str, int | float]]:
        k = rng.randrange(topology.keys)
        return str(k), {"k": k, "v": rng.randrange(1000), "ts": ts}

    return event
