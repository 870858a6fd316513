"""
The stock/fixed alternation every case measures with, in one place.

Why one process, alternating: ``apply()``/``unapply()`` only swap class attributes, so
both variants run on the same database, connections and caches, and their samples are
interleaved (stock, fixed, fixed, stock, ...) so that load from other processes on a
shared machine, which drifts over minutes, hits both alike. Separate children would run
minutes apart and fold that drift into the ratio. Every loop sample runs in a
transaction that is rolled back, so each sample of either variant sees the same state.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable, Iterator

VARIANTS = ("stock", "fixed")


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def first_line(err: BaseException) -> str:
    return f"{type(err).__name__}: {str(err).splitlines()[0][:160] if str(err) else ''}"


class Variants:
    """Switch between stock and fixed code in this interpreter."""

    def __init__(self) -> None:
        import airflow_dataset_race_fix
        from airflow_dataset_race_fix import evidence

        self._fix = airflow_dataset_race_fix
        self._mark_producer = evidence.mark_producer

    def use(self, variant: str) -> None:
        from airflow_dataset_race_fix import evidence

        # The same work before a sample of either variant: apply() hashes the targets' sources (about 65 ms,
        # which leaves the CPU's caches to the next sample); run for the fixed variant only, it cost a 30 ms
        # task 3 %.
        self._fix.unapply()
        self._fix.apply(strict=True)
        if variant == "stock":
            self._fix.unapply()
        # A stock host has no package, so its producers leave no mark (evidence.py); a fixed host's do.
        evidence.mark_producer = self._mark_producer if variant == "fixed" else lambda task_instance: None

    def switch(self, variant: str) -> None:
        """
        ``use`` without its source hashing (65 ms): the classes' members set as ``use`` leaves them, so loops
        of two runners can alternate one by one (each a scheduler's loop after a loop, its caches warm as a
        scheduler's are).
        """
        import importlib

        from airflow_dataset_race_fix import evidence, runtime, targets

        if not hasattr(self, "_members"):
            owner_of = {m: getattr(importlib.import_module(m.module), m.owner) for m in targets.MEMBERS}
            places = {(o, runtime.MARKER) for o in owner_of.values()} | {
                (o, m.name) for m, o in owner_of.items()
            }
            self._members = {}
            for kind in (
                "fixed",
                "stock",
            ):  # use() left at stock, as switch("stock") leaves it: use() works after
                self.use(kind)  # (self: not there in this variant)
                self._members[kind] = [(owner, name, vars(owner).get(name, self)) for owner, name in places]
        for owner, name, value in self._members[variant]:
            if value is self:  # not there in this variant
                if name in vars(owner):
                    delattr(owner, name)
            else:
                setattr(owner, name, value)
        evidence.mark_producer = self._mark_producer if variant == "fixed" else lambda task_instance: None


def pair_order(pair: int) -> tuple[str, ...]:
    """The variants of the ``pair``-th pair in turn: stock first in even pairs, fixed first in odd ones."""
    return VARIANTS if pair % 2 == 0 else VARIANTS[::-1]


def in_rounds(variants: Variants, rounds: int) -> Iterator[tuple[int, str]]:
    """
    ``rounds`` rounds per variant, in ABBA order (stock, fixed, fixed, stock, ...): the round's index
    and variant, its code in place (``variants.use``). Stock is put back after the last round.
    """
    for i in range(rounds * 2):
        variant = pair_order(i // 2)[i % 2]
        variants.use(variant)
        yield i, variant
    variants.use("stock")


def alternate(
    variants: Variants, samples: int, measure: Callable[[str], float], warmup: int = 3, prime: bool = True
) -> dict[str, list[float]]:
    """``samples`` timings per variant, in ABBA order so neither variant always goes first.

    After each switch one untimed call runs first (``prime``), so that no sample pays for the
    switch; cases whose samples take seconds skip it.
    Python's cyclic garbage collector is run before and held off during each timed call:
    a collection falls on whichever sample crosses its allocation threshold, and at these
    durations one collection is a 10 % swing.
    """
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for i in range(warmup + samples):
        for variant in pair_order(i):
            variants.use(variant)
            if prime:
                measure(variant)
            gc.collect()
            gc.disable()
            try:
                elapsed = measure(variant)
            finally:
                gc.enable()
            if i >= warmup:
                times[variant].append(elapsed)
    variants.use("stock")
    return times
