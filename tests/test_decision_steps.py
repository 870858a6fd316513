"""
The scheduler's pure decision steps, without a database: ``_dataset_floors`` (where a DAG's
read of each dataset starts) and ``_choose_dataset_run`` (whether its events make a run, and
its date). The SQL around them is tested on every backend by the scenario tests.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

from airflow_dataset_race_fix.fix.jobs.scheduler_job_runner import SchedulerJobRunner as Runner

T = datetime(2026, 1, 1, 12, tzinfo=timezone.utc)
S = timedelta(seconds=1)
LOOKBACK, LATENCY = 900 * S, 10 * S


def floors(
    dataset_ids,
    latest_run,
    queued=None,
    newest=None,
    found_late=None,
    now=T,
    checked=None,
    below_clock=None,
    oldest=None,
):
    return Runner._dataset_floors(
        dataset_ids,
        latest_run,
        now,
        queued or {},
        newest or {},
        found_late or {},
        LOOKBACK,
        LATENCY,
        checked,
        below_clock,
        oldest,
    )


def event(dataset_id, at, id=0):
    return SimpleNamespace(id=id, dataset_id=dataset_id, timestamp=at)


def test_a_first_run_reads_every_event():
    assert floors([1, 2], None) == Runner._DatasetFloors({}, None, True)


def test_a_consumed_dataset_is_read_from_its_newest_consumed_event_minus_the_latency():
    found = floors([1, 2], T - 5 * S, newest={1: T - 7 * S})
    full = T - 5 * S - LOOKBACK
    assert found == Runner._DatasetFloors({1: T - 17 * S, 2: full}, full, False)


def test_an_older_queue_row_pulls_the_floor_down_and_the_look_back_bounds_it():
    found = floors([1], T, queued={1: T - 30 * S}, newest={1: T - S})
    assert found.floors == {1: T - 40 * S}
    assert floors([1], T, newest={1: T - 2000 * S}).floors == {1: T - LOOKBACK}


def test_a_late_commit_found_is_read_from_its_stamp_within_the_look_back():
    late = floors([1, 2], T - S, newest={1: T - 2 * S, 2: T - 2 * S}, found_late={1: T - 100 * S})
    assert not late.full_read and late.floors == {1: T - 100 * S, 2: T - 2 * S - LATENCY}
    assert floors([1], T - S, newest={1: T - 2 * S}, found_late={1: T - 2000 * S}).floors == {
        1: T - S - LOOKBACK
    }


def test_a_clock_behind_the_latest_run_reads_in_full_from_the_run_before_the_clock():
    ahead = floors([1], T + 120 * S, newest={1: T + 119 * S})
    assert ahead.full_read and ahead.floors == {1: T - LOOKBACK}  # under the clock too
    # issue 47: a clock stepped forward 20 minutes dated a run; corrected, the DAG waits 16 minutes: stock
    # reads from the run before the clock, and so does the fix (not from the clock less the look-back)
    stepped = floors([1], T + 1200 * S, newest={1: T + 1200 * S}, now=T + 960 * S, below_clock=T)
    assert stepped.full_read and stepped.floors == {1: T - LOOKBACK}
    assert floors([1], T + S, newest={1: T + S}, now=T + S).floors == {
        1: T + S - LATENCY
    }  # not ahead: the floor


def test_nothing_is_read_below_the_oldest_run_db_clean_left():
    # issue 47 item 4: the runs below it were deleted with their consumption records
    # the latency below the newest consumed event still reads below it (a late commit just below a first run)
    assert floors([1, 2], T, newest={1: T - S}, oldest=T).floors == {1: T - S - LATENCY, 2: T}
    # a late commit the net found reads from its stamp, however far below the look-back, but never below the
    # oldest run: runs deleted since the find (db clean) took their consumption records with them
    assert floors([1, 2], T, newest={1: T - S}, found_late={1: T - 60 * S}, oldest=T - 30 * S).floors == {
        1: T - 30 * S,
        2: T - 30 * S,
    }
    assert floors([1], T, newest={1: T - S}, found_late={1: T - 2000 * S}, oldest=T - 3000 * S).floors == {
        1: T - 2000 * S
    }
    assert floors([1], T, queued={1: T - 20 * S}, newest={1: T - S}, oldest=T).floors == {1: T - 30 * S}
    # a row written after it reads from the latency before the row, not below the oldest run (the explorer's
    # 'Q1:a S.loop Q2:a S.loop Q3:a D.clean:d', steps 10 ms apart: Q1 was consumed again)
    assert floors([1], T, queued={1: T + 2 * S}, newest={1: T - S}, oldest=T).floors == {1: T - S - LATENCY}
    assert floors([1], T, queued={1: T}, oldest=T - 0.5 * S).floors == {
        1: T - 0.5 * S
    }  # a row after it: not below


def test_what_this_process_checked_raises_the_floor_but_never_above_a_queue_row():
    assert floors([1], T - 5 * S, newest={1: T - 7 * S}, checked={1: T - 2 * S}).floors == {1: T - 2 * S}
    assert floors([1], T - 5 * S, newest={1: T - 7 * S}, checked={1: T - 30 * S}).floors == {1: T - 17 * S}
    queued = floors([1], T - 5 * S, queued={1: T - 4 * S}, newest={1: T - 7 * S}, checked={1: T - 2 * S})
    assert queued.floors == {1: T - 14 * S}
    assert floors(
        [1], T - 5 * S, newest={1: T - 7 * S}, found_late={1: T - 60 * S}, checked={1: T}
    ).floors == {1: T - 60 * S}
    assert floors([1], T - 5 * S, checked={1: T}).floors == {
        1: T - 5 * S - LOOKBACK
    }  # nothing consumed from it


def test_a_read_is_remembered_below_what_it_left_and_the_latency_and_forgotten_when_it_cannot_hold():
    runner, latest = Runner(), T - 5 * S
    state = SimpleNamespace(database_now=T, latest_runs={"d": (latest, None, None), "f": (None, None, None)})
    read = floors([1, 2], latest, newest={1: T - 7 * S, 2: T - 7 * S})
    runner._remember_dataset_reads("d", read, [event(1, T - 30 * S), event(1, T - 20 * S)], state, LATENCY)
    assert runner._checked_dataset_floors("d", [1, 2, 3], T, latest) == {1: T - 30 * S, 2: T - LATENCY}
    assert runner._checked_dataset_floors("d", [1, 2], T + S, T) == {
        1: T - 30 * S,
        2: T - LATENCY,
    }  # a newer run
    assert runner._checked_dataset_floors("e", [1, 2], T, latest) == {}
    assert runner._checked_dataset_floors("d", [1, 2], T - S, latest) == {}  # the clock went back
    assert runner._checked_dataset_floors("d", [1, 2], T, latest - S) == {}  # the latest run was deleted
    runner._remember_dataset_reads("f", floors([1], None), [], state, LATENCY)  # a first run: nothing kept
    assert runner._checked_dataset_floors("f", [1], T, latest) == {}


def choose(events, latest_run=None, queued=None, loop_date=T - 50 * S, met=lambda statuses: bool(statuses)):
    uris = {1: "s3://a", 2: "s3://b"}
    return Runner._choose_dataset_run(events, T + 60 * S, latest_run, loop_date, queued or {}, uris, met)


def test_no_event_no_run_and_stale_queue_rows_go():
    choice = choose([], queued={1: T - S})
    assert choice.execution_date is None and choice.rows_done == (1,) and not choice.old_serialization


def test_a_run_is_dated_by_its_newest_event_or_queue_row_and_after_the_latest_run():
    choice = choose([event(1, T - 20 * S), event(2, T - 10 * S)], queued={1: T - 15 * S, 2: T - 5 * S})
    assert choice.execution_date == T - 5 * S and choice.rows_done == (1, 2)
    assert choose([event(1, T - 20 * S)], latest_run=T).execution_date == T + timedelta(microseconds=1)


def test_events_and_queue_rows_beyond_the_horizon_wait_and_date_nothing():
    choice = choose([event(1, T - 20 * S), event(2, T + 61 * S)], queued={1: T + 100 * S})
    assert [e.dataset_id for e in choice.deferred] == [2]
    assert [e.dataset_id for e in choice.events] == [1]
    assert choice.execution_date == T - 20 * S


def test_an_unmet_condition_keeps_the_queue_rows_of_datasets_with_events():
    condition = lambda statuses: {"s3://a", "s3://b"} <= statuses.keys()  # noqa: E731
    choice = choose([event(1, T - 20 * S)], queued={1: T - S, 2: T - S}, met=condition)
    assert choice.execution_date is None and choice.rows_done == (2,)


def test_late_events_are_those_dated_before_the_latest_run():
    choice = choose([event(1, T - 20 * S, id=1), event(1, T - S, id=2)], latest_run=T - 10 * S)
    assert [e.id for e in choice.late] == [1]


def test_an_old_serialization_is_skipped_and_deletes_nothing():
    def old(statuses):
        raise AttributeError("dataset_condition")

    choice = choose([event(1, T - 20 * S)], queued={1: T - S}, met=old)
    assert choice.old_serialization and choice.execution_date is None and choice.rows_done == ()
    assert choose([], met=old).old_serialization is False  # no events: the condition is not asked
