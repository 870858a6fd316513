"""
The exploration: programs per backend, each interleaving run once on stock and once with
the fix, the oracle comparing them, and a greedy minimizer for what fails.

The oracle, per interleaving (``compare``): after the steps, quiet loops and a restarted
scheduler's loops (``runner.drain``), every committed event is consumed exactly once by
each DAG scheduled on its dataset (or still queued for it), no run is empty or out of
order, no queue row lingers, no producer transaction fails and no loop errs; an event a
``db clean`` deleted the run of counts as consumed (consumed again: *doubled*); a DAG paused
or at ``max_active_runs`` at the end loses nothing (its events wait); an event stock's running
scheduler consumed that the fix's left to the restarted scheduler is *starved*. A failure of
the fix that stock does not show is *worse*; one that stock shows too is *both*.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from .model import Program, Space, Txn, format_schedule, parse_schedule
from .runner import TICK, Outcome, run_schedule

STALL = 1.5  # seconds: past commit_latency_seconds = 1
COMPARED_VIOLATIONS = ("empty_runs", "out_of_order", "lingering")


def compare(stock: Outcome, fixed: Outcome) -> tuple[list[str], list[str]]:
    """(what the fix does worse than stock, what both do wrong), as short labels."""
    worse: list[str] = []
    both: list[str] = []

    def sort(label: str, stock_fails: bool) -> None:
        (both if stock_fails else worse).append(label)

    for kind in ("lost", "doubled"):
        for dag, txns in getattr(fixed, kind).items():
            for txn in txns:
                sort(f"{kind} {txn} ({dag})", txn in getattr(stock, kind).get(dag, []))
    for kind in COMPARED_VIOLATIONS:
        if fixed.violations.get(kind, 0):
            sort(f"{kind} {fixed.violations[kind]}", stock.violations.get(kind, 0) >= fixed.violations[kind])
    for dag, txns in fixed.after_restart.items():
        for txn in txns:
            if stock.consumed.get(dag, {}).get(txn) and txn not in stock.after_restart.get(dag, []):
                worse.append(f"starved {txn} ({dag}): consumed only by the restarted scheduler")
    for dag, txns in fixed.unswept.items():  # the fix's own promise: stock has no sweep
        worse += [f"starved {txn} ({dag}): left by the sweep of a DAG that can run" for txn in txns]
    for txn, res in fixed.txns.items():
        if res.error:
            stock_res = stock.txns.get(txn)
            sort(f"producer {txn} failed: {res.error}", not (stock_res and stock_res.committed))
    for error in fixed.scheduler_errors:
        sort(f"scheduler: {error}", bool(stock.scheduler_errors))
    if fixed.stuck:
        sort(f"stuck: {fixed.stuck}", bool(stock.stuck))
    return worse, both


def stock_failures(stock: Outcome) -> list[str]:
    labels = [
        f"{k} {t} ({d})" for k in ("lost", "doubled") for d, ts in getattr(stock, k).items() for t in ts
    ]
    labels += [f"{k} {v}" for k, v in stock.violations.items() if k in COMPARED_VIOLATIONS]
    labels += [f"producer {t} failed" for t, r in stock.txns.items() if r.error]
    return labels


@dataclass
class Finding:
    program: str
    dags: tuple
    steps: list[str]
    worse: list[str]
    both: list[str]
    stock: str
    fixed: str
    index: int  # how many interleavings had run when it was found (1-based)
    minimal: list[str] | None = None
    per_loop: int | None = None
    tick: float = TICK
    lookback: int | None = None

    def replay(self, backend: str) -> str:
        dags = ",".join(f"{n}={s}" for n, s in self.dags)
        steps = format_schedule(parse_schedule(" ".join(self.minimal or self.steps)))
        options = (f" --per-loop {self.per_loop}" if self.per_loop else "") + (
            f" --tick {self.tick}" if self.tick != TICK else ""
        )
        options += f" --lookback {self.lookback}" if self.lookback else ""
        return f"python -m tests.explorer replay --backend {backend}{options} --dags '{dags}' '{steps}'"


@dataclass
class Result:
    backend: str
    explored: int = 0
    seconds: float = 0.0
    spaces: dict[str, int] = field(default_factory=dict)
    ran: dict[str, int] = field(default_factory=dict)
    worse: list[Finding] = field(default_factory=list)
    both: list[Finding] = field(default_factory=list)
    stock_only: int = 0

    def report(self) -> str:
        lines = [
            f"explorer on {self.backend}: {self.explored} interleavings "
            f"(each on stock and on the fix) in {self.seconds:.0f} s",
        ]
        for name, size in self.spaces.items():
            lines.append(f"  {name}: {self.ran.get(name, 0)} of {size} interleavings (one per trace)")
        lines.append(f"  stock fails, the fix does not: {self.stock_only}")
        for title, findings in (("THE FIX DOES WORSE THAN STOCK", self.worse), ("both fail", self.both)):
            lines.append(f"  {title}: {len(findings)}")
            seen = set()
            for f in findings:
                key = (f.program, tuple(f.worse if f is not None and title.startswith("THE") else f.both))
                if key in seen:
                    continue
                seen.add(key)
                lines.append(f"    [{f.program} #{f.index}] {'; '.join(f.worse or f.both)}")
                lines.append(f"      steps:   {' '.join(f.minimal or f.steps)}")
                lines.append(f"      stock:   {f.stock}")
                lines.append(f"      fixed:   {f.fixed}")
                lines.append(f"      replay:  {f.replay(self.backend)}")
        return "\n".join(lines)


# -- the programs ------------------------------------------------------------------------------
def programs(backend: str) -> list[Program]:
    """The bounded scenarios, smallest first. Server-only ones need row locks (busy rows)."""
    one = (("d", "a"),)
    return [
        Program(
            "late-commit-split",  # S2/S3/S4 shapes: a loop in three parts against two producers
            (("d", "a|b"),),
            (Txn("P1", "a", open=True, stall=True), Txn("Q1", "b", open=True)),
            loops=(("S", 2),),
            split=True,
            prefix=("Q0:a", "S.loop"),
        ),
        Program(
            "rollback-split",  # a rolled back producer beside a committing one and a split loop
            one,
            (Txn("P1", "a", open=True, rollback=True), Txn("Q1", "a", open=True)),
            loops=(("S", 2),),
            split=True,
            prefix=("Q0:a", "S.loop"),
        ),
        Program(
            "two-dags",  # two DAGs on one dataset, a stalled producer
            (("d", "a"), ("e", "a")),
            (Txn("P1", "a", open=True, stall=True), Txn("Q1", "a"), Txn("Q2", "a")),
            loops=(("S", 2),),
            prefix=("Q0:a", "S.loop"),
        ),
        Program(
            "busy-row",  # issue 33's shape: a stalled COMMIT on a busy row, then a quiet DAG
            one,
            (Txn("Q2", "a"), Txn("P1", "a", open=True, stall=True), Txn("R1", "a"), Txn("Q3", "a")),
            loops=(("S", 2),),
            prefix=("Q1:a", "S.loop"),
            backends=("postgres", "mysql"),
            note="busy rows exist only with row locks; SQLite has one writer",
        ),
        Program(
            "ha-schedulers",  # two schedulers (PostgreSQL: Airflow supports HA there)
            one,
            (Txn("P1", "a", open=True, stall=True), Txn("Q1", "a")),
            loops=(("S", 2), ("T", 2)),
            prefix=("Q0:a", "S.loop"),
            backends=("postgres",),
        ),
        Program(
            "late-commit-paced",  # the net's pacing: loops in which it does not look at the ids
            one,
            (Txn("P1", "a", open=True, stall=True), Txn("Q1", "a")),
            loops=(("S", 3),),
            blind=2,
            prefix=("Q0:a", "S.loop"),
            budget=10,
        ),
        Program(
            "db-clean",  # issue 47 item 4: db clean of dag_run between runs; nothing consumed again
            one,
            (Txn("Q2", "a"), Txn("Q3", "a")),
            loops=(("S", 2),),
            prefix=("Q1:a", "S.loop"),
            operator=("D.clean:d",),
            tick=1.5,  # steps further apart than commit_latency_seconds: see docs/explorer.md
            budget=8,
        ),
        Program(
            "clock-step",  # issue 47 item 5: the clock 20 min ahead for a run, back, a pause of 16 min
            one,
            (Txn("Q3", "a"), Txn("Q4", "a")),
            loops=(("S", 1),),
            prefix=("Q1:a", "S.loop", "clock+1200", "Q2:a", "S.loop", "clock-1200"),
            operator=("D.pause:d", "clock+960", "D.unpause:d"),
            budget=10,
        ),
        Program(
            "starved-victim",  # issue 47 item 3: DAGs at max_active_runs with unqueued events, and a victim
            (("h1", "a/1"), ("h2", "a/1"), ("h3", "a/1"), ("v", "b")),
            (Txn("Q2", "b"),),
            loops=(("S", 2),),
            prefix=(
                "Q0:a",
                "R0:b",
                "S.loop",
                "S.loop",
                "S.loop",
                "S.loop",
                "D.full:h",
                "D.pause:h",
                "Q1:a",
                "D.unpause:h",
            ),
            operator=("D.pause:v", "D.unpause:v"),  # the victim's event without a queue row: the sweep's
            per_loop=1,  # three held DAGs fill twice max_dagruns_to_create_per_loop and one more
            budget=10,
        ),
        Program(
            "and-late",  # a late commit on one dataset of an AND (and an OR beside it), the partner later
            (("x1", "k&m"), ("x2", "k|m")),
            (Txn("R3", "k"),),
            loops=(("S", 2),),
            # x paused while P1 registers: no queue row of its own; stock dates run 2 at k's row (R2)
            prefix=(
                "Q1:k",
                "Q2:m",
                "S.loop",
                "R1:m",
                "R2:k",
                "D.pause:x",
                "P1.reg:k",
                "P1.stamp",
                "D.unpause:x",
                "P1.stall",
            ),
            lists=(("P", ("P1.commit",)),),
            backends=("postgres", "mysql"),
            budget=12,
        ),
        Program(
            "failing-loop",  # a late commit, then a loop that fails once at its Nth statement and is retried
            one,
            (Txn("Q3", "a"),),
            prefix=(
                "Q1:a",
                "S.loop",
                "Q2:a",
                "D.pause:d",
                "P1.reg:a",
                "P1.stamp",
                "D.unpause:d",
                "P1.stall",
                "R1:a",
                "S.loop",
            ),
            loops=(),
            lists=(("P", ("P1.commit",)), ("S", ("S.fail", "S.loop"))),
            fail_at=tuple(range(1, 37)),
            backends=("postgres", "mysql"),
            budget=8,
        ),
        Program(
            "restart",  # a late commit across a restart, the DAG past event_lookback_seconds; no mark
            one,
            (Txn("Q2", "a"),),
            prefix=(
                "Q1:a",
                "S.loop",
                "D.pause:d",
                "P1.reg:a",
                "P1.stamp",
                "D.unpause:d",
                "P1.stall",
                "clock+60",
                "R1:a",
                "S.loop",
            ),
            loops=(),
            lists=(("P", ("P1.commit",)), ("S", ("S.loop", "S.restart", "S.loop"))),
            operator=("D.unmark",),
            lookback=30,
            backends=("postgres", "mysql"),
            budget=6,
        ),
        Program(
            "deactivated",  # the DAG inactive for a moment (its file missing) around a late commit
            one,
            (Txn("P1", "a", open=True, stall=True),),
            loops=(("S", 2),),
            prefix=("Q1:a", "S.loop"),
            operator=("D.off:d", "D.on:d"),
            backends=("postgres", "mysql"),  # SQLite: a loop hung behind the stalled producer (not traced)
            budget=6,
        ),
    ]


def _set_fix(on: bool) -> None:
    import airflow_dataset_race_fix

    airflow_dataset_race_fix.unapply()
    if on:
        states = airflow_dataset_race_fix.apply(strict=True)
        assert {s.state for s in states} == {"patched"}, states


def run_pair(
    dags, steps: list[str], per_loop: int | None = None, tick: float = TICK, lookback: int | None = None
) -> tuple[Outcome, Outcome]:
    _set_fix(False)
    try:
        stock = run_schedule(dags, steps, "stock", STALL, per_loop, tick, lookback)
        _set_fix(True)
        fixed = run_schedule(dags, steps, "fixed", STALL, per_loop, tick, lookback)
    finally:
        _set_fix(False)
    return stock, fixed


def minimize(
    dags, steps: list[str], still_fails: Callable[[list[str]], bool], attempts: int = 12
) -> list[str]:
    """Greedy: drop whole transactions, loops and stalls while the failure stays."""
    current = list(steps)
    tried = 0
    changed = True
    while changed and tried < attempts:
        changed = False
        for candidate in _smaller(current):
            if tried >= attempts:
                break
            tried += 1
            if still_fails(candidate):
                current, changed = candidate, True
                break
    return current


def _smaller(steps: list[str]):
    parsed = parse_schedule(" ".join(steps))
    tokens = [str(s) for s in parsed]
    txns = list(dict.fromkeys(s.txn for s in parsed if s.txn))
    for txn in txns:
        yield [t for t, s in zip(tokens, parsed) if s.txn != txn]
    for i, s in enumerate(parsed):
        if s.kind in ("loop", "blind"):
            yield tokens[:i] + tokens[i + 1 :]
        if s.kind == "fail":  # the same loop without its fault
            yield tokens[:i] + [f"{s.actor}.loop"] + tokens[i + 1 :]
        if s.kind == "q":
            yield tokens[:i] + tokens[i + 3 :]
        if s.kind == "stall":
            yield tokens[:i] + tokens[i + 1 :]


def explore(
    backend: str,
    budget: int,
    seed: int,
    only: list[str] | None = None,
    minimize_first: bool = True,
    stop_at_first: bool = False,
    log: Callable[[str], None] = print,
) -> Result:
    """Run up to ``budget`` interleavings per program (all of a smaller space), with ``seed``."""
    result = Result(backend)
    start = time.monotonic()
    for program in programs(backend):
        if backend not in program.backends or (only and program.name not in only):
            continue
        size, chosen = Space(program).choose(min(budget, program.budget or budget), seed)
        result.spaces[program.name] = size
        log(f"{program.describe()}: {size} interleavings, running {len(chosen)} (seed {seed})")
        for steps in chosen:
            result.explored += 1
            result.ran[program.name] = result.ran.get(program.name, 0) + 1
            stock, fixed = run_pair(program.dags, steps, program.per_loop, program.tick, program.lookback)
            worse, both = compare(stock, fixed)
            if stock_failures(stock) and not worse and not both:
                result.stock_only += 1
            if not worse and not both:
                continue
            finding = Finding(
                program.name,
                program.dags,
                steps,
                worse,
                both,
                stock.summary(),
                fixed.summary(),
                result.ran[program.name],
                per_loop=program.per_loop,
                tick=program.tick,
                lookback=program.lookback,
            )
            if worse:
                log(f"  #{finding.index} THE FIX DOES WORSE: {worse}\n    {' '.join(steps)}")
                if minimize_first and not result.worse:
                    kinds = {w.split()[0] for w in worse}
                    finding.minimal = minimize(
                        program.dags,
                        steps,
                        lambda c: bool(
                            kinds
                            & {
                                w.split()[0]
                                for w in compare(
                                    *run_pair(
                                        program.dags, c, program.per_loop, program.tick, program.lookback
                                    )
                                )[0]
                            }
                        ),
                    )
                result.worse.append(finding)
                if stop_at_first:
                    break
            else:
                result.both.append(finding)
        if stop_at_first and result.worse:
            break
    result.seconds = time.monotonic() - start
    return result


def default_budget(backend: str) -> int:
    """Interleavings per program in CI (a few minutes per env); ADRF_EXPLORER_BUDGET overrides."""
    return int(os.environ.get("ADRF_EXPLORER_BUDGET", {"sqlite": 35, "postgres": 12, "mysql": 10}[backend]))


def default_seed() -> int:
    return int(os.environ.get("ADRF_EXPLORER_SEED", "33"))
