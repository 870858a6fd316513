"""
``audit`` on real databases: damage made by the stock scheduler (scenarios S1-S7 and the
stress run) is found exactly, ``--requeue --yes`` plus a fixed drain recovers the lost
events, a healthy database audits clean, and bad input gets one clear line (exit 2).

What is compared, precisely:

- the audit's counters are the invariant checker's (one implementation), so its JSON
  ``totals`` must equal what the scenario/stress run itself counted for the same DAGs:
  ``lost`` (unconsumed, no queue row: the tests' drained view), ``doubled``,
  ``empty_runs`` and ``out_of_order``;
- the audit's lists are checked against an independent, naive Python computation over the
  raw rows (``_oracle``): the suspected-lost events (unconsumed although a later
  DATASET_TRIGGERED run of the DAG exists: the audit's view), the doubled events, the
  empty and out-of-order runs. Suspected lost and lost differ by definition (an event
  whose queue row was deleted and that no later run followed is lost, not suspected;
  an event older than the latest run whose dataset still has a queue row is suspected,
  not lost), so each is compared with its own oracle;
- after ``--requeue --yes`` and a drain of the fixed scheduler with
  ``event_lookback_seconds=0`` (so only the requeued rows' created_at can reach the old
  events), neither lost nor suspected-lost events are left.
"""

from __future__ import annotations

import json
import secrets
from collections import defaultdict
from datetime import datetime, timezone

import pytest
from airflow.datasets import Dataset
from conftest import BACKEND
from sqlalchemy import create_engine, select, text
from sqlalchemy.engine import make_url

from airflow_dataset_race_fix import cli
from airflow_dataset_race_fix.diagnostics import invariant
from reproduce.harness.database import ScratchDatabase
from reproduce.harness.scenarios import SCENARIOS, run_scenario
from reproduce.harness.stress import StressConfig, run_stress, seed_from_env
from reproduce.harness.world import World


# -- helpers ----------------------------------------------------------------------------
def audit(capsys, *args: str) -> tuple[int, dict]:
    """Run ``audit --json`` in this interpreter; (exit status, report)."""
    capsys.readouterr()
    status = cli.main(["audit", "--json", *args])
    out, err = capsys.readouterr()
    assert status in (0, 1), err
    return status, json.loads(out)


def audit_error(capsys, *args: str) -> str:
    """Run ``audit`` expecting bad input: exit 2 and exactly one line on stderr."""
    capsys.readouterr()
    status = cli.main(["audit", *args])
    out, err = capsys.readouterr()
    assert status == 2, (status, out, err)
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def dag_args(dag_ids) -> list[str]:
    return [arg for dag_id in sorted(dag_ids) for arg in ("--dag-id", dag_id)]


def session():
    from airflow import settings

    return settings.Session.session_factory()


def _oracle(dag_ids) -> dict[str, set]:
    """The audit's lists, computed naively from raw rows (no shared SQL with the checker)."""
    from airflow.models.dagrun import DagRun
    from airflow.models.dataset import (
        DagScheduleDatasetReference as Ref,
    )
    from airflow.models.dataset import (
        DatasetDagRunQueue as Queue,
    )
    from airflow.models.dataset import (
        DatasetEvent,
    )
    from airflow.models.dataset import (
        association_table as consumed,
    )

    with session() as s:
        datasets = defaultdict(set)
        for dag_id, dataset_id in s.execute(
            select(Ref.dag_id, Ref.dataset_id).where(Ref.dag_id.in_(dag_ids))
        ):
            datasets[dag_id].add(dataset_id)
        runs = s.execute(
            select(
                DagRun.id,
                DagRun.dag_id,
                DagRun.run_id,
                DagRun.execution_date,
                DagRun.data_interval_start,
                DagRun.data_interval_end,
            ).where(DagRun.dag_id.in_(dag_ids), DagRun.run_type == "dataset_triggered")
        ).all()
        run_by_id = {r.id: r for r in runs}
        all_pairs = s.execute(select(consumed.c.dag_run_id, consumed.c.event_id)).all()
        pairs = [(run, event) for run, event in all_pairs if run in run_by_id]
        events = s.execute(select(DatasetEvent.id, DatasetEvent.dataset_id, DatasetEvent.timestamp)).all()
        queued = set(s.execute(select(Queue.target_dag_id, Queue.dataset_id)).all())

    times = defaultdict(int)
    for run, event in pairs:
        times[run_by_id[run].dag_id, event] += 1
    now = datetime.now(timezone.utc)
    names = (
        "suspected_lost",
        "lost",
        "doubled",
        "empty_runs",
        "out_of_order",
        "future_dated",
        "overlapping_intervals",
    )
    result = {name: set() for name in names}
    for dag_id in dag_ids:
        own = [r for r in runs if r.dag_id == dag_id]
        for event in (e for e in events if e.dataset_id in datasets[dag_id]):
            n = times[dag_id, event.id]
            if n == 0 and any(r.execution_date > event.timestamp for r in own):
                result["suspected_lost"].add((dag_id, event.id))
            if n == 0 and (dag_id, event.dataset_id) not in queued:
                result["lost"].add((dag_id, event.id))
            if n > 1:
                result["doubled"].add((dag_id, event.id))
            if event.timestamp.replace(tzinfo=timezone.utc) > now:
                result["future_dated"].add((dag_id, event.id))
        by_date = sorted(own, key=lambda r: r.execution_date)
        for before, r in zip(by_date, by_date[1:]):  # overlapping: with the run just before it
            if (
                None not in (before.data_interval_end, r.data_interval_start)
                and r.data_interval_start < before.data_interval_end
            ):
                result["overlapping_intervals"].add((dag_id, r.run_id))
        consuming_runs = {run for run, _ in pairs}
        for r in own:
            if r.id not in consuming_runs:
                result["empty_runs"].add((dag_id, r.run_id))
            if any(o.id < r.id and o.execution_date > r.execution_date for o in own):
                result["out_of_order"].add((dag_id, r.run_id))
    return result


def assert_lists_match_oracle(report: dict, dag_ids) -> dict[str, set]:
    expected = _oracle(dag_ids)
    found = report["findings"]
    assert {(e["dag_id"], e["event_id"]) for e in found["suspected_lost"]} == expected["suspected_lost"]
    assert {(e["dag_id"], e["event_id"]) for e in found["doubled"]} == expected["doubled"]
    assert {(r["dag_id"], r["run_id"]) for r in found["empty_runs"]} == expected["empty_runs"]
    assert {(r["dag_id"], r["run_id"]) for r in found["out_of_order"]} == expected["out_of_order"]
    assert {(e["dag_id"], e["event_id"]) for e in found["future_dated"]} == expected["future_dated"]
    assert {(r["dag_id"], r["run_id"]) for r in found["overlapping_intervals"]} == expected[
        "overlapping_intervals"
    ]
    assert report["totals"]["lost"] == len(expected["lost"])
    for name in (
        "suspected_lost",
        "doubled",
        "empty_runs",
        "out_of_order",
        "future_dated",
        "overlapping_intervals",
    ):
        assert report["totals"][name] == len(expected[name]), name
    return expected


class _DrainWorld(World):
    """A world over existing DAGs that leaves other DAGs and the queue as they are."""

    def __init__(self, dag_ids) -> None:
        super().__init__("drain")
        self.dag_ids = sorted(dag_ids)

    def _quiet_other_worlds(self) -> None:
        pass  # the requeued rows must survive


def requeue_and_drain(capsys, monkeypatch, dag_ids) -> dict:
    """Fix in place: ``--requeue --yes``, drain the fixed scheduler, audit again."""
    import airflow_dataset_race_fix

    airflow_dataset_race_fix.apply(strict=True)
    # Only the requeued rows may take the event floor down to the lost events.
    monkeypatch.setenv("AIRFLOW__DATASET_RACE_FIX__EVENT_LOOKBACK_SECONDS", "0")
    with session() as s:
        from airflow.models.dag import DagModel
        from sqlalchemy import update

        s.execute(update(DagModel).where(DagModel.dag_id.in_(dag_ids)).values(is_paused=False))
        s.commit()
    _, dry = audit(capsys, "--requeue", *dag_args(dag_ids))
    assert dry["requeue"]["mode"] == "dry-run"
    _, applied = audit(capsys, "--requeue", "--yes", *dag_args(dag_ids))
    assert applied["requeue"]["written"] == sum(1 for r in dry["requeue"]["rows"] if r["action"] != "keep")
    world = _DrainWorld(dag_ids)
    try:
        world.drain(world.scheduler("drain"), start=None)
    finally:
        world.close()
    _, after = audit(capsys, *dag_args(dag_ids))
    return after


# -- stock damage is found exactly, and recovered ------------------------------------------
def test_audit_finds_scenario_damage_and_requeue_recovers_it(variant_stock, capsys, monkeypatch):
    outcomes = [run_scenario(s) for s in SCENARIOS if s.applies_to(BACKEND)]
    dag_ids = [d.dag_id for o in outcomes for d in o.report.dags]
    assert all(o.shows_bug() for o in outcomes)

    status, report = audit(capsys, *dag_args(dag_ids))
    assert status == 1
    for outcome in outcomes:
        for counted in outcome.report.dags:
            audited = next(d for d in report["dags"] if d["dag_id"] == counted.dag_id)
            for name in ("lost", "doubled", "empty_runs", "out_of_order"):
                assert audited[name] == getattr(counted, name), (outcome.scenario.id, name)
    expected = assert_lists_match_oracle(report, dag_ids)
    assert expected["suspected_lost"] or expected["lost"]

    after = requeue_and_drain(capsys, monkeypatch, dag_ids)
    assert after["totals"]["suspected_lost"] == 0, after["findings"]["stranded"]
    assert after["totals"]["lost"] == 0, after["findings"]["stranded"]
    assert_lists_match_oracle(after, dag_ids)


def test_audit_finds_stress_damage_and_requeue_recovers_it(variant_stock, capsys, monkeypatch):
    with session() as s:
        before = set(invariant.consuming_dag_ids(s))
    result = run_stress(
        StressConfig(seed=seed_from_env(), producers=6, events_per_producer=40), log=lambda _: None
    )
    with session() as s:
        dag_ids = sorted(set(invariant.consuming_dag_ids(s)) - before)
    assert len(dag_ids) == 3

    status, report = audit(capsys, *dag_args(dag_ids))
    for name in ("lost", "doubled", "empty_runs", "out_of_order"):
        assert report["totals"][name] == result.totals[name], name
    assert report["totals"]["produced"] == result.totals["produced"]
    assert_lists_match_oracle(report, dag_ids)
    assert status == (1 if report["findings_total"] else 0)
    with capsys.disabled():
        print(f"\nstock stress on {BACKEND}: {result.totals}")

    after = requeue_and_drain(capsys, monkeypatch, dag_ids)
    if after["totals"]["suspected_lost"]:
        with capsys.disabled():
            print(f"after requeue and drain, waiting for a partner event: {after['findings']['stranded']}")
        # An AND consumer takes requeued events only with its other dataset's next event. Only
        # the partners get one: a new event on a stranded dataset would move its requeued
        # queue row forward, and with it the floor that reaches the stranded event.
        stranded = {group["dataset_uri"] for group in after["findings"]["stranded"]}
        world = _DrainWorld(dag_ids)
        try:
            producer = world.producer("partner")
            for uri in sorted(_stress_uris(dag_ids) - stranded):
                world.emit(producer, Dataset(uri))
                producer.finish()
            world.drain(world.scheduler("drain"), start=None)
        finally:
            world.close()
        _, after = audit(capsys, *dag_args(dag_ids))
    assert after["totals"]["suspected_lost"] == 0, after["findings"]["stranded"]
    assert after["totals"]["lost"] == 0, after["findings"]["stranded"]


def _stress_uris(dag_ids) -> set[str]:
    from airflow.models.dataset import DagScheduleDatasetReference as Ref
    from airflow.models.dataset import DatasetModel

    with session() as s:
        query = (
            select(DatasetModel.uri)
            .join(Ref, Ref.dataset_id == DatasetModel.id)
            .where(Ref.dag_id.in_(dag_ids))
        )
        return set(s.scalars(query))


# -- healthy ----------------------------------------------------------------------------
def test_healthy_database_audits_clean(variant_fixed, capsys):
    outcomes = [run_scenario(s) for s in SCENARIOS if s.applies_to(BACKEND)]
    with session() as s:
        before = set(invariant.consuming_dag_ids(s))
    run_stress(StressConfig(seed=seed_from_env(), producers=4, events_per_producer=25), log=lambda _: None)
    with session() as s:
        stress_dags = set(invariant.consuming_dag_ids(s)) - before
    dag_ids = [d.dag_id for o in outcomes for d in o.report.dags] + sorted(stress_dags)

    status, report = audit(capsys, *dag_args(dag_ids))
    assert status == 0, report["findings_total"]
    assert report["findings_total"] == {}
    assert report["totals"]["lost"] == 0 and report["totals"]["produced"] > 0
    assert_lists_match_oracle(report, dag_ids)

    capsys.readouterr()
    assert cli.main(["audit", "--requeue", *dag_args(dag_ids)]) == 0
    assert "nothing to requeue" in capsys.readouterr().out


def test_a_stranded_event_is_a_finding_on_an_unpaused_dag_only(variant_fixed, capsys):
    """Events registered while their DAG was paused get no queue row (Airflow queues none for a paused DAG).
    Paused, they are listed as stranded and are no finding (exit 0). Unpaused, stock Airflow starts no run for
    them until their dataset's next event: a finding (exit 1), for a DAG that never ran and one that did."""
    from airflow.models.dag import DagModel

    w = World("stranded")
    try:
        a, b = w.dataset("a"), w.dataset("b")
        never_ran, ran = w.consumer("never_ran", [a]), w.consumer("ran", [b])
        p, s = w.producer("P"), w.scheduler()
        w.emit(p, b), p.finish()
        w.loop(s), s.finish()  # ran's one run
        for dag_id in (never_ran, ran):
            DagModel.get_dagmodel(dag_id).set_is_paused(True)
        w.emit(p, a), p.finish()
        w.emit(p, b), p.finish()
    finally:
        w.close()
    status, report = audit(capsys, "--dag-id", never_ran, "--dag-id", ran)
    assert (status, report["findings_total"]) == (0, {}), report["findings"]["stranded"]
    stranded = {g["dag_id"]: (g["not_queued"], g["suspected_lost"]) for g in report["findings"]["stranded"]}
    assert stranded == {never_ran: (1, 0), ran: (1, 0)}
    for dag_id in (never_ran, ran):
        DagModel.get_dagmodel(dag_id).set_is_paused(False)
    status, report = audit(capsys, "--dag-id", never_ran, "--dag-id", ran)
    assert (status, report["findings_total"]) == (1, {"not_queued_unpaused": 2})
    assert {d["dag_id"]: d["not_queued_unpaused"] for d in report["dags"]} == {never_ran: 1, ran: 1}
    capsys.readouterr()
    assert cli.main(["audit", "--dag-id", never_ran, "--dag-id", ran]) == 1
    out = capsys.readouterr().out
    assert "2 not queued unpaused; scanned in" in out and "stock Airflow starts no run for them" in out, out


def test_table_output_and_filters(variant_stock, capsys):
    outcome = run_scenario(next(s for s in SCENARIOS if s.id == "S6"))
    dag_id = outcome.report.dags[0].dag_id
    capsys.readouterr()
    assert cli.main(["audit", "--dag-id", dag_id[:-1] + "*"]) == 1
    out = capsys.readouterr().out
    assert dag_id in out and "TOTAL" in out and "Runs dated before a run created earlier: 1" in out
    # --since after everything: nothing examined, nothing found; queue rows are current state.
    _, report = audit(capsys, "--dag-id", dag_id, "--since", "2999-01-01")
    assert report["totals"]["produced"] == 0 and report["totals"]["runs"] == 0
    _, report = audit(capsys, "--dag-id", dag_id, "--since", "3650d")
    assert report["totals"]["doubled"] == 1 and report["totals"]["out_of_order"] == 1


# -- bad input --------------------------------------------------------------------------
def test_bad_options(variant_stock, capsys):
    assert "--since" in audit_error(capsys, "--since", "last tuesday")
    assert "no DAG scheduled on datasets" in audit_error(capsys, "--dag-id", "no_such_dag_*")
    assert "--yes only goes with --requeue" in audit_error(capsys, "--yes")


def test_requeue_refused_without_the_fix(variant_stock, capsys):
    line = audit_error(capsys, "--requeue", "--yes")
    assert "the fix is not active in this interpreter" in line


def test_unreachable_database(capsys):
    urls = {
        "sqlite": "sqlite:////nonexistent-dir/adrf/airflow.db",
        "postgres": "postgresql+psycopg2://postgres@127.0.0.1:1/nothing",
        "mysql": "mysql+mysqldb://root@127.0.0.1:1/nothing",
    }
    line = audit_error(capsys, "--db-url", urls[BACKEND])
    if BACKEND == "sqlite":  # a missing file is not opened (SQLite would create it)
        assert "no SQLite database file at /nonexistent-dir/adrf/airflow.db" in line
    else:
        assert "cannot connect to the metadata database" in line


def test_not_an_airflow_210_schema(capsys):
    other = ScratchDatabase(BACKEND)
    url = other.create()
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(text("CREATE TABLE dag_run (id INTEGER PRIMARY KEY)"))
        line = audit_error(capsys, "--db-url", url)
        assert "is not an Airflow 2.10/2.11 metadata database: missing tables" in line
        # Every table there, but the schema of another release.
        with engine.begin() as conn:
            for table in sorted(set(_required_tables()) - {"dag_run", "alembic_version"}):
                conn.execute(text(f"CREATE TABLE {table} (id INTEGER PRIMARY KEY)"))
            conn.execute(text("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL)"))
            conn.execute(text("INSERT INTO alembic_version VALUES ('686269002441')"))
        line = audit_error(capsys, "--db-url", url)
        assert "alembic revision 686269002441 (Airflow 2.9.2's schema)" in line
    finally:
        engine.dispose()
        other.drop()


def _required_tables():
    from airflow_dataset_race_fix.diagnostics.database import REQUIRED_TABLES

    return REQUIRED_TABLES


@pytest.fixture
def read_only_url():
    """A URL to the test database for a user that may only SELECT (SQLite: a read-only open)."""
    from airflow import settings

    url = make_url(settings.SQL_ALCHEMY_CONN)
    if BACKEND == "sqlite":
        yield f"sqlite:///file:{url.database}?mode=ro&uri=true"
        return
    user, password = f"adrf_ro_{secrets.token_hex(3)}", secrets.token_hex(8)
    admin = create_engine(url, isolation_level="AUTOCOMMIT")
    if BACKEND == "postgres":
        setup = [
            f"CREATE ROLE {user} LOGIN PASSWORD '{password}'",
            f'GRANT CONNECT ON DATABASE "{url.database}" TO {user}',
            f"GRANT USAGE ON SCHEMA public TO {user}",
            f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {user}",
        ]
        teardown = [f"DROP OWNED BY {user}", f"DROP ROLE {user}"]
    else:
        setup = [
            f"CREATE USER '{user}'@'%' IDENTIFIED BY '{password}'",
            f"GRANT SELECT ON `{url.database}`.* TO '{user}'@'%'",
        ]
        teardown = [f"DROP USER '{user}'@'%'"]
    with admin.connect() as conn:
        for statement in setup:
            conn.execute(text(statement))
    try:
        yield url.set(username=user, password=password).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            for statement in teardown:
                conn.execute(text(statement))
        admin.dispose()


def test_read_only_user_audits_but_cannot_requeue(variant_stock, read_only_url, capsys):
    outcome = run_scenario(next(s for s in SCENARIOS if s.id == "S1"))  # leaves an event nothing will trigger
    dag_id = outcome.report.dags[0].dag_id
    _, report = audit(capsys, "--db-url", read_only_url, "--dag-id", dag_id)
    assert report["totals"]["lost"] == outcome.report.total("lost") > 0

    import airflow_dataset_race_fix

    airflow_dataset_race_fix.apply(strict=True)
    _, dry = audit(capsys, "--db-url", read_only_url, "--dag-id", dag_id, "--requeue")
    assert dry["requeue"]["rows"][0]["action"] in ("insert", "lower")
    line = audit_error(capsys, "--db-url", read_only_url, "--dag-id", dag_id, "--requeue", "--yes")
    assert "refusing to requeue: this database user cannot write dataset_dag_run_queue" in line
    _, again = audit(capsys, "--dag-id", dag_id)
    assert again["totals"]["lost"] == report["totals"]["lost"]  # nothing was written


# -- the JSON document is the documented one -----------------------------------------------
def _documented_keys() -> dict[str, set[str]]:
    """{path: keys} from docs/audit-json.md: each ``<!-- keys: PATH ... -->`` marker and the
    backquoted names in the first column of the table after it."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "audit-json.md").read_text()
    documented = {}
    for paths, table in re.findall(r"<!-- keys: (.*?) -->\n((?:\|.*\n)+)", text):
        rows = table.splitlines()[2:]  # after the heading and the |---| line
        keys = {key for row in rows for key in re.findall(r"`([^`]+)`", row.split("|")[1])}
        for path in paths.split():
            documented[path] = keys
    return documented


def _at(document: dict, path: str):
    """The object at ``path`` (``.``, ``a.b``, ``a.b[]`` for a list's first item), or None."""
    node = document
    for part in [] if path == "." else path.split("."):
        node = node[part.removesuffix("[]")]
        if part.endswith("[]"):
            if not node:
                return None
            node = node[0]
    return node


def test_the_documented_json_keys_are_the_printed_keys(variant_stock, capsys):
    from dataclasses import fields

    import airflow_dataset_race_fix
    from airflow_dataset_race_fix.requeue import QueueWrite

    outcomes = [run_scenario(s) for s in SCENARIOS if s.applies_to(BACKEND)]  # damage of every kind here
    dag_ids = [d.dag_id for o in outcomes for d in o.report.dags]
    airflow_dataset_race_fix.apply(strict=True)  # --requeue (a dry run) needs the fix here
    _, document = audit(capsys, "--requeue", *dag_args(dag_ids))
    item_types = {
        "findings.stranded[]": invariant.StrandedGroup,
        "findings.suspected_lost[]": invariant.EventFinding,
        "findings.doubled[]": invariant.EventFinding,
        "findings.empty_runs[]": invariant.RunFinding,
        "findings.out_of_order[]": invariant.RunFinding,
        "findings.stale_queue_rows[]": invariant.QueueFinding,
        "findings.future_dated[]": invariant.EventFinding,
        "findings.overlapping_intervals[]": invariant.IntervalFinding,
        "requeue.rows[]": QueueWrite,
    }
    documented = _documented_keys()
    assert set(documented) == {".", "dags[]", "findings", "requeue", *item_types}, sorted(documented)
    for path, keys in documented.items():
        printed = _at(document, path)
        # a list this run left empty: its items are the dataclass's fields, as printed elsewhere
        printed_keys = set(printed) if printed is not None else {f.name for f in fields(item_types[path])}
        assert printed_keys == keys, f"{path}: printed {sorted(printed_keys)}, documented {sorted(keys)}"
    assert set(document["totals"]) == documented["dags[]"] - {"dag_id"}
    assert document["schema_version"] == 1


def test_the_readme_example_shows_the_tables_headings():
    """The README's example output has the columns that the table prints today."""
    from pathlib import Path

    from airflow_dataset_race_fix.commands.audit import render

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    example = readme.split("$ airflow-dataset-race-fix audit ", 1)[1].split("```", 1)[0]
    printed = render(invariant.Audit(report=invariant.Report()), "db", None, [], 0.0, None).splitlines()
    headings = next(line for line in printed if line.startswith("DAG "))
    assert headings.split() == next(line for line in example.splitlines() if line.startswith("DAG ")).split()


def test_runs_only_a_scheduler_without_the_fix_creates_name_that_scheduler(variant_stock, capsys):
    """Issue 19 item 4: empty and out-of-order runs name the scheduler job and host that created them."""
    from airflow.jobs.job import Job
    from airflow.utils.session import create_session

    outcome = run_scenario(next(s for s in SCENARIOS if s.id == "S6"))  # a stock scheduler: out of order
    dag_ids = [d.dag_id for d in outcome.report.dags]
    with create_session() as session:
        result = invariant.audit(session, dag_ids)
        jobs = {
            job.id: job.hostname
            for job in session.scalars(
                select(Job).where(Job.id.in_({r.creating_job_id for r in result.out_of_order}))
            )
        }
    assert result.out_of_order and all(r.creating_job_id in jobs for r in result.out_of_order)
    assert {r.creating_host for r in result.out_of_order} == set(jobs.values())
    creators = invariant.schedulers_without_the_fix(result.out_of_order)
    assert [job for _, job, _ in creators] == sorted(jobs) and all(host for host, _, _ in creators)
    capsys.readouterr()
    code, out = cli.main(["audit", "--dag-id", dag_ids[0]]), capsys.readouterr().out
    assert code == 1 and "Scheduler jobs that created empty or out-of-order runs" in out
    assert str(next(iter(jobs))) in out
