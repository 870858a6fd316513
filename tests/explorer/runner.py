"""
Run one schedule on a fresh ``World`` (real database), on the variant in place (stock or
fixed: the caller applies or removes the fix), and collect what the oracle needs.

Time is virtual and frozen: every step runs at its own instant (``TICK`` apart), a stall moves
the clock by ``stall`` seconds, a clock step by its own (back too). Python's clock is the
world's ``Clock``; on a server the fix's database clock (``DatasetManager._database_clock``)
is replaced by that same instant as a literal, so stamps follow the schedule, not the
machine's speed (SQLite's clock is Python's). No step sleeps.

Lock waits are real: a step that blocks on a row lock is left waiting and the actor's later
steps wait behind it until it goes on (the executed order is recorded). SQLite has one
writer: a step that would write while another actor's transaction holds the write lock
waits the same way (the executor knows which steps write, since SQLite's busy wait cannot
be observed).
"""

from __future__ import annotations

import contextlib
import io
import os
import time
from dataclasses import dataclass, field
from datetime import timedelta

from airflow.datasets import DatasetAny
from airflow.models.dag import DagModel
from airflow.models.dagrun import DagRun
from airflow.models.dataset import DatasetDagRunQueue, DatasetEvent, DatasetModel, association_table
from airflow.utils.session import create_session
from sqlalchemy import delete, func, select, update
from sqlalchemy.exc import OperationalError

from airflow_dataset_race_fix.diagnostics import invariant
from reproduce.harness.world import BLOCKED, DONE, PAUSED, Actor, World

from .model import Step, parse_step

TICK = 0.01
EVENT_READ = ("select dataset_event.id",)
QUEUE_DELETE = ("delete from dataset_dag_run_queue", "delete q from")
STAMP = ("update dataset_event",)
WRITES = {
    "atomic",
    "reg",
    "stamp",
    "loop",
    "e",
    "c",
    "blind",
    "fail",
    "pause",
    "unpause",
    "full",
    "free",
    "clean",
    "off",
    "on",
    "unmark",
}
NET_LOOK = "AIRFLOW__DATASET_RACE_FIX__NET_LOOK_INTERVAL_SECONDS"
LOOKBACK = "AIRFLOW__DATASET_RACE_FIX__EVENT_LOOKBACK_SECONDS"
MARK = "dataset-race-fix-followed"  # the net's mark of where it followed the event ids (a ``log`` row)
FINDING = "dataset-race-fix-finding"  # what the net found, kept until a run consumes it (a ``log`` row)
PARTNER = "Z"  # the drain's producer: an event on each dataset of an AND, so nothing waits for a partner
SCHEDULERS = ("S", "T")  # actor names that are schedulers (T: a second, HA scheduler)
QUIET_LOOPS = 2
# After a step that may release a lock, how long a waiting actor gets to wake up before it
# counts as still waiting (the server updates its lock view a moment after the release).
WAKE_GRACE = 0.5
RESTART_LOOPS = 2


@dataclass
class TxnResult:
    dataset: str = ""
    event_id: int | None = None
    committed: bool = False
    error: str | None = None


@dataclass
class Outcome:
    variant: str
    executed: list[str] = field(default_factory=list)
    trace: list[str] = field(default_factory=list)  # executed steps with how each ended (done/paused/blocked)
    txns: dict[str, TxnResult] = field(default_factory=dict)
    # per DAG, per transaction: how many runs consumed its event, and the loop that first did
    consumed: dict[str, dict[str, int]] = field(default_factory=dict)
    needed_net: dict[str, list[str]] = field(default_factory=dict)
    after_restart: dict[str, list[str]] = field(
        default_factory=dict
    )  # consumed only by the restarted scheduler
    unswept: dict[str, list[str]] = field(
        default_factory=dict
    )  # left by the sweep after the quiet loops (_unswept)
    lost: dict[str, list[str]] = field(default_factory=dict)
    doubled: dict[str, list[str]] = field(default_factory=dict)
    violations: dict[str, int] = field(default_factory=dict)
    scheduler_errors: list[str] = field(default_factory=list)
    stuck: str | None = None
    notes: list[str] = field(default_factory=list)

    def summary(self) -> str:
        bits = []
        for name in ("lost", "doubled", "unswept", "needed_net", "after_restart"):
            value = {k: v for k, v in getattr(self, name).items() if v}
            if value:
                bits.append(f"{name}={value}")
        if self.violations:
            bits.append(f"violations={self.violations}")
        failed = {k: v.error for k, v in self.txns.items() if v.error}
        if failed:
            bits.append(f"producer_errors={failed}")
        if self.scheduler_errors:
            bits.append(f"scheduler_errors={self.scheduler_errors}")
        if self.stuck:
            bits.append(f"stuck={self.stuck}")
        return "; ".join(bits) or "ok"


def _schedule_of(spec: str, datasets) -> object:
    """``a|b``: DatasetAny; ``a&b``: the list ``[a, b]`` (an AND, as DAGs write it); ``a``: ``[a]``."""
    if "|" in spec:
        return DatasetAny(*(datasets[x] for x in spec.split("|")))
    return [datasets[x] for x in spec.split("&")]


class _VirtualClock:
    """The world's frozen clock, and on servers the fix's database clock, at the same instant."""

    def __init__(self, world: World) -> None:
        from airflow.datasets.manager import DatasetManager

        self.world = world
        self.manager = DatasetManager
        self.saved = DatasetManager.__dict__.get("_database_clock")
        self.now = 1.0
        self.world.clock.base = self.world.clock.base + timedelta(
            hours=1, seconds=5
        )  # just ahead of real time

    def set(self, seconds: float) -> None:
        self.now = seconds
        instant = self.world.clock.at(seconds)
        if self.saved is None or self.world.backend == "sqlite":
            return
        text = instant.strftime("%Y-%m-%d %H:%M:%S.%f")
        literal = {
            "postgres": f"CAST('{text}+00' AS TIMESTAMP WITH TIME ZONE)",
            "mysql": f"CAST('{text}' AS DATETIME(6))",
        }[self.world.backend]
        self.manager._database_clock = classmethod(lambda cls, dialect_name, _l=literal: _l)

    def restore(self) -> None:
        if self.saved is not None:
            self.manager._database_clock = self.saved


class _FailingStatement:
    """
    ``S.fail:N``: the actor's Nth statement (on any of its connections) raises ``OperationalError``, once,
    before it is sent; ``retry_db_transaction`` on ``_create_dagruns_for_dags`` rolls back and runs it again.
    """

    def __init__(self, actor: Actor, at: int) -> None:
        self.actor = actor
        self.at = at
        self.seen = 0
        self.fired = False

    def __call__(self, statement: str, *, after: bool) -> None:
        if not after and not self.fired:
            self.seen += 1
            if self.seen == self.at:
                self.fired = True
                raise OperationalError(statement, None, Exception("injected by the explorer: a deadlock"))
        Actor.on_statement(self.actor, statement, after=after)


def _dag_spec(spec: str) -> tuple[str, int]:
    """``a|b/1``: the schedule, and max_active_runs after the slash (default: unbounded)."""
    schedule, _, most = spec.partition("/")
    return schedule, int(most or 100_000)


class Executor:
    def __init__(self, dags, tokens: list[str], variant: str, stall: float, tick: float = TICK) -> None:
        self.tick = tick
        self.dags = tuple(dags)
        self.steps = [parse_step(t) for t in tokens]
        self.variant = variant
        self.stall = stall
        self.world = World("xp")
        self.backend = self.world.backend
        self.clock = _VirtualClock(self.world)
        self._resume_net()
        letters = sorted(
            {s.dataset for s in self.steps if s.dataset} | {c for _, s in self.dags for c in s if c.isalpha()}
        )
        self.datasets = {x: self.world.dataset(x) for x in letters}
        self.dag_ids = {
            name: self.world.consumer(
                name, _schedule_of(_dag_spec(spec)[0], self.datasets), _dag_spec(spec)[1]
            )
            for name, spec in self.dags
        }
        self.cleaned: dict[str, set[int]] = {
            d: set() for d in self.dag_ids.values()
        }  # consumed by runs db clean deleted
        self.dag_datasets = {name: {c for c in spec if c.isalpha()} for name, spec in self.dags}
        self.actors: dict[str, Actor] = {}
        self.loops_done: dict[str, int] = {}
        self.deferred: dict[str, list[tuple[int, Step]]] = {}
        self.blocked: set[str] = set()
        self.paused_txn: dict[str, bool] = {}
        self.grace = False
        self.out = Outcome(variant)
        for step in self.steps:
            if step.txn is not None and step.dataset:
                self.out.txns[step.txn] = TxnResult(dataset=step.dataset)

    def _resume_net(self) -> None:
        """
        The net's marks and findings of earlier interleavings deleted (their DAGs take no part), and a mark at
        the newest event id written, a day old: this world's first scheduler resumes there, as one that took
        over from a process that followed the ids all along, whatever the database's history; a restart reads
        the marks of this world's schedulers (a first start, after ``D.unmark``, reads the history again).
        """
        import json

        from airflow.models import Log

        with create_session() as session:
            session.execute(delete(Log).where(Log.event.in_((MARK, FINDING))))
            newest = session.scalar(select(func.max(DatasetEvent.id))) or 0
            mark = {"high": newest, "missing": []}
            instant = self.world.clock.at(self.clock.now) - timedelta(days=1)  # a process gone: later win
            session.execute(Log.__table__.insert().values(dttm=instant, event=MARK, extra=json.dumps(mark)))

    # -- actors ---------------------------------------------------------------------------
    def actor(self, name: str) -> Actor:
        if name not in self.actors:
            if name in SCHEDULERS:
                self.actors[name] = self.world.scheduler(name)
            else:
                self.actors[name] = self.world.producer(name)
            self.deferred[name] = []
        return self.actors[name]

    def _holds_sqlite_write(self, actor: Actor) -> bool:
        raw = actor.connection.connection
        raw = getattr(raw, "dbapi_connection", None) or getattr(raw, "connection", raw)
        return bool(raw.in_transaction)

    def _may_run(self, step: Step) -> bool:
        if self.backend != "sqlite" or step.kind not in WRITES:
            return True
        me = self.actors.get(step.actor)
        return not any(self._holds_sqlite_write(a) for a in self.actors.values() if a is not me)

    # -- running ------------------------------------------------------------------------
    def run(self) -> Outcome:
        try:
            for step in self.steps:
                self.submit(step)
            self.settle(final=True)
            if not self.out.stuck:
                self.drain()
        finally:
            self.clock.restore()
        return self.out

    def submit(self, step: Step) -> None:
        self.clock.set(self.clock.now + self.tick)
        if step.kind in ("stall", "clock"):
            self.clock.set(self.clock.now + (self.stall if step.kind == "stall" else step.seconds))
            self.out.executed.append(str(step))
            return
        self.actor(step.actor)
        self.seq = getattr(self, "seq", 0) + 1
        self.deferred[step.actor].append((self.seq, step))
        self.settle()

    def settle(self, final: bool = False) -> None:
        """Run the deferred steps that can go on now, earliest submitted first, until none can."""
        while True:
            grace, self.grace = self.grace, False
            for name in list(self.blocked):
                actor = self.actors[name]
                if self._still_waiting(actor, grace):
                    continue
                state = actor._wait()  # it goes on: until done, paused, or blocked again
                if state == BLOCKED:
                    continue
                self.blocked.discard(name)
                self._after(name, state)
            ready = [
                (self.deferred[name][0][0], name)
                for name in self.deferred
                if self.deferred[name]
                and name not in self.blocked
                and self._may_run(self.deferred[name][0][1])
            ]
            if not ready:
                break
            _, name = min(ready)
            _, step = self.deferred[name].pop(0)
            self.out.executed.append(str(step))
            state = self.perform(self.actors[name], step)
            self.grace = self.grace or bool(self.blocked)  # it may have released what they wait for
            self.out.trace.append(f"{step}[{state}]")
            self._after(name, state, step)
        if final and (any(self.deferred.values()) or self.blocked):
            waiting = [str(s) for v in self.deferred.values() for _, s in v]
            self.out.stuck = f"blocked {sorted(self.blocked)}, waiting {waiting}"

    def _still_waiting(self, actor: Actor, grace: bool) -> bool:
        """Waiting for a lock; after a step that may have released it, give the server time to wake it."""
        deadline = time.monotonic() + (WAKE_GRACE if grace else 0)
        while self.world.is_waiting_for_lock(actor):
            if time.monotonic() >= deadline:
                return True
            time.sleep(0.01)
        return False

    def _after(self, name: str, state: str, step: Step | None = None) -> None:
        if state == BLOCKED:
            self.blocked.add(name)
            self.current = getattr(self, "current", {})
            self.current[name] = step
            return
        if step is None:
            step = getattr(self, "current", {}).pop(name, None)
        actor = self.actors[name]
        if state == DONE:
            self._collect(actor, step)
            if step is not None and step.kind == "blind":
                os.environ[NET_LOOK] = "0"

    def _collect(self, actor: Actor, step: Step | None) -> None:
        """The finished step's result (or error)."""
        try:
            result = actor.finish()
            error = None
        except Exception as err:  # noqa: BLE001 - reported
            result, error = None, f"{type(err).__name__}: {str(err).splitlines()[0][:160]}"
        if step is None:
            return
        if step.txn is not None:
            res = self.out.txns.setdefault(step.txn, TxnResult())
            if isinstance(result, int):
                res.event_id = result
            if error and "Aborted" not in error:
                res.error = error
            if step.kind in ("atomic", "commit", "stamp") and not error and result != "open":
                res.committed = step.kind != "stamp" or result == "committed"
        else:
            if error:
                self.out.scheduler_errors.append(f"{step}: {error}")
            if step.kind in ("loop", "blind", "c", "e", "q", "fail") and actor._step is None:
                actor._pause_patterns.clear()
            fault = actor.__dict__.pop("on_statement", None) if step.kind == "fail" else None
            if fault is not None and not fault.fired:
                self.out.notes.append(f"{step}: nothing failed, the loop ran {fault.seen} statements")

    def perform(self, actor: Actor, step: Step) -> str:
        fixed = self.variant == "fixed"
        if step.kind in ("atomic", "reg"):
            dataset = self.datasets[step.dataset]
            commit = step.kind == "atomic"

            def emit(session, dataset=dataset, commit=commit):
                from airflow.datasets.manager import dataset_manager

                event = dataset_manager.register_dataset_change(dataset=dataset, session=session)
                session.flush()
                event_id = event.id
                if commit:
                    session.commit()
                return event_id

            return actor.do(emit)
        if step.kind == "stamp":
            if not fixed:
                return actor.do(lambda session: "open")  # stock: nothing before COMMIT
            actor.pause_after(*STAMP)
            state = actor.do(lambda session: (session.commit(), "committed")[1])
            if state in (PAUSED, BLOCKED):
                self.paused_txn[step.actor] = True
            else:
                actor._pause_after_patterns.clear()
                self.out.notes.append(f"{step}: no stamp statement to pause after ({state})")
            return state
        if step.kind in ("commit", "rollback"):
            if self.paused_txn.pop(step.actor, False):
                return actor.resume() if step.kind == "commit" else actor.abort()
            if step.kind == "commit":
                return actor.do(lambda session: session.commit())
            return actor.do(lambda session: session.rollback())
        if step.actor == "D":
            return actor.do(lambda session: self.operate(step, session))
        if step.kind == "restart":
            self.actors[step.actor] = self.world.scheduler(step.actor)
            return DONE
        # scheduler loop parts
        if step.kind == "fail":
            actor.on_statement = _FailingStatement(actor, step.seconds)
        if step.kind in ("loop", "q", "blind", "fail"):
            actor._pause_patterns.clear()
            if step.kind == "blind":  # set back when the loop is done (it may wait for a lock first)
                os.environ[NET_LOOK] = "100000"
            if step.kind == "q":
                actor.pause_before(*EVENT_READ)
                actor.pause_before(*QUEUE_DELETE)
            self.loops_done[step.actor] = self.loops_done.get(step.actor, 0) + 1
            return World.loop(actor)
        # e, c: go on to the next pause point, or to the end
        if actor._step is None or actor._step.done.is_set():
            return DONE
        if step.kind == "c":
            actor._pause_patterns.clear()
        return actor.resume()

    def operate(self, step: Step, session) -> None:
        """The operator's step on the DAGs whose name starts with ``step.dataset``."""
        from airflow.utils.state import DagRunState

        if step.kind == "unmark":
            from airflow.models import Log

            session.execute(delete(Log).where(Log.event == MARK))
            session.commit()
            return
        dag_ids = [d for name, d in self.dag_ids.items() if name.startswith(step.dataset)]
        runs = DagRun.dag_id.in_(dag_ids)
        if step.kind in ("pause", "unpause"):
            session.execute(
                update(DagModel).where(DagModel.dag_id.in_(dag_ids)).values(is_paused=step.kind == "pause")
            )
        elif step.kind in ("off", "on"):  # the DAG file missing for a parse, then back
            active = step.kind == "on"
            session.execute(update(DagModel).where(DagModel.dag_id.in_(dag_ids)).values(is_active=active))
        elif step.kind == "full":  # each DAG's latest run running
            for dag_id in dag_ids:
                latest = (
                    select(func.max(DagRun.execution_date)).where(DagRun.dag_id == dag_id).scalar_subquery()
                )
                session.execute(
                    update(DagRun)
                    .where(DagRun.dag_id == dag_id, DagRun.execution_date == latest)
                    .values(state=DagRunState.RUNNING)
                    .execution_options(synchronize_session=False)
                )
        else:  # free, clean: the runs finish (db clean dates a run by its start)
            session.execute(
                update(DagRun)
                .where(runs)
                .values(state=DagRunState.SUCCESS)
                .execution_options(synchronize_session=False)
            )
            session.execute(
                update(DagRun)
                .where(runs, DagRun.start_date.is_(None))
                .values(start_date=DagRun.execution_date)
                .execution_options(synchronize_session=False)
            )
        session.commit()
        if step.kind == "clean":
            from airflow.utils.db_cleanup import run_cleanup

            newest = session.scalar(select(func.max(DagRun.execution_date)).where(runs))
            links = select(DagRun.dag_id, association_table.c.event_id).join(
                association_table, association_table.c.dag_run_id == DagRun.id
            )
            before = set(session.execute(links.where(runs)).all())
            if newest is not None:
                with contextlib.redirect_stdout(io.StringIO()):  # its report of what it deletes
                    run_cleanup(
                        clean_before_timestamp=newest,
                        table_names=["dag_run"],
                        confirm=False,
                        skip_archive=True,
                    )
            for dag_id, event_id in before - set(session.execute(links.where(runs)).all()):
                self.cleaned[dag_id].add(event_id)
            session.commit()

    # -- the end: quiet loops, a restarted scheduler, then the oracle's readings -------------
    def drain(self) -> None:
        """
        Quiet loops (the net looks at the event ids in each); a loop after them; then a
        restarted scheduler's loops (its windows read at once).
        """
        scheduler = "S"
        partners = sorted({x for name, spec in self.dags if "&" in spec for x in self.dag_datasets[name]})
        for number, dataset in enumerate(partners, 1):  # an AND's partners: what waits can be consumed
            self.out.txns[f"{PARTNER}{number}"] = TxnResult(dataset=dataset)
            self.submit(Step(PARTNER, f"{PARTNER}{number}", "atomic", dataset))
        for _ in range(QUIET_LOOPS):
            self.submit(Step(scheduler, None, "loop"))
        self.settle(final=True)
        before_net = self._consumption()
        self.submit(Step(scheduler, None, "loop"))
        self.settle(final=True)
        before_restart = self._consumption()
        unswept = self._unswept(before_restart)
        self.submit(Step(scheduler, None, "restart"))
        for _ in range(RESTART_LOOPS):
            self.submit(Step(scheduler, None, "loop"))
        self.settle(final=True)
        self._judge(before_net, before_restart, self._consumption(), unswept)

    def _consumption(self) -> dict[str, dict[int, int]]:
        with create_session() as session:
            rows = session.execute(
                select(DagRun.dag_id, association_table.c.event_id)
                .join(association_table, association_table.c.dag_run_id == DagRun.id)
                .where(DagRun.dag_id.in_(list(self.dag_ids.values())))
            ).all()
        counts: dict[str, dict[int, int]] = {d: {} for d in self.dag_ids.values()}
        for dag_id, event_id in rows:
            counts[dag_id][event_id] = counts[dag_id].get(event_id, 0) + 1
        for dag_id, event_ids in self.cleaned.items():  # what db clean deleted was consumed
            for event_id in event_ids:
                counts[dag_id][event_id] = counts[dag_id].get(event_id, 0) + 1
        return counts

    def _queued(self, session) -> set[tuple[str, str]]:
        return set(
            session.execute(
                select(DatasetDagRunQueue.target_dag_id, DatasetModel.uri)
                .join(DatasetModel, DatasetModel.id == DatasetDagRunQueue.dataset_id)
                .where(DatasetDagRunQueue.target_dag_id.in_(list(self.dag_ids.values())))
            ).all()
        )

    def _held(self, session) -> set[str]:
        """The DAGs paused, inactive or at max_active_runs: their events wait, none is lost."""
        active = select(func.count()).where(
            DagRun.dag_id == DagModel.dag_id, DagRun.state.in_(("queued", "running"))
        )
        return {
            dag_id
            for dag_id, paused, is_active, most, runs in session.execute(
                select(
                    DagModel.dag_id,
                    DagModel.is_paused,
                    DagModel.is_active,
                    DagModel.max_active_runs,
                    active.scalar_subquery(),
                ).where(DagModel.dag_id.in_(list(self.dag_ids.values())))
            )
            if paused or not is_active or runs >= most
        }

    def _unswept(self, consumed: dict[str, dict[int, int]]) -> set[tuple[str, int]]:
        """
        The sweep's promise (it looks every loop here), read after the quiet loops: no DAG that can run keeps
        an unconsumed event above its latest run without a queue row. The (dag_id, event_id) that break it.
        """
        with create_session() as session:
            held, queued = self._held(session), self._queued(session)
            latest = dict(
                session.execute(
                    select(DagRun.dag_id, func.max(DagRun.execution_date))
                    .where(DagRun.dag_id.in_(list(self.dag_ids.values())))
                    .group_by(DagRun.dag_id)
                ).all()
            )
            events = session.execute(
                select(DatasetEvent.id, DatasetModel.uri, DatasetEvent.timestamp)
                .join(DatasetModel, DatasetModel.id == DatasetEvent.dataset_id)
                .where(DatasetModel.uri.startswith(f"race://{self.world.prefix}/"))
            ).all()
        return {
            (dag_id, event_id)
            for name, dag_id in self.dag_ids.items()
            for event_id, uri, stamp in events
            if dag_id not in held
            and "&" not in dict(self.dags)[name]
            and uri.rsplit("/", 1)[1] in self.dag_datasets[name]
            and (dag_id, uri) not in queued
            and not consumed[dag_id].get(event_id)
            and stamp > latest.get(dag_id, stamp - timedelta(1))
        }

    def _judge(self, before: dict, before_restart: dict, after: dict, unswept: set[tuple[str, int]]) -> None:
        with create_session() as session:
            committed = set(
                session.scalars(
                    select(DatasetEvent.id)
                    .join(DatasetModel, DatasetModel.id == DatasetEvent.dataset_id)
                    .where(DatasetModel.uri.startswith(f"race://{self.world.prefix}/"))
                )
            )
            queued, held = self._queued(session), self._held(session)
            report = invariant.check(session, list(self.dag_ids.values()))
        self.out.violations = report.violations()
        for res in self.out.txns.values():
            res.committed = res.event_id in committed
        for name, dag_id in self.dag_ids.items():
            self.out.consumed[name] = {}
            self.out.lost[name], self.out.doubled[name], self.out.needed_net[name] = [], [], []
            self.out.after_restart[name], self.out.unswept[name] = [], []
            for txn, res in self.out.txns.items():
                if not res.committed or res.dataset not in self.dag_datasets[name]:
                    continue
                n = after[dag_id].get(res.event_id, 0)
                self.out.consumed[name][txn] = n
                if n == 0 and (dag_id, self.datasets[res.dataset].uri) not in queued and dag_id not in held:
                    self.out.lost[name].append(txn)
                if n > 1:
                    self.out.doubled[name].append(txn)
                if n and not before[dag_id].get(res.event_id):
                    self.out.needed_net[name].append(txn)  # the net's full read, not the quiet loops
                if n and not before_restart[dag_id].get(res.event_id):
                    self.out.after_restart[name].append(txn)
                if (dag_id, res.event_id) in unswept:
                    self.out.unswept[name].append(txn)

    def close(self) -> None:
        self.clock.restore()
        self.world.close()


def run_schedule(
    dags,
    tokens: list[str],
    variant: str,
    stall: float,
    per_loop: int | None = None,
    tick: float = TICK,
    lookback: int | None = None,
) -> Outcome:
    saved = DagModel.NUM_DAGS_PER_DAGRUN_QUERY  # max_dagruns_to_create_per_loop, read at import
    DagModel.NUM_DAGS_PER_DAGRUN_QUERY = per_loop or saved
    saved_lookback = os.environ.get(LOOKBACK)
    if lookback is not None:
        os.environ[LOOKBACK] = str(lookback)
    ex = Executor(dags, tokens, variant, stall, tick)
    try:
        return ex.run()
    finally:
        ex.close()
        DagModel.NUM_DAGS_PER_DAGRUN_QUERY = saved
        os.environ[NET_LOOK] = "0"
        if saved_lookback is None:
            os.environ.pop(LOOKBACK, None)
        else:
            os.environ[LOOKBACK] = saved_lookback


def settings_env(latency: int = 1) -> dict[str, str]:
    """The [dataset_race_fix] settings of an exploration (env vars, read at each use)."""
    return {
        "AIRFLOW__DATASET_RACE_FIX__COMMIT_LATENCY_SECONDS": str(latency),
        "AIRFLOW__DATASET_RACE_FIX__REQUEUE_INTERVAL_SECONDS": "0",
        # the net looks at the ids in every loop, and a restarted scheduler reads its windows at once
        "AIRFLOW__DATASET_RACE_FIX__NET_LOOK_INTERVAL_SECONDS": "0",
    }


def apply_settings(latency: int = 1) -> dict[str, str | None]:
    env = settings_env(latency)
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    return saved
