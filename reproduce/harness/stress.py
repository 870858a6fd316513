"""
Random concurrent stress: producer processes, scheduler loops, then a drain and the
invariant counts. Random but reproducible: every choice comes from the printed seed.

Producers and scheduler loops are separate interpreters (spawned, not forked: a forked
child would inherit the parent's database sockets). Each producer transaction is one
task finishing: it registers ``outlets`` events (one by default; 2-3 in the multi-outlet
mode, on distinct datasets of ``a``, ``b``, ``c`` in random order, as a task with several
outlets does) and commits; some producers hold their transaction open a few
milliseconds after each event, which is where commit order and timestamp order part.
There are no retries: a failed transaction (a deadlock, a lock timeout) is counted.
Consumers: one DAG on ``a``, one on ``a & b``, one on ``a | b`` (and one on ``c`` in the
multi-outlet mode). One scheduler
loop process, two on PostgreSQL (Airflow's HA schedulers need row locks: PostgreSQL and
MySQL 8; MariaDB and SQLite take none). After the producers finish, the scheduler
drains and the checker counts.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import time
import traceback
from dataclasses import asdict, dataclass, field

from airflow import settings
from airflow.datasets import DatasetAll, DatasetAny

from reproduce.harness.world import World


@dataclass
class StressConfig:
    seed: int = 20261130
    producers: int = 8
    events_per_producer: int = 50
    schedulers: int | None = None  # default: 2 on PostgreSQL, else 1
    hold_ms: tuple[float, float] = (1.0, 8.0)
    holding_share: float = 0.5  # share of producers that hold their transaction open
    outlets: tuple[int, int] = (1, 1)  # events per producer transaction, min and max

    @property
    def multi_outlet(self) -> bool:
        return self.outlets[1] > 1


@dataclass
class StressResult:
    config: StressConfig
    backend: str
    produced: int  # events registered by producer transactions that committed
    events_in_db: int  # events of the world's datasets found afterwards (must equal produced)
    producer_failures: int  # producer transactions that failed (never retried)
    scheduler_loops: int
    scheduler_failures: int
    seconds: float
    totals: dict[str, int]
    violations: dict[str, int]
    failure_samples: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return asdict(self)

    def problems(self) -> dict[str, int]:
        problems = dict(self.violations)
        if self.producer_failures:
            problems["producer_failures"] = self.producer_failures
        if self.scheduler_failures:
            problems["scheduler_failures"] = self.scheduler_failures
        if self.events_in_db != self.produced:
            problems["events_committed_vs_found"] = self.events_in_db - self.produced
        return problems


def _start_child(fixed: bool) -> None:
    """In a spawned child: the same variant as the parent (stock, or the fix in place)."""
    if fixed:
        import airflow_dataset_race_fix

        airflow_dataset_race_fix.apply(strict=True)


def _fix_is_active() -> bool:
    from airflow_dataset_race_fix import runtime

    name = "airflow.jobs.scheduler_job_runner"
    return runtime.module_state(name).state in (runtime.PATCHED, runtime.SOURCE_PATCHED)


def _producer(index: int, uris: list[str], config: StressConfig, fixed: bool, ready, results) -> None:
    _start_child(fixed)
    from airflow.datasets import Dataset
    from airflow.datasets.manager import dataset_manager

    ready.wait()  # every child has imported Airflow: start together
    rng = random.Random(config.seed * 1000 + index)
    holds = rng.random() < config.holding_share
    ok, failures, samples = 0, 0, []
    for _ in range(config.events_per_producer):
        outlets = rng.sample(uris, rng.randint(*config.outlets))  # distinct datasets, random order
        session = settings.Session.session_factory()
        try:
            for uri in outlets:
                dataset_manager.register_dataset_change(dataset=Dataset(uri), session=session)
                session.flush()
                if holds:
                    time.sleep(rng.uniform(*config.hold_ms) / 1000)
            session.commit()
            ok += len(outlets)
        except Exception as err:  # a failed producer transaction is a finding, not a crash
            failures += 1
            session.rollback()
            if len(samples) < 3:
                samples.append(f"producer {index}: {type(err).__name__}: {str(err).splitlines()[0][:200]}")
        finally:
            session.close()
    results.put(("producer", ok, failures, samples))


def _scheduler(index: int, fixed: bool, ready, stop, results) -> None:
    _start_child(fixed)
    from airflow.jobs.job import Job
    from airflow.jobs.scheduler_job_runner import SchedulerJobRunner
    from airflow.utils.sqlalchemy import prohibit_commit

    session = settings.Session.session_factory()
    job = Job()
    session.add(job)
    session.commit()
    runner = SchedulerJobRunner(job=job, num_runs=1)
    loops, failures, samples = 0, 0, []
    ready.wait()
    while not stop.is_set():
        try:
            with prohibit_commit(session) as guard:
                runner._create_dagruns_for_dags(guard=guard, session=session)
            loops += 1
        except Exception as err:
            failures += 1
            session.rollback()
            if len(samples) < 3:
                samples.append(
                    f"scheduler {index}: {type(err).__name__}: "
                    f"{''.join(traceback.format_exception_only(err))[:300]}"
                )
        time.sleep(0.005)
    session.close()
    results.put(("scheduler", loops, failures, samples))


def run_stress(config: StressConfig, *, log=print) -> StressResult:
    started = time.monotonic()
    world = World("stress")
    schedulers = config.schedulers or (2 if world.backend == "postgres" else 1)
    log(
        f"stress on {world.backend}: seed {config.seed}, {config.producers} producers x "
        f"{config.events_per_producer} transactions of {config.outlets[0]}-{config.outlets[1]} outlet(s), "
        f"{schedulers} scheduler loop(s)"
    )
    datasets = [world.dataset(name) for name in ("a", "b", "c")[: 3 if config.multi_outlet else 2]]
    a, b = datasets[:2]
    world.consumer("single_a", [a])
    world.consumer("all_a_b", DatasetAll(a, b))
    world.consumer("any_a_b", DatasetAny(a, b))
    if config.multi_outlet:
        world.consumer("single_c", [datasets[2]])
    fixed = _fix_is_active()

    ctx = multiprocessing.get_context("spawn")
    results, stop, ready = ctx.Queue(), ctx.Event(), ctx.Barrier(schedulers + config.producers + 1)
    scheduler_procs = [
        ctx.Process(target=_scheduler, args=(i, fixed, ready, stop, results)) for i in range(schedulers)
    ]
    producer_procs = [
        ctx.Process(target=_producer, args=(i, [d.uri for d in datasets], config, fixed, ready, results))
        for i in range(config.producers)
    ]
    for proc in scheduler_procs + producer_procs:
        proc.start()
    ready.wait(timeout=300)
    for proc in producer_procs:
        proc.join()
    stop.set()
    for proc in scheduler_procs:
        proc.join()

    produced = producer_failures = loops = scheduler_failures = 0
    samples: list[str] = []
    for _ in range(len(producer_procs) + len(scheduler_procs)):
        kind, count, failures, more = results.get(timeout=60)
        samples.extend(more)
        if kind == "producer":
            produced, producer_failures = produced + count, producer_failures + failures
        else:
            loops, scheduler_failures = loops + count, scheduler_failures + failures
    crashed = [p.exitcode for p in producer_procs + scheduler_procs if p.exitcode]
    if crashed:
        samples.append(f"{len(crashed)} worker process(es) exited with {crashed}")
        producer_failures += len(crashed)

    scheduler = world.scheduler("drain")
    loops += world.drain(scheduler, start=None)
    report = world.report()
    world.close()
    result = StressResult(
        config=config,
        backend=world.backend,
        produced=produced,
        events_in_db=sum(
            report.by_dag()[f"{world.prefix}_{dag}"].produced
            for dag in ("any_a_b", "single_c")[: 2 if config.multi_outlet else 1]
        ),  # the OR DAG sees a and b, single_c sees c
        producer_failures=producer_failures,
        scheduler_loops=loops,
        scheduler_failures=scheduler_failures,
        seconds=round(time.monotonic() - started, 1),
        totals=report.totals(),
        violations=report.violations(),
        failure_samples=samples,
    )
    log(f"stress result: {result.as_dict()}")
    return result


def seed_from_env(default: int = 20261130) -> int:
    return int(os.environ.get("ADRF_STRESS_SEED", default))
