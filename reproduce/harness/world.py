"""
A small world on a real metadata database: datasets, consumer DAGs, producers and
scheduler loops, each actor with its own thread, session and connection, driven step by
step so that a scenario names its interleaving exactly.

A step runs on its actor's thread and the caller waits until the step is *done*, is
*paused* at a statement the scenario asked to stop before, or is *blocked* on a row lock
in the database (read from ``pg_stat_activity`` / ``information_schema.innodb_trx``, not
guessed from timing). The scenario then goes on with other actors and later resumes or
finishes the paused or blocked one. Time is the world's ``Clock`` (time-machine), so
every event and queue row gets the instant the scenario names.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

import time_machine
from airflow import settings
from airflow.datasets import Dataset
from airflow.jobs.job import Job
from airflow.models.dag import DAG, DagModel
from airflow.models.dagrun import DagRun
from airflow.models.dataset import DatasetDagRunQueue
from airflow.models.serialized_dag import SerializedDagModel
from airflow.operators.empty import EmptyOperator
from airflow.utils.session import create_session
from airflow.utils.sqlalchemy import prohibit_commit
from airflow.utils.state import DagRunState
from airflow.utils.types import DagRunType
from sqlalchemy import delete, event, select, text, update
from sqlalchemy.orm import Session

from airflow_dataset_race_fix.diagnostics import invariant

DONE, PAUSED, BLOCKED = "done", "paused", "blocked"
STEP_TIMEOUT = 60.0
_world_ids = itertools.count(1)
_current_actor = threading.local()


def backend_name(session: Session | None = None) -> str:
    dialect = (session.bind if session is not None else settings.engine).dialect.name
    return {"postgresql": "postgres"}.get(dialect, dialect)


class Clock:
    """Process-wide controlled time: ``at(s)`` moves utcnow() to ``base + s`` seconds, frozen."""

    def __init__(self) -> None:
        now = datetime.now(timezone.utc).replace(microsecond=0)
        self.base = now - timedelta(hours=1)
        self._travel: time_machine.travel | None = None
        self.now = 0.0

    def at(self, seconds: float) -> datetime:
        self.stop()
        self.now = seconds
        instant = self.base + timedelta(seconds=seconds)
        self._travel = time_machine.travel(instant, tick=False)
        self._travel.start()
        return instant

    def stop(self) -> None:
        if self._travel is not None:
            self._travel.stop()
            self._travel = None


class Aborted(RuntimeError):
    """Raised into a paused actor by ``Actor.abort``."""


@dataclass
class _Step:
    fn: Callable[[Session], Any]
    done: threading.Event
    result: Any = None
    error: BaseException | None = None


class Actor:
    """One database client (a producer or a scheduler) on its own thread and connection."""

    def __init__(self, world: World, name: str) -> None:
        self.world = world
        self.name = name
        self.connection_id: int | None = None
        self._pause_patterns: list[tuple[str, ...]] = []
        self._pause_after_patterns: list[tuple[str, ...]] = []
        self._abort_on_resume = False
        self._paused = threading.Event()
        self._resume = threading.Event()
        self._steps: queue.Queue[_Step | None] = queue.Queue()
        self._step: _Step | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"actor-{name}", daemon=True)
        self._thread.start()
        self._ready.wait(STEP_TIMEOUT)

    # -- actor thread -------------------------------------------------------------------
    def _run(self) -> None:
        _current_actor.value = self
        # One connection for the actor's lifetime, so that its lock waits can be looked up.
        self.connection = settings.engine.connect()
        self.session = settings.Session.session_factory(bind=self.connection)
        self.connection_id = self.world.connection_id(self.session)
        self.session.commit()
        self._ready.set()
        while (step := self._steps.get()) is not None:
            try:
                step.result = step.fn(self.session)
            except BaseException as err:  # reported to the scenario by finish()
                step.error = err
                self.session.rollback()
            step.done.set()
        self.session.close()
        self.connection.close()

    def on_statement(self, statement: str, *, after: bool) -> None:
        """Called on this actor's thread before and after each SQL statement it sends."""
        patterns = self._pause_after_patterns if after else self._pause_patterns
        lowered = statement.lower()
        for pattern in patterns:
            if any(alternative in lowered for alternative in pattern):
                patterns.remove(pattern)
                self._resume.clear()
                self._paused.set()
                if not self._resume.wait(STEP_TIMEOUT):
                    raise TimeoutError(f"{self.name} was never resumed")
                if self._abort_on_resume:
                    self._abort_on_resume = False
                    raise Aborted(f"{self.name} aborted at a pause: its transaction rolls back")
                return

    # -- scenario side ------------------------------------------------------------------
    def pause_before(self, *patterns: str) -> Actor:
        """Pause this actor's next statement containing one of ``patterns`` (case-insensitive)."""
        self._pause_patterns.append(tuple(p.lower() for p in patterns))
        return self

    def pause_after(self, *patterns: str) -> Actor:
        """Pause right after this actor's next statement containing one of ``patterns``."""
        self._pause_after_patterns.append(tuple(p.lower() for p in patterns))
        return self

    def do(self, fn: Callable[[Session], Any]) -> str:
        """Run ``fn(session)`` on this actor; wait until done, paused or blocked."""
        if self._step is not None and not self._step.done.is_set():
            raise RuntimeError(f"{self.name} is still busy with its previous step")
        self._step = _Step(fn, threading.Event())
        self._paused.clear()
        self._steps.put(self._step)
        return self._wait()

    def resume(self) -> str:
        self._paused.clear()
        self._resume.set()
        return self._wait()

    def abort(self) -> str:
        """Resume a paused actor with an error at its pause point: its transaction rolls back."""
        self._abort_on_resume = True
        return self.resume()

    def finish(self) -> Any:
        """Wait for the current step to complete and return its result (or raise its error)."""
        if self._step is None:
            return None
        if self._paused.is_set():
            self.resume()
        if not self._step.done.wait(self.world.step_timeout):
            raise TimeoutError(f"{self.name} did not finish its step")
        step, self._step = self._step, None
        if step.error is not None:
            raise step.error
        return step.result

    def _wait(self) -> str:
        timeout = self.world.step_timeout
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._step.done.wait(0.005):
                return DONE
            if self._paused.is_set():
                return PAUSED
            if self.world.is_waiting_for_lock(self):
                return BLOCKED
        raise TimeoutError(f"{self.name}: step neither finished, paused nor blocked in {timeout}s")

    def close(self) -> None:
        self._steps.put(None)
        self._thread.join(STEP_TIMEOUT)


def _before_cursor_execute(conn, cursor, statement, parameters, context, executemany):
    actor = getattr(_current_actor, "value", None)
    if actor is not None:
        actor.on_statement(statement, after=False)


def _after_cursor_execute(conn, cursor, statement, parameters, context, executemany):
    actor = getattr(_current_actor, "value", None)
    if actor is not None:
        actor.on_statement(statement, after=True)


class World:
    """Consumer DAGs, producers and schedulers of one scenario, on the configured database."""

    def __init__(self, name: str, step_timeout: float = STEP_TIMEOUT) -> None:
        # How long one step may run before the scenario calls it hung. Raise it only where a
        # step is slow by design (the size tests' 10 000-row loops), never to hide a lock wait:
        # a blocked step is reported as BLOCKED at once, whatever this is.
        self.step_timeout = step_timeout
        self.prefix = f"{name.lower()}_{next(_world_ids)}_{int(time.time() * 1000) % 100000}"
        self.clock = Clock()
        self.dag_ids: list[str] = []
        self.actors: list[Actor] = []
        self.backend = backend_name()
        if not event.contains(settings.engine, "before_cursor_execute", _before_cursor_execute):
            event.listen(settings.engine, "before_cursor_execute", _before_cursor_execute)
            event.listen(settings.engine, "after_cursor_execute", _after_cursor_execute)
        self._monitor = settings.Session.session_factory()
        self._quiet_other_worlds()

    # -- building the world ------------------------------------------------------------
    def _quiet_other_worlds(self) -> None:
        """
        Earlier worlds' DAGs must not take part in this world's scheduler loops, nor their events in its net:
        the fix's findings and marks of where the ids were followed (``log`` rows) go, and one mark at the
        newest id says that every id before this world was followed (as a scheduler that ran on would have).
        """
        import json

        from airflow.models.dataset import DatasetEvent
        from airflow.models.log import Log
        from sqlalchemy import func

        with create_session() as session:
            session.execute(delete(DatasetDagRunQueue))
            session.execute(update(DagModel).values(is_paused=True))
            net = ("dataset-race-fix-finding", "dataset-race-fix-followed")
            session.execute(delete(Log).where(Log.event.in_(net)))
            newest = session.scalar(select(func.max(DatasetEvent.id))) or 0
            session.add(Log(net[1], extra=json.dumps({"high": newest, "missing": []})))

    def dataset(self, name: str) -> Dataset:
        return Dataset(f"race://{self.prefix}/{name}")

    def consumer(self, name: str, schedule, max_active_runs: int = 100_000) -> str:
        (dag_id,) = self._write_consumers([self._consumer_dag(name, schedule, max_active_runs)])
        return dag_id

    def consumers(self, name: str, schedule, count: int) -> list[str]:
        """``count`` unpaused consumer DAGs ``{name}{i:05d}`` on ``schedule``, written in bulk."""
        return self._write_consumers([self._consumer_dag(f"{name}{i:05d}", schedule) for i in range(count)])

    def _consumer_dag(self, name: str, schedule, max_active_runs: int = 100_000) -> DAG:
        dag = DAG(
            f"{self.prefix}_{name}",
            schedule=schedule,
            start_date=datetime(2024, 1, 1, tzinfo=timezone.utc),
            max_active_runs=max_active_runs,
            catchup=False,
        )
        EmptyOperator(task_id="consume", dag=dag)
        return dag

    def _write_consumers(self, dags: list[DAG]) -> list[str]:
        """Write ``dags`` and their serializations, unpaused; they take part in this world's checks."""
        dag_ids = [dag.dag_id for dag in dags]
        with create_session() as session:
            DAG.bulk_write_to_db(dags, session=session)
            session.add_all(SerializedDagModel(dag) for dag in dags)
        with create_session() as session:
            for start in range(0, len(dag_ids), 500):
                session.execute(
                    update(DagModel)
                    .where(DagModel.dag_id.in_(dag_ids[start : start + 500]))
                    .values(is_paused=False)
                    .execution_options(synchronize_session=False)
                )
        self.dag_ids += dag_ids
        return dag_ids

    def producer(self, name: str) -> Actor:
        actor = Actor(self, name)
        self.actors.append(actor)
        return actor

    def scheduler(self, name: str = "scheduler") -> Actor:
        actor = self.producer(name)
        with create_session() as session:
            job = Job()
            session.add(job)
            session.commit()
            job_id = job.id

        def make_runner(session: Session):
            from airflow.jobs.scheduler_job_runner import SchedulerJobRunner

            job = session.get(Job, job_id)
            actor.runner = SchedulerJobRunner(job=job, num_runs=1)

        actor.do(make_runner)
        actor.finish()
        return actor

    # -- steps -------------------------------------------------------------------------
    def emit(self, producer: Actor, dataset: Dataset, *, commit: bool = True) -> str:
        """The producer registers an event on ``dataset`` (the fix's or stock's code path)."""

        def step(session: Session):
            from airflow.datasets.manager import dataset_manager

            dataset_manager.register_dataset_change(dataset=dataset, session=session)
            session.flush()
            if commit:
                session.commit()

        return producer.do(step)

    @staticmethod
    def commit(actor: Actor) -> str:
        return actor.do(lambda session: session.commit())

    @staticmethod
    def loop(scheduler: Actor) -> str:
        """One scheduler pass of run creation (``SchedulerJobRunner._create_dagruns_for_dags``)."""

        def step(session: Session):
            with prohibit_commit(session) as guard:
                scheduler.runner._create_dagruns_for_dags(guard=guard, session=session)

        return scheduler.do(step)

    def finish_runs(self) -> None:
        """Mark this world's queued and running runs successful (frees max_active_runs)."""
        with create_session() as session:
            session.execute(
                update(DagRun)
                .where(
                    DagRun.dag_id.in_(self.dag_ids),
                    DagRun.state.in_((DagRunState.QUEUED, DagRunState.RUNNING)),
                )
                .values(state=DagRunState.SUCCESS)
                .execution_options(synchronize_session=False)
            )

    def drain(self, scheduler: Actor, *, start: float | None, max_loops: int = 12) -> int:
        """
        Scheduler loops (runs finished in between) until two loops in a row change nothing.

        ``start``: world-clock second of the first loop (one second per loop), or None to
        drain in real time.
        """
        quiet, loops, previous = 0, 0, None
        while quiet < 2 and loops < max_loops:
            self.finish_runs()
            if start is not None:
                self.clock.at(start + loops)
            self.loop(scheduler)
            scheduler.finish()
            loops += 1
            state = self._queue_and_runs()
            quiet = quiet + 1 if state == previous else 0
            previous = state
        return loops

    def _queue_and_runs(self):
        with create_session() as session:
            queued = sorted(
                session.execute(
                    select(
                        DatasetDagRunQueue.dataset_id,
                        DatasetDagRunQueue.target_dag_id,
                        DatasetDagRunQueue.created_at,
                    ).where(DatasetDagRunQueue.target_dag_id.in_(self.dag_ids))
                ).all()
            )
            runs = session.scalar(
                select(text("count(*)"))
                .select_from(DagRun)
                .where(DagRun.dag_id.in_(self.dag_ids), DagRun.run_type == DagRunType.DATASET_TRIGGERED)
            )
        return queued, runs

    def report(self) -> invariant.Report:
        with create_session() as session:
            return invariant.check(session, self.dag_ids)

    # -- database introspection -----------------------------------------------------------
    def connection_id(self, session: Session) -> int | None:
        if self.backend == "postgres":
            return session.scalar(text("select pg_backend_pid()"))
        if self.backend == "mysql":
            return session.scalar(text("select connection_id()"))
        return None

    def is_waiting_for_lock(self, actor: Actor) -> bool:
        if actor.connection_id is None:
            return False
        try:
            if self.backend == "postgres":
                return bool(
                    self._monitor.scalar(
                        text(
                            "select count(*) from pg_stat_activity where pid = :id "
                            "and wait_event_type = 'Lock'"
                        ),
                        {"id": actor.connection_id},
                    )
                )
            # MariaDB leaves some waiting transactions out of information_schema.innodb_trx;
            # the InnoDB monitor lists every transaction with its thread id and LOCK WAIT.
            status = self._monitor.execute(text("show engine innodb status")).fetchone()[2]
            for block in status.split("---TRANSACTION")[1:]:
                if f"thread id {actor.connection_id}," in block:
                    return "LOCK WAIT" in block
            return False
        finally:
            self._monitor.commit()

    def close(self) -> None:
        self.clock.stop()
        for actor in self.actors:
            if actor._step is not None and not actor._step.done.is_set():
                actor._resume.set()
            actor.close()
        self._monitor.close()
