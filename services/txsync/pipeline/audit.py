"""``audit-order``: do all DCs hold the same synced order?

Positions are compared DC by DC up to the shortest order (longer ones may simply be
ahead): the answer names the first position where two DCs hold different transactions,
with every DC's transaction there, or says they agree; with each DC's length and lag
behind the longest. The comparison is a group-by on position, so it runs on the
executors whatever the length; only its few result rows reach the driver.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import DataFrame
from pyspark.sql import functions as F  # noqa: N812 - Spark's usual name


@dataclass(frozen=True)
class Disagreement:
    position: int
    tx_ids: dict[str, str]
    """Each DC's transaction at ``position``."""


@dataclass(frozen=True)
class OrderAudit:
    lengths: dict[str, int]
    first_disagreement: Disagreement | None
    duplicates: dict[str, int]
    """DCs whose order holds some transaction more than once, and how many such."""

    @property
    def lag(self) -> dict[str, int]:
        longest = max(self.lengths.values(), default=0)
        return {dc: longest - length for dc, length in self.lengths.items()}

    @property
    def agrees(self) -> bool:
        return self.first_disagreement is None and not self.duplicates


def audit_order(synced: DataFrame) -> OrderAudit:
    lengths = {
        row["dc"]: int(row["length"])
        for row in synced.groupBy("dc").agg(F.max("position").alias("length")).collect()
    }
    shortest = min(lengths.values(), default=0)
    common = synced.filter(F.col("position") <= shortest)
    differing = (
        common.groupBy("position")
        .agg(F.countDistinct("tx_id").alias("ids"))
        .filter(F.col("ids") > 1)
        .agg(F.min("position").alias("first"))
        .collect()[0]["first"]
    )
    disagreement = None
    if differing is not None:
        at = common.filter(F.col("position") == differing).collect()
        disagreement = Disagreement(int(differing), {r["dc"]: r["tx_id"] for r in at})
    duplicates = {
        row["dc"]: int(row["repeated"])
        for row in synced.groupBy("dc", "tx_id")
        .count()
        .filter(F.col("count") > 1)
        .groupBy("dc")
        .agg(F.count("*").alias("repeated"))
        .collect()
    }
    return OrderAudit(lengths, disagreement, duplicates)
