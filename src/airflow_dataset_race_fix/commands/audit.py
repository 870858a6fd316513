"""
``audit``: the damage the race already did, from the metadata database; ``--requeue`` recovers
(docs/audit.md, docs/audit-json.md). Read in one snapshot, so that counts and lists agree.
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import json
import re
import sys
import time
from dataclasses import asdict
from datetime import datetime, timedelta, timezone

from airflow_dataset_race_fix.cli import UsageError, print_result
from airflow_dataset_race_fix.diagnostics import database

TABLE_LIMIT = 20  # rows per section in the table unless --limit
# --json's document, docs/audit-json.md: keys are only added within a version, never changed.
JSON_SCHEMA_VERSION = 1


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "audit",
        help="find lost, doubled, empty and out-of-order dataset-triggered runs; "
        "--requeue recovers lost events",
        description="Audit dataset-triggered scheduling in an Airflow 2.10/2.11 metadata database. "
        "Read-only unless --requeue --yes. Exit status: 0 clean, 1 findings, 2 bad input.",
    )
    add = parser.add_argument
    add("--db-url", metavar="URL", help="SQLAlchemy URL (default: Airflow's sql_alchemy_conn)")
    add(
        "--dag-id",
        action="append",
        metavar="DAG_ID",
        help="only this consuming DAG (repeatable; shell wildcards * ? [] allowed)",
    )
    add(
        "--since",
        metavar="WHEN",
        help="only events and runs from WHEN: an ISO date/time (UTC unless it says "
        "otherwise) or a duration back from now such as 90m, 12h, 7d",
    )
    add("--json", action="store_true", help="print the report as JSON")
    add(
        "--limit",
        type=int,
        metavar="N",
        help=f"list at most N items per section (default {TABLE_LIMIT}; all with --json)",
    )
    add(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress on stderr while scanning (default: when stderr is a terminal)",
    )
    add(
        "--requeue",
        action="store_true",
        help="give each DAG with stranded events a queue row that makes the fixed "
        "scheduler consume them (dry run unless --yes; refused unless the fix is active here)",
    )
    add("--yes", action="store_true", help="with --requeue: write the queue rows")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    since = parse_since(args.since)
    if args.yes and not args.requeue:
        raise UsageError("--yes only goes with --requeue")
    if args.limit is not None and args.limit < 0:
        raise UsageError("--limit must be 0 or more")
    limit = args.limit if args.limit is not None else (None if args.json else TABLE_LIMIT)
    # Airflow logs to stdout (e.g. while deserializing DAGs); keep stdout for the report alone.
    with contextlib.redirect_stdout(sys.stderr):
        result, where, dag_ids, seconds, writes, written = _audit_and_requeue(args, since, limit)
    if args.json:
        data = _as_json(result, where, since, dag_ids, seconds, args, writes, written)
        print_result(json.dumps(data, default=datetime.isoformat, indent=2))  # the only values not JSON's own
    else:
        text = render(result, where, since, dag_ids, seconds, limit)
        print_result(text + "\n\n" + render_requeue(writes, written) if args.requeue else text)
    return 1 if result.report.findings() else 0


def _audit_and_requeue(args: argparse.Namespace, since: datetime | None, limit: int | None):
    with database.reading(args.db_url, read_only=not args.yes) as (session, engine, where):
        from airflow_dataset_race_fix import requeue
        from airflow_dataset_race_fix.diagnostics import invariant

        if args.requeue:
            try:
                requeue.ensure_fix_active()
            except requeue.RequeueRefused as err:
                raise UsageError(str(err)) from None
        started = time.monotonic()
        dag_ids = select_dags(invariant.consuming_dag_ids(session), args.dag_id)
        progress = _progress(args.progress)
        result = invariant.audit(session, dag_ids, since=since, limit=limit, progress=progress)
    seconds = time.monotonic() - started

    writes, written = [], None
    if args.requeue:
        writes = requeue.plan(result.stranded)
        if args.yes:
            try:
                written = requeue.apply(engine, writes)
            except requeue.RequeueRefused as err:
                raise UsageError(str(err)) from None
    return result, where, dag_ids, seconds, writes, written


# -- input ------------------------------------------------------------------------------
_DURATION = re.compile(r"^(\d+)\s*([smhdw])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def parse_since(value: str | None) -> datetime | None:
    if value is None:
        return None
    try:
        match = _DURATION.match(value.strip().lower())
        if match:
            return datetime.now(timezone.utc) - timedelta(**{_UNITS[match[2]]: int(match[1])})
        try:
            when = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError:
            raise UsageError(
                f"--since {value!r}: expected an ISO date or date/time (2025-06-01, 2025-06-01T12:00+02:00) "
                "or a duration such as 90m, 12h, 7d"
            ) from None
        return when.replace(tzinfo=timezone.utc) if when.tzinfo is None else when.astimezone(timezone.utc)
    except OverflowError:
        raise UsageError(f"--since {value!r}: out of range (years 1 to 9999, UTC)") from None


def select_dags(consuming: list[str], patterns: list[str] | None) -> list[str]:
    if not patterns:
        return consuming
    chosen = set()
    for pattern in patterns:
        matched = fnmatch.filter(consuming, pattern)
        if not matched:
            raise UsageError(f"--dag-id {pattern!r}: no DAG scheduled on datasets matches it")
        chosen.update(matched)
    return sorted(chosen)


def _progress(enabled: bool | None):
    if enabled is None:
        enabled = sys.stderr.isatty()
    if not enabled:
        return None
    started = time.monotonic()
    tty = sys.stderr.isatty()

    def show(done: int, total: int) -> None:
        line = f"audit: {done}/{total} DAGs scanned, {time.monotonic() - started:.1f}s"
        end = "\n" if not tty or done == total else ""
        print(("\r" if tty else "") + line, end=end, file=sys.stderr, flush=True)

    return show


# -- output -----------------------------------------------------------------------------
def _ts(value: datetime | None) -> str:
    return "" if value is None else value.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def render(result, where: str, since, dag_ids: list[str], seconds: float, limit: int | None) -> str:
    from tabulate import tabulate

    report = result.report
    scope = f"{len(dag_ids)} consuming DAG(s)" + (
        f", events and runs since {_ts(since)} UTC" if since else ""
    )
    lines = [f"Audit of {where}: {scope}", ""]
    columns = (
        "runs",
        "produced",
        "consumed",
        "suspected_lost",
        "doubled",
        "empty_runs",
        "out_of_order",
        "stale_queue_rows",
        "lost",
        "future_dated",
        "overlapping_intervals",
    )
    headers = [
        "DAG",
        "runs",
        "events",
        "consumed",
        "suspected lost",
        "doubled",
        "empty runs",
        "out of order",
        "stale queue rows",
        "not queued",
        "future-dated events",
        "overlapping intervals",
    ]
    rows = [[d.dag_id, *(getattr(d, c) for c in columns)] for d in report.dags]
    rows.append(["TOTAL", *(report.total(c) for c in columns)])
    lines.append(tabulate(rows, headers=headers, tablefmt="simple", disable_numparse=True))

    def events(items) -> list[list]:  # each event's columns, and the runs that consumed it
        return [[e.dag_id, e.event_id, e.dataset_uri, _ts(e.timestamp), ", ".join(e.run_ids)] for e in items]

    sections = [  # (title, headers, rows, total)
        (
            "Stranded events per DAG and dataset (no run consumed them: a later run exists, "
            "or nothing is queued)",
            ["DAG", "dataset", "events", "suspected lost", "not queued", "oldest", "newest", "queue row"],
            [
                [
                    g.dag_id,
                    g.dataset_uri,
                    g.events,
                    g.suspected_lost,
                    g.not_queued,
                    _ts(g.oldest),
                    _ts(g.newest),
                    _ts(g.queued_at) or "none",
                ]
                for g in result.stranded
            ],
            len(result.stranded),
        ),
        (
            "Suspected lost events",
            ["DAG", "event", "dataset", "timestamp"],
            [row[:4] for row in events(result.suspected_lost)],
            report.total("suspected_lost"),
        ),  # no runs column
        (
            "Events consumed by more than one run of the same DAG",
            ["DAG", "event", "dataset", "timestamp", "runs"],
            events(result.doubled),
            report.total("doubled"),
        ),
        (
            "Dataset-triggered runs that consumed no event",
            ["DAG", "run", "logical date"],
            [[r.dag_id, r.run_id, _ts(r.logical_date)] for r in result.empty_runs],
            report.total("empty_runs"),
        ),
        (
            "Runs dated before a run created earlier",
            ["DAG", "run", "logical date", "earlier run dated"],
            [[r.dag_id, r.run_id, _ts(r.logical_date), _ts(r.earlier_run_date)] for r in result.out_of_order],
            report.total("out_of_order"),
        ),
        (
            "Events dated after the audit's clock",
            ["DAG", "event", "dataset", "timestamp", "runs"],
            events(result.future_dated),
            report.total("future_dated"),
        ),
        (
            "Runs whose data interval starts before the run just before them (by logical date) ended",
            ["DAG", "run", "logical date", "interval start", "previous run's end"],
            [
                [
                    r.dag_id,
                    r.run_id,
                    _ts(r.logical_date),
                    _ts(r.data_interval_start),
                    _ts(r.previous_interval_end),
                ]
                for r in result.overlapping_intervals
            ],
            report.total("overlapping_intervals"),
        ),
        (
            "Queue rows older than the DAG's latest dataset-triggered run",
            ["DAG", "dataset", "created at", "latest run"],
            [
                [q.dag_id, q.dataset_uri, _ts(q.created_at), _ts(q.latest_run_date)]
                for q in result.stale_queue_rows
            ],
            report.total("stale_queue_rows"),
        ),
    ]
    for title, headers, rows, total in sections:
        if not total:
            continue
        shown = rows if limit is None else rows[:limit]
        more = f" (first {len(shown)} of {total}; --limit N or --json for more)" if len(shown) < total else ""
        table = tabulate(shown, headers=headers, tablefmt="simple", disable_numparse=True)
        lines += ["", f"{title}: {total}{more}", table]

    from airflow_dataset_race_fix.diagnostics.invariant import schedulers_without_the_fix

    creators = schedulers_without_the_fix(result.empty_runs + result.out_of_order)
    if creators:
        lines += [
            "",
            "Scheduler jobs that created empty or out-of-order runs (the fixed scheduler creates neither: "
            "these ran without the fix then; check 'airflow-dataset-race-fix status' where they run):",
            tabulate(
                creators, headers=["host", "scheduler job", "runs"], tablefmt="simple", disable_numparse=True
            ),
        ]
    findings = report.findings()
    summary = ", ".join(f"{n} {name.replace('_', ' ')}" for name, n in findings.items()) or "no findings"
    lines += ["", f"{summary}; scanned in {seconds:.1f}s."]
    if report.total("not_queued_unpaused"):
        lines.append(
            "Not queued unpaused: stranded events of an unpaused DAG, newer than its latest run, "
            "that no queue row names: stock Airflow starts no run for them until their dataset's "
            "next event (the fix's sweep takes those within its reach: 'explain DAG_ID' tells). "
            "'audit --requeue' (dry run) shows how to give them back."
        )
    if report.total("suspected_lost"):
        lines.append(
            "Suspected: Airflow records no pauses, schedule changes or deleted runs, so an event may show "
            "here that its DAG was not meant to see. 'audit --requeue' (dry run) shows how to recover them."
        )
    return "\n".join(lines)


def render_requeue(writes, written: int | None) -> str:
    from tabulate import tabulate

    from airflow_dataset_race_fix.requeue import KEEP

    if not writes:
        return "Requeue: nothing to requeue."
    rows = [
        [w.dag_id, w.dataset_uri, w.events, _ts(w.current) or "none", w.action, _ts(w.created_at)]
        for w in writes
    ]
    table = tabulate(
        rows,
        headers=["DAG", "dataset", "events", "queue row now", "action", "created_at"],
        tablefmt="simple",
        disable_numparse=True,
    )
    changes = sum(1 for w in writes if w.action != KEEP)
    if written is None:
        tail = (
            f"Dry run: {changes} queue row(s) would be written. Run again with --requeue --yes to write them."
        )
    else:
        tail = (
            f"Requeued: {written} queue row(s) written in one transaction. The fixed scheduler "
            "consumes the events in its next loops (an AND condition waits for its other "
            "datasets); audit again to confirm."
        )
    return "\n".join(["Requeue plan (queue rows only; no event or run is changed):", table, tail])


def _as_json(result, where, since, dag_ids, seconds, args, writes, written) -> dict:
    data = {
        "schema_version": JSON_SCHEMA_VERSION,
        "database": where,
        "since": since,
        "dag_ids": dag_ids,
        "seconds": round(seconds, 3),
        "findings_total": result.report.findings(),
        **result.as_dict(),
    }
    if args.requeue:
        mode = "applied" if written is not None else "dry-run"
        data["requeue"] = {"mode": mode, "written": written, "rows": [asdict(w) for w in writes]}
    return data
