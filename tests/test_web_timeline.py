"""The DAG page's timeline (an SVG drawn on the server): readable at 10 000 events, and every text escaped."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from airflow_dataset_race_fix.web import timeline

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def _event(i: int, uri: str, late: bool = False) -> dict:
    return {
        "id": i,
        "dataset_uri": uri,
        "timestamp": (T0 + timedelta(seconds=i)).isoformat(),
        "late": late,
        "doubled": False,
        "source_dag_id": None,
        "source_run_id": None,
        "source_task_id": None,
        "extra": {},
    }


def _found(events_per_run: int, runs: int, uri: str = "s3://a") -> dict:
    run_list = []
    for r in range(runs):
        first = r * events_per_run
        run_list.append(
            {
                "run_id": f"run{r}",
                "logical_date": (T0 + timedelta(seconds=first + events_per_run)).isoformat(),
                "data_interval": [
                    (T0 + timedelta(seconds=first)).isoformat(),
                    (T0 + timedelta(seconds=first + events_per_run)).isoformat(),
                ],
                "state": "success",
                "empty": False,
                "out_of_order": False,
                "events": [_event(first + i, uri, late=(i == 0 and r == 1)) for i in range(events_per_run)],
            }
        )
    return {
        "dag_id": "d",
        "database_now": (T0 + timedelta(seconds=events_per_run * runs + 5)).isoformat(),
        "datasets": [{"uri": uri}],
        "runs": run_list,
        "pending_events": [_event(10**6, uri)],
        "deferred_events": [],
    }


def test_few_events_are_marks_with_a_line_from_their_run():
    svg = str(timeline.render(_found(5, 3)))
    assert (
        svg.count('class="event"') == 16
        and svg.count('class="run"') == 3
        and svg.count('class="consumed"') == 15
    )
    assert svg.count(timeline.WARN) >= 2  # the pending event and the late one


def test_ten_thousand_events_are_binned_and_the_lines_left_out():
    svg = str(timeline.render(_found(1000, 10)))
    assert (
        'class="event"' not in svg
        and 0 < svg.count('class="bin"') <= (timeline.WIDTH - timeline.LEFT) // 4 + 1
    )
    assert 'class="consumed"' not in svg and "lines left out" in svg
    assert len(svg) < 200_000


def test_every_text_is_escaped():
    found = _found(2, 1, uri="<script>alert(1)</script>")
    found["dag_id"] = '"><script>alert(2)</script>'
    found["runs"][0]["run_id"] = "<b>run</b>"
    svg = str(timeline.render(found))
    assert "<script>" not in svg and "<b>" not in svg and "&lt;script&gt;" in svg
