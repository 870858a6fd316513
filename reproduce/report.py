"""Tables and the verdict (exit code) of ``reproduce``, from the children's JSON results."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from reproduce.harness import catalog

COUNTS = ("lost", "doubled", "empty_runs", "out_of_order", "lingering")
COUNT_HEADERS = ("lost", "dbl", "empty", "ooo", "linger")


@dataclass
class Verdict:
    ok: bool
    summary: str


def table(headers: list[str], rows: list[list[Any]], groups: list[tuple[str, int]] | None = None) -> str:
    """A plain text table; ``groups`` (title, number of columns) adds a header row above."""
    cells = [[str(c) for c in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = [
        "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
        for row in cells
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    if groups:
        parts, column = [], 0
        for title, span in groups:
            width = sum(widths[column : column + span]) + 2 * (span - 1)
            parts.append(title.center(width, "-" if title else " ") if title else " " * width)
            column += span
        lines.insert(0, "  ".join(parts).rstrip())
    return "\n".join(line.rstrip() for line in lines)


def _counts(totals: dict[str, int] | None) -> list[Any]:
    return [totals.get(name, 0) for name in COUNTS] if totals else ["-"] * len(COUNTS)


def _by_variant(runs: list[dict[str, Any]], variant: str) -> list[dict[str, Any]]:
    return [r for r in runs if r["variant"] == variant]


# -- deterministic ----------------------------------------------------------------------
def _scenario_ok(variant: str, entry: dict[str, Any]) -> bool:
    if "error" in entry:
        return False
    return entry["shows_bug"] if variant == "stock" else not entry["violations"]


def render_deterministic(runs: list[dict[str, Any]], backend: str) -> str:
    stock, fixed = _by_variant(runs, "stock")[0], _by_variant(runs, "fixed")[0]
    fixed_by_id = {e["id"]: e for e in fixed.get("scenarios", [])}
    # stock passes when it shows the bug, the fix when it shows none
    headers = ["scenario", "stock must show", *COUNT_HEADERS, "bug shown", *COUNT_HEADERS, "clean"]
    groups = [("", 2), (" stock ", len(COUNTS) + 1), (" fixed ", len(COUNTS) + 1)]
    rows, notes, skipped = [], [], []
    for entry in stock.get("scenarios", []):
        row = [f"{entry['id']:<4}{entry['title']}", "+".join(entry["expect_stock"])]
        if "skipped" in entry:
            skipped.append(entry["id"])
            continue
        for variant, e in (("stock", entry), ("fixed", fixed_by_id.get(entry["id"], {"error": "missing"}))):
            if "error" in e:
                notes.append(f"{entry['id']} {variant}: {e['error']}")
            row += _counts(e.get("totals")) + ["yes" if _scenario_ok(variant, e) else "NO"]
        rows.append(row)
    text = table(headers, rows, groups)
    legend = "counts: lost, doubled (consumed twice), empty runs, out-of-order runs, lingering queue rows"
    about = (
        "forced interleavings: each race driven step by step at named SQL statements, with real "
        "transactions and row locks, not a running scheduler; a real scheduler and executor: --e2e"
    )
    if skipped:
        where = ", ".join(f"{i} (--backend {' or '.join(_BACKENDS[i])})" for i in skipped)
        notes.insert(
            0,
            f"not run on {backend}: {where}"
            + ("; SQLite has one writer at a time, and these races need two" if backend == "sqlite" else ""),
        )
    return "\n".join([text, f"  {legend}", f"  {about}", *(f"  {n}" for n in notes)])


_BACKENDS = {info.id: info.backends for info in catalog.CATALOG}


def verdict_deterministic(runs: list[dict[str, Any]]) -> Verdict:
    stock, fixed = _by_variant(runs, "stock")[0], _by_variant(runs, "fixed")[0]
    for run in (stock, fixed):
        if run.get("error"):
            return Verdict(False, f"FAILED: {run['variant']} child: {run['error']}")
    fixed_by_id = {e["id"]: e for e in fixed["scenarios"]}
    ran = [e for e in stock["scenarios"] if "skipped" not in e]
    missing = [e["id"] for e in ran if not _scenario_ok("stock", e)]
    broken = [e["id"] for e in ran if not _scenario_ok("fixed", fixed_by_id[e["id"]])]
    if not ran:
        return Verdict(False, "FAILED: no scenario applies")
    if missing or broken:
        parts = []
        if missing:
            parts.append(f"stock did not show the bug in {', '.join(missing)}")
        if broken:
            parts.append(f"the fix did not hold in {', '.join(broken)}")
        return Verdict(False, "FAILED: " + "; ".join(parts))
    return Verdict(True, f"OK: stock shows the bug in all {len(ran)} scenarios, the fix in none")


# -- stress and e2e ---------------------------------------------------------------------
def _violations(run: dict[str, Any]) -> dict[str, int]:
    if "stress" in run:
        return run["problems"]
    if "e2e" in run:
        return run["e2e"]["problems"]
    return {"error": 1}


def _shows_bug(run: dict[str, Any]) -> bool:
    """Stock lost, doubled... events, or its producers failed, in a run that completed."""
    problems = _violations(run)
    if "not_drained" in problems or "error" in problems:
        return False
    return bool(problems)


def render_stress(runs: list[dict[str, Any]]) -> str:
    headers = [
        "variant",
        "run",
        "seed",
        "committed",
        "found",
        "prod.fail",
        "loops",
        *COUNT_HEADERS,
        "seconds",
    ]
    rows, notes = [], []
    for r in runs:
        if r.get("error"):
            rows.append([r["variant"], r["run"], "-", f"error: {r['error']}"])
            continue
        s = r["stress"]
        notes += [f"{r['variant']} run {r['run']}: {sample}" for sample in s["failure_samples"][:2]]
        rows.append(
            [
                r["variant"],
                r["run"],
                s["config"]["seed"],
                s["produced"],
                s["events_in_db"],
                s["producer_failures"],
                s["scheduler_loops"],
                *_counts(s["totals"]),
                s["seconds"],
            ]
        )
    return "\n".join([table(headers, _pad(rows, len(headers))), *(f"  {n}" for n in notes)])


def render_e2e(runs: list[dict[str, Any]]) -> str:
    headers = [
        "variant",
        "run",
        "seed",
        "events",
        "expected",
        "prod.failed",
        "(other)",
        "retried",
        "fix active",
        "consumer runs",
        *COUNT_HEADERS,
        "drained",
        "seconds",
    ]
    rows, notes = [], []
    for r in runs:
        if r.get("error"):
            rows.append([r["variant"], r["run"], "-", f"error: {r['error']}"])
            continue
        e = r["e2e"]
        rows.append(
            [
                r["variant"],
                r["run"],
                e["seed"],
                e["events"],
                e["expected_events"],
                e["producer_tis_failed"] - _other_failures(e),
                _other_failures(e),
                e.get("producer_tis_retried", 0),
                e["fix_active"],
                e["consumer_runs"],
                *_counts(e["totals"]),
                "yes" if e["drained"] else "NO",
                e["seconds"],
            ]
        )
        label = f"{r['variant']} run {r['run']}"
        for fault in e.get("faults", []):
            notes.append(
                f"{label}: fault at {fault['utc']} UTC (+{fault['at_seconds']} s): {fault['fault']}: "
                f"{fault['detail']}"
            )
        for entry in e.get("producer_tis_failed_list", [])[:LISTED]:
            notes.append(f"{label}: failed producer {entry}")
        retried = e.get("producer_tis_retried_list", [])
        if retried:
            causes = ", ".join(f"{cause} x{n}" for cause, n in (e.get("retry_causes") or {}).items())
            notes.append(
                f"{label}: {len(retried)} producer task(s) retried"
                + (f"; earlier tries: {causes}" if causes else "")
            )
            notes += [f"{label}: retried producer {entry}" for entry in retried[:LISTED]]
            if len(retried) > LISTED:
                notes.append(f"{label}: ... {len(retried) - LISTED} more retried (--json for all)")
        for note in e.get("notes", []):
            notes.append(f"{label}: {note}")
    legend = (
        "prod.failed: producer tasks that failed in the dataset code or for no known reason; "
        "(other): failed in Airflow's own statements (dag_run, rendered fields); retried: producer task "
        "instances with try_number > 1"
    )
    return "\n".join(
        [table(headers, _pad(rows, len(headers))), f"  {legend}", *(f"  note: {n}" for n in notes)]
    )


LISTED = 5  # failed / retried producer task instances listed per run


def _other_failures(e2e: dict[str, Any]) -> int:
    """Producer tasks that failed outside the dataset code (Airflow's own deadlocks)."""
    failed_tries = (e2e.get("producer_failures_by_cause") or {}).get("outside the dataset code", 0)
    return min(failed_tries, e2e["producer_tis_failed"])  # failed tries that a retry made good are no failure


def _pad(rows: list[list[Any]], width: int) -> list[list[Any]]:
    return [row + [""] * (width - len(row)) for row in rows]


def verdict_random(mode: str, runs: list[dict[str, Any]]) -> Verdict:
    """The fix must show nothing in any run; stock must show a violation in at least one."""
    errors = [f"{r['variant']} run {r['run']}: {r['error']}" for r in runs if r.get("error")]
    if errors:
        return Verdict(False, "FAILED: " + "; ".join(errors))
    fixed_bad = [(r["run"], _violations(r)) for r in _by_variant(runs, "fixed") if _violations(r)]
    stock_bad = [r["run"] for r in _by_variant(runs, "stock") if _shows_bug(r)]
    n = len(_by_variant(runs, "stock"))
    stock_text = f"stock showed violations in {len(stock_bad)} of {n} run(s)"
    if fixed_bad:
        detail = "; ".join(f"run {i}: {v}" for i, v in fixed_bad)
        return Verdict(False, f"FAILED: the fix showed problems ({detail}); {stock_text}")
    if not stock_bad:
        return Verdict(
            False, f"INCONCLUSIVE: the fix showed none, but {stock_text}; try --repeat or more load"
        )
    return Verdict(True, f"OK: {stock_text}, the fix in none of {len(_by_variant(runs, 'fixed'))}")


def render(mode: str, backend: str, runs: list[dict[str, Any]]) -> str:
    title = {
        "deterministic": "deterministic scenarios",
        "stress": "stress",
        "e2e": "end to end (real scheduler)",
    }[mode]
    if mode == "deterministic":
        body = render_deterministic(runs, backend)
    else:
        body = {"stress": render_stress, "e2e": render_e2e}[mode](runs)
    return f"\n{title} on {backend}\n\n{body}\n"


def verdict(mode: str, runs: list[dict[str, Any]]) -> Verdict:
    return verdict_deterministic(runs) if mode == "deterministic" else verdict_random(mode, runs)
