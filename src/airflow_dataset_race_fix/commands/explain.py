"""
``airflow-dataset-race-fix explain DAG_ID``: why a dataset-triggered DAG runs next, or waits.

The verdict is the fixed scheduler's own code run read-only, whether or not the fix is
active here (``diagnostics.explain``; docs/explain.md). The database is read as ``audit``
reads it, never written. Exit status: 0 nothing to report, 1 ``audit`` has findings for
this DAG, 2 bad input.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time

from airflow_dataset_race_fix.cli import UsageError, print_result
from airflow_dataset_race_fix.diagnostics import database, fix_active_here


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "explain",
        help="why a dataset-triggered DAG runs in the next scheduler loop, or waits (read-only)",
        description=(
            "Explain one dataset-triggered DAG: its condition, queue rows and pending events, the "
            "fixed scheduler's verdict for its next loop, its last runs and their events, and what "
            "audit finds for it. Read-only. Exit status: 0 nothing to report, 1 audit findings, 2 bad input."
        ),
    )
    parser.add_argument("dag_id", metavar="DAG_ID")
    parser.add_argument(
        "--db-url", metavar="URL", help="SQLAlchemy URL (default: Airflow's sql_alchemy_conn)"
    )
    parser.add_argument(
        "--runs", type=int, default=10, metavar="N", help="last runs to show (default %(default)s)"
    )
    parser.add_argument("--json", action="store_true", help="print the explanation as JSON (docs/explain.md)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.runs < 0:
        raise UsageError("--runs must be 0 or more")
    with contextlib.redirect_stdout(sys.stderr):  # Airflow may log to stdout; stdout is the result's
        found, seconds = _explain(args)
    found["fix"] = {"active_in_this_process": found.pop("_fix_active"), "seconds": round(seconds, 3)}
    print_result(json.dumps(found, indent=2) if args.json else render(found))
    return 1 if found["audit"]["findings"] else 0


def _explain(args: argparse.Namespace):
    with database.reading(args.db_url) as (session, _, _):
        from airflow_dataset_race_fix.diagnostics.explain import ExplainError, explain

        was_active = fix_active_here()
        started = time.monotonic()
        try:
            found = explain(session, args.dag_id, runs=args.runs)
        except ExplainError as err:
            raise UsageError(str(err)) from None
    found["_fix_active"] = was_active
    return found, time.monotonic() - started


def render(found: dict) -> str:
    """The explanation as text for a terminal."""
    verdict = found["verdict"]
    lines = [f"DAG {found['dag_id']}  (database clock {found['database_now']})"]
    if found["fix"]["active_in_this_process"]:
        lines.append(
            "  the fix is active in this process: the verdict is the fixed scheduler's "
            "(its code, run here read-only)"
        )
    else:
        lines.append(
            "  the fix is not active in this process: the verdict is the fixed scheduler's (its code, run "
            "here read-only); a stock scheduler decides otherwise"
        )
    dag = found["dag"]
    lines.append(
        f"  paused: {'yes' if dag['is_paused'] else 'no'}; runs queued or running: {dag['active_runs']} "
        f"of max_active_runs {dag['max_active_runs']}"
    )
    lines += ["", "Condition:"]
    lines += _tree_lines(found["condition"], {d["uri"]: d for d in found["datasets"]}, "  ")
    lines += ["", "Verdict for the next scheduler loop:", f"  read: {verdict['read']}"]
    if verdict["creates_run"]:
        run = verdict["run"]
        when = {
            "next loop": "the next loop",
            "next sweep": "the scheduler's next sweep (its events have no queue row)",
            "net": "the loop after the net finds it (a late commit below its latest run)",
        }[verdict["when"]]
        lines.append(
            f"  RUNS at {when}: logical date {run['logical_date']}, {len(run['event_ids'])} event(s)"
        )
    else:
        lines.append("  WAITS")
    for reason in verdict["reasons"]:
        lines.append(f"  - {reason['code']}: {reason['message']}")
    for note in verdict["notes"]:
        lines.append(f"  ! {note['message']}")
    if found["pending_events"]:
        lines.append("  pending events (its next run takes them):")
        lines += [f"    {_event_line(e)}" for e in found["pending_events"][:20]]
        if len(found["pending_events"]) > 20:
            lines.append(f"    ... and {len(found['pending_events']) - 20} more (--json lists all)")
    lines += ["", f"Last {len(found['runs'])} dataset-triggered run(s), newest first:"]
    for run in found["runs"]:
        flags = [f for f, on in (("EMPTY", run["empty"]), ("OUT OF ORDER", run["out_of_order"])) if on]
        interval = f"{run['data_interval'][0]} .. {run['data_interval'][1]}"
        lines.append(
            f"  {run['run_id']}  {run['state']}  interval {interval}"
            + (f"  [{', '.join(flags)}]" if flags else "")
        )
        for e in run["events"][:10]:
            marks = [m for m, on in (("late", e["late"]), ("DOUBLED", e["doubled"])) if on]
            lines.append(f"    {_event_line(e)}" + (f"  [{', '.join(marks)}]" if marks else ""))
        if len(run["events"]) > 10:
            lines.append(f"    ... and {len(run['events']) - 10} more")
    findings = found["audit"]["findings"]
    span = f" (from {found['audit']['since']}; 'audit --dag-id' reads all)" if found["audit"]["since"] else ""
    rows = found["audit"]["rows"]
    counted = [
        f"{k} {v} ({', '.join(map(str, rows[k][:10]))}{', ...' if len(rows[k]) > 10 else ''})"
        for k, v in findings.items()
    ]
    lines += ["", f"Audit{span}: " + ("; ".join(counted) or "nothing to report")]
    return "\n".join(lines)


def _tree_lines(node: dict, datasets: dict, indent: str) -> list[str]:
    mark = "[x]" if node["met"] else "[ ]"
    if node["type"] == "dataset":
        info = datasets.get(node["uri"], {})
        queued = info.get("queue_row_created_at")
        parts = [f"queue row {queued}" if queued else "no queue row"]
        parts.append(f"{len(info.get('pending_event_ids', []))} pending")
        if info.get("deferred_event_ids"):
            parts.append(f"{len(info['deferred_event_ids'])} dated ahead")
        if info.get("newest_event"):
            parts.append(f"newest event #{info['newest_event']['id']} at {info['newest_event']['timestamp']}")
        return [f"{indent}{mark} {node['uri']}  ({'; '.join(parts)})"]
    label = {"all": "ALL of", "any": "ANY of", "alias": f"alias {node.get('name')}, ANY of"}[node["type"]]
    lines = [f"{indent}{mark} {label}"]
    for child in node["children"]:
        lines += _tree_lines(child, datasets, indent + "    ")
    return lines


def _event_line(e: dict) -> str:
    source = "/".join(
        str(part) for part in (e["source_dag_id"], e["source_run_id"], e["source_task_id"]) if part
    )
    return f"#{e['id']} {e['dataset_uri']} at {e['timestamp']}" + (f" from {source}" if source else "")
