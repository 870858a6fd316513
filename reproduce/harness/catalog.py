"""
Which race scenarios exist and where each can happen, without importing Airflow: the
``reproduce`` parent checks ``--only`` against it before it starts any child, and
``harness.scenarios`` attaches each scenario's interleaving to its entry here.

SQLite has a single writer, so a producer holding an open write transaction blocks every
other writer: the interleavings that need two open writers (S2b, S3, S5, S7) cannot occur
there.
"""

from __future__ import annotations

from dataclasses import dataclass

ALL = ("sqlite", "postgres", "mysql")
SERVERS = ("postgres", "mysql")


@dataclass(frozen=True)
class ScenarioInfo:
    id: str
    title: str
    backends: tuple[str, ...]
    expect_stock: tuple[str, ...]  # the counters stock Airflow must show above zero

    def applies_to(self, backend: str) -> bool:
        return backend in self.backends


CATALOG = (
    ScenarioInfo("S1", "stale queue timestamp", ALL, ("lost",)),
    ScenarioInfo("S2", "delete during processing", ALL, ("lost",)),
    ScenarioInfo("S2b", "delete during processing, at the DELETE", SERVERS, ("lost",)),
    ScenarioInfo("S3", "late commit (visibility gap)", SERVERS, ("lost",)),
    ScenarioInfo("S4", "queue row for consumed events", ALL, ("lost",)),
    ScenarioInfo("S5", "phantom run", SERVERS, ("empty_runs", "lost")),
    ScenarioInfo("S6", "out of order, double consumption", ALL, ("out_of_order", "doubled")),
    ScenarioInfo("S7", "merge path conflict", ("mysql",), ("lost",)),
)


def applicable_ids(backend: str) -> list[str]:
    return [info.id for info in CATALOG if info.applies_to(backend)]


def elsewhere(backend: str) -> list[ScenarioInfo]:
    """The scenarios that cannot happen on ``backend``."""
    return [info for info in CATALOG if not info.applies_to(backend)]
