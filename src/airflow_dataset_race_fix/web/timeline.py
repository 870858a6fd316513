"""
The DAG page's timeline: an SVG drawn on the server from an ``explain`` document.

A time axis; one lane per dataset with its events as marks; below, the runs as spans, each
with a line to every event it consumed. Events no run consumed yet (pending, deferred) and
events audit flags (late, doubled) are in the warning colour. Readable at any size: past
``MAX_MARKS`` events a lane shows counts per time bin instead of marks, and past
``MAX_LINES`` run-to-event lines only the spans are drawn. Every text is escaped.
"""

from __future__ import annotations

from datetime import datetime, timezone

from markupsafe import Markup, escape

MAX_MARKS = 400
MAX_LINES = 1000
WIDTH, LEFT, LANE, TOP = 960, 220, 34, 28
OK, WARN, RUN, MUTED = "#4a6fa5", "#d9822b", "#5b8c5a", "#999999"


def _time(value: str | None) -> float | None:
    return datetime.fromisoformat(value).timestamp() if value else None


def render(found: dict) -> Markup:
    """The SVG of ``found`` (an ``explain`` document), safe to put in a page as it is."""
    uris = [d["uri"] for d in found["datasets"]]
    events: dict[int, dict] = {}
    for run in found["runs"]:
        for event in run["events"]:
            events[event["id"]] = {**event, "warn": event["late"] or event["doubled"]}
    for event in found["pending_events"] + found["deferred_events"]:
        events[event["id"]] = {**event, "warn": True}
    times = [t for e in events.values() if (t := _time(e["timestamp"])) is not None]
    for run in found["runs"]:
        times += [
            t for t in (_time(run["data_interval"][0]), _time(run["data_interval"][1])) if t is not None
        ]
    now = _time(found["database_now"])
    if not times:
        times = [now]
    # The span of the events and runs; "now" joins it only when it is near (else an arrow)
    start, end = min(times), max(times)
    if now - end <= 0.25 * max(end - start, 1.0):
        end = max(end, now)
    span = max(end - start, 1.0)
    start, end = start - 0.02 * span, end + 0.02 * span
    span = end - start
    lanes = {uri: i for i, uri in enumerate(uris)}
    runs_y = TOP + LANE * len(uris) + 10
    height = runs_y + LANE + 24

    def x(t: float) -> float:
        return LEFT + (WIDTH - LEFT - 10) * (t - start) / span

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" role="img" '
        f'aria-label="timeline of {escape(found["dag_id"])}" font-family="sans-serif" font-size="11">',
        f'<text x="{LEFT}" y="14" fill="{MUTED}">{escape(_label(start))}</text>',
        f'<text x="{WIDTH - 10}" y="14" fill="{MUTED}" text-anchor="end">{escape(_label(end))}</text>',
    ]
    for uri, lane in lanes.items():
        y = TOP + LANE * lane + LANE / 2
        parts.append(f'<text x="4" y="{y + 4:.0f}">{escape(_short(uri))}</text>')
        parts.append(f'<line x1="{LEFT}" y1="{y:.0f}" x2="{WIDTH - 10}" y2="{y:.0f}" stroke="#ddd"/>')
    by_lane: dict[str, list[dict]] = {uri: [] for uri in uris}
    for event in events.values():
        by_lane.setdefault(event["dataset_uri"], []).append(event)
    for uri, lane_events in by_lane.items():
        if uri not in lanes:
            continue
        y = TOP + LANE * lanes[uri] + LANE / 2
        if len(lane_events) <= MAX_MARKS:
            for e in lane_events:
                colour = WARN if e["warn"] else OK
                event_x = x(_time(e["timestamp"]))
                parts.append(
                    f'<rect class="event" x="{event_x - 1.5:.1f}" y="{y - 8:.0f}" width="3" height="16" '
                    f'fill="{colour}"><title>#{e["id"]} {escape(e["timestamp"])}</title></rect>'
                )
        else:  # counts per bin: one bar per 4 pixels, the warning share on top
            bins: dict[int, list[int]] = {}
            for e in lane_events:
                b = int((x(_time(e["timestamp"])) - LEFT) // 4)
                counts = bins.setdefault(b, [0, 0])
                counts[1 if e["warn"] else 0] += 1
            top = max(sum(c) for c in bins.values())
            for b, (plain, warn) in sorted(bins.items()):
                h = 16 * (plain + warn) / top
                bar_x = LEFT + 4 * b
                bar_y = y + 8 - h
                parts.append(
                    f'<rect class="bin" x="{bar_x}" y="{bar_y:.1f}" width="3" height="{h:.1f}" fill="{OK}">'
                    f"<title>{plain + warn} events</title></rect>"
                )
                if warn:
                    warn_h = 16 * warn / top
                    parts.append(
                        f'<rect x="{bar_x}" y="{bar_y:.1f}" width="3" height="{warn_h:.1f}" fill="{WARN}"/>'
                    )
    parts.append(f'<text x="4" y="{runs_y + LANE / 2 + 4:.0f}">runs</text>')
    lines = sum(len(run["events"]) for run in found["runs"])
    for run in found["runs"]:
        x1, x2 = (_time(run["data_interval"][0]) or _time(run["logical_date"])), _time(run["logical_date"])
        x1, x2 = x(min(x1, x2)), x(max(x1, x2))
        colour = WARN if run["empty"] or run["out_of_order"] else RUN
        events_total = run.get("events_total", len(run["events"]))
        parts.append(
            f'<rect class="run" x="{x1:.1f}" y="{runs_y + 6}" width="{max(x2 - x1, 3):.1f}" '
            f'height="{LANE - 12}" fill="{colour}" fill-opacity="0.7">'
            f"<title>{escape(run['run_id'])}: {events_total} event(s)</title></rect>"
        )
        if lines <= MAX_LINES:
            for e in run["events"]:
                if e["dataset_uri"] in lanes:
                    ey = TOP + LANE * lanes[e["dataset_uri"]] + LANE / 2 + 8
                    colour = WARN if e["late"] or e["doubled"] else MUTED
                    event_x = x(_time(e["timestamp"]))
                    parts.append(
                        f'<line class="consumed" x1="{x2:.1f}" y1="{runs_y + 6}" x2="{event_x:.1f}" '
                        f'y2="{ey:.0f}" stroke="{colour}" stroke-width="0.6"/>'
                    )
    if now <= end:
        now_x = x(now)
        parts.append(
            f'<line x1="{now_x:.1f}" y1="{TOP - 6}" x2="{now_x:.1f}" y2="{height - 18}" stroke="#c33" '
            'stroke-dasharray="3,3"/>'
            f'<text x="{now_x:.1f}" y="{height - 6}" fill="#c33" text-anchor="middle">now</text>'
        )
    else:
        parts.append(
            f'<text x="{WIDTH - 10}" y="{height - 6}" fill="#c33" text-anchor="end">'
            f"now: {escape(_label(now))} &#8594;</text>"
        )
    if lines > MAX_LINES:
        parts.append(
            f'<text x="{LEFT}" y="{height - 6}" fill="{MUTED}">{lines} consumed events: lines left out</text>'
        )
    parts.append("</svg>")
    return Markup("".join(parts))


def _label(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _short(uri: str, size: int = 34) -> str:
    return uri if len(uri) <= size else "..." + uri[-(size - 3) :]
