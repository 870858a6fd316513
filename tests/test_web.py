"""
The web page (Browse > Dataset runs) in a real Airflow webserver, seen through headless Chromium.

The database holds harness states: an AND condition waiting for one dataset (whose URI and
an event's ``extra`` hold ``<script>``), a late commit that a later run consumed, and a
DAG whose events are dated ahead. Two users log in through Airflow's login form: an admin,
and a user whose role may read only the AND DAG. The pages must say what ``explain`` says
against the same database, the second user must see neither the other DAGs' pages nor
their JSON, nor what Airflow denies that role (the DAG's runs, dataset events, a producer
DAG's ids), and nothing from the database may run as script. More DAGs than a page holds:
sorting and filtering take the whole list. A run and a queue of more events than the page
shows: the page reads a bounded number, and links to the rest. Screenshots are kept in
``test-artifacts/screenshots/``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import pytest
import requests
from airflow import settings
from airflow.datasets import DatasetAll, DatasetAny
from airflow.models.dag import DagModel
from airflow.models.dagrun import DagRun
from airflow.models.dataset import DatasetEvent, DatasetModel
from airflow.utils.session import create_session
from airflow.utils.state import DagRunState
from airflow.utils.types import DagRunType
from conftest import AIRFLOW_VERSION, BACKEND, SOURCE_MODE
from matrix import ON_WEB_PAGE_ENVS
from sqlalchemy import select, update
from test_explain import _explain as _explained
from webdriver import Browser, chromium_found, free_port

# A webserver and a browser cost about a minute and a half an env: the page is tested once per
# release and once per server backend (tests/matrix.py); the other envs run the same code.
pytestmark = ON_WEB_PAGE_ENVS

REPO = Path(__file__).resolve().parents[1]
SCREENSHOTS = REPO / "test-artifacts" / "screenshots" / f"airflow-{AIRFLOW_VERSION}-{BACKEND}"
XSS_URI_NAME = "<script>window.__xss_uri=1</script>"
XSS_EXTRA = {"note": "<script>window.__xss_extra=1</script>"}
PASSWORD = "adrf-web-test-1"
PRODUCER_RUN = "producer_run_not_for_limited"
MANY = 52  # paused consumers, more than a page (views.PAGE_SIZE) before the two that run
EVENTS_SHOWN = 100  # views.EVENTS_SHOWN (not imported: Flask AppBuilder stays out of pytest)
BULK = 130  # events of one run, and pending: more than the page shows


def _build_many():
    """More DAGs than a page: MANY paused ones, then (by dag_id) two unpaused with pending events."""
    from reproduce.harness.world import World

    w = World("web_many")
    try:
        x, y = w.dataset("x"), w.dataset("y")
        paused = w.consumers("m", [x], MANY)
        running = [w.consumer("z_y1", [y]), w.consumer("z_y2", [y])]
        p = w.producer("P")
        w.emit(p, x), p.finish()
        for _ in range(3):
            w.emit(p, y), p.finish()
        return paused, running
    finally:
        w.close()


def _add_bulk(w, dag_id: str, dataset) -> None:
    """A run of ``dag_id`` that consumed BULK events of ``dataset``, and BULK events after it."""
    from datetime import datetime, timedelta, timezone

    from airflow.models.dagrun import DagRun
    from airflow.models.dataset import association_table
    from airflow.utils.state import DagRunState
    from airflow.utils.types import DagRunType
    from sqlalchemy import insert

    now = datetime.now(timezone.utc)
    with create_session() as session:
        dataset_id = session.scalar(select(DatasetModel.id).where(DatasetModel.uri == dataset.uri))
        stamps = [now - timedelta(seconds=300) + timedelta(milliseconds=i) for i in range(2 * BULK)]
        session.execute(
            insert(DatasetEvent), [{"dataset_id": dataset_id, "timestamp": t, "extra": {}} for t in stamps]
        )
        ids = session.scalars(
            select(DatasetEvent.id).where(DatasetEvent.dataset_id == dataset_id).order_by(DatasetEvent.id)
        ).all()
        run_date = stamps[BULK - 1] + timedelta(milliseconds=0.5)
        session.execute(
            insert(DagRun),
            [
                {
                    "dag_id": dag_id,
                    "run_id": "dataset_triggered__bulk",
                    "execution_date": run_date,
                    "state": DagRunState.SUCCESS,
                    "run_type": DagRunType.DATASET_TRIGGERED,
                    "external_trigger": False,
                    "data_interval_start": stamps[0],
                    "data_interval_end": stamps[BULK - 1],
                    "clear_number": 0,
                }
            ],
        )
        run = session.scalar(select(DagRun.id).where(DagRun.dag_id == dag_id))
        session.execute(insert(association_table), [{"dag_run_id": run, "event_id": i} for i in ids[:BULK]])


def _build_states():
    """The harness states the pages show; returns the DAG ids by role."""
    import airflow_dataset_race_fix
    from reproduce.harness.world import DONE, PAUSED, World

    if not SOURCE_MODE:
        airflow_dataset_race_fix.unapply()
        airflow_dataset_race_fix.apply(strict=True)
    w = World("web")
    try:
        a, evil = w.dataset("a"), w.dataset(XSS_URI_NAME)
        b, c = w.dataset("b"), w.dataset("c")
        waiting = w.consumer("waits_for_both", DatasetAll(a, evil))
        late = w.consumer("late_commit", DatasetAny(b, c))
        ahead = w.consumer("dated_ahead", [w.dataset("ahead")])
        bulk = w.consumer("bulk", [w.dataset("bulk")])
        p, q, s = w.producer("P"), w.producer("Q"), w.scheduler()
        w.emit(p, a), p.finish()
        with create_session() as session:  # an event whose extra holds a script
            session.execute(
                update(DatasetEvent)
                .where(
                    DatasetEvent.dataset_id
                    == select(DatasetModel.id).where(DatasetModel.uri == a.uri).scalar_subquery()
                )
                .values(
                    extra=XSS_EXTRA, source_dag_id=late, source_run_id=PRODUCER_RUN, source_task_id="emit"
                )
                .execution_options(synchronize_session=False)
            )
            session.add(
                DagRun(
                    dag_id=waiting,
                    run_id="dataset_triggered__before",
                    run_type=DagRunType.DATASET_TRIGGERED,
                    execution_date=w.clock.base - timedelta(hours=1),
                    state=DagRunState.SUCCESS,
                )
            )  # a run to withhold
        if BACKEND == "sqlite":  # the host's clock dates events: a producer whose clock lags
            w.clock.at(3600), w.emit(q, c), q.finish()
            w.loop(s), s.finish()
            w.clock.at(3500), w.emit(p, b), p.finish()  # dated before that run, committed after it
            w.clock.at(3601), w.loop(s), s.finish()
            w.clock.at(3600 + 700), w.emit(p, w.dataset("ahead")), p.finish()
            w.clock.stop()
        else:  # S3: a producer stopped between its stamp and its COMMIT
            from airflow.datasets.manager import DatasetManager

            w.emit(q, b), q.finish()
            w.loop(s), s.finish()
            w.emit(q, b), q.finish()
            p.pause_after("update dataset_event")
            assert w.emit(p, b) == PAUSED
            w.emit(q, c), q.finish()
            assert w.loop(s) == DONE
            s.finish()
            p.resume(), p.finish()
            w.loop(s), s.finish()  # consumes the late event
            clock = {"postgres": "clock_timestamp() + interval '700 seconds'"}[BACKEND]
            original = DatasetManager._database_clock
            DatasetManager._database_clock = classmethod(lambda cls, dialect_name: clock)
            try:
                w.emit(p, w.dataset("ahead")), p.finish()
            finally:
                DatasetManager._database_clock = original
        _add_bulk(w, bulk, w.dataset("bulk"))
        return {"waiting": waiting, "late": late, "ahead": ahead, "bulk": bulk}
    finally:
        w.close()
        if not SOURCE_MODE:
            airflow_dataset_race_fix.unapply()


def _airflow(*args: str, env: dict) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "airflow", *args], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, f"airflow {' '.join(args)}: {done.stdout[-2000:]} {done.stderr[-3000:]}"


GRANT = """
import json, sys
from airflow.providers.fab.auth_manager.cli_commands.utils import get_application_builder

with get_application_builder() as appbuilder:
    sm = appbuilder.sm
    for user, resources in json.loads(sys.argv[1]).items():
        role = sm.find_role(user) or sm.add_role(user)
        for resource in resources:
            sm.add_permission_to_role(role, sm.create_permission("can_read", resource))
        assert sm.add_user(user, "L", "Imited", user + "@example.com", role, password=sys.argv[2])
"""


def _grant(roles: dict[str, list[str]], env: dict) -> None:
    """Per user, a role of its own that may read only its resources, made with Airflow's own security
    manager in one process (the CLI's 'roles add-perms' needs the resources made first, and
    'sync-perm --include-dags' makes one per DAG of the whole database: minutes on a test database
    with hundreds)."""
    done = subprocess.run(
        [sys.executable, "-c", GRANT, json.dumps(roles), PASSWORD],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"granting {roles}: {done.stderr[-3000:]}"


@pytest.fixture(scope="module")
def site():
    if not all(chromium_found()):
        pytest.fail("Debian's chromium and chromium-driver are needed (.ci/run installs them)")
    many = _build_many()
    dags = _build_states()  # pauses the other worlds' DAGs: the two that run are unpaused again
    with create_session() as session:
        session.execute(update(DagModel).where(DagModel.dag_id.in_(many[1])).values(is_paused=False))
    home = tempfile.TemporaryDirectory(prefix="adrf-web-")
    port = free_port()
    env = {
        **os.environ,
        "AIRFLOW_HOME": home.name,
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": settings.SQL_ALCHEMY_CONN,
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": os.path.join(home.name, "dags"),
        "AIRFLOW__WEBSERVER__SECRET_KEY": "adrf-web-test",
        "AIRFLOW__WEBSERVER__WORKERS": "1",
        # Chromium's idle pre-connections would hold a sync worker
        "AIRFLOW__WEBSERVER__WORKER_CLASS": "gthread",
        "AIRFLOW__WEBSERVER__WEB_SERVER_HOST": "127.0.0.1",
        # FAB allows 5 logins per 40 s by default, and this module logs in more often than that: the next
        # login got the sign-in page back (a JSON error on a fast machine)
        "AIRFLOW__FAB__AUTH_RATE_LIMITED": "False",
    }
    # this clone's package, but no shim in the webserver: the page says the fix is off there
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1] / "src")
    _airflow(
        "users",
        "create",
        "--role",
        "Admin",
        "--username",
        "admin",
        "--password",
        PASSWORD,
        "--firstname",
        "A",
        "--lastname",
        "Dmin",
        "--email",
        "admin@example.com",
        env=env,
    )
    # limited: the website and one DAG (Airflow answers 403 for its runs and for dataset events);
    # events: and DAG Runs and Datasets (not the producer's DAG)
    one_dag = ["Website", f"DAG:{dags['waiting']}"]
    _grant({"limited": one_dag, "events": one_dag + ["DAG Runs", "Datasets"]}, env=env)
    log = open(os.path.join(home.name, "webserver.log"), "w")
    server = subprocess.Popen(
        [sys.executable, "-m", "airflow", "webserver", "--port", str(port)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            try:
                if requests.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            assert server.poll() is None, Path(log.name).read_text()[-4000:]
            time.sleep(1)
        else:
            pytest.fail("the webserver did not start: " + Path(log.name).read_text()[-4000:])
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        yield base, dags, many
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
        log.close()
        home.cleanup()


def _login(base: str, user: str) -> Browser:
    browser = Browser()
    browser.get(f"{base}/login/")
    browser.type("input[name=username]", user)
    browser.type("input[name=password]", PASSWORD)
    browser.click("input[type=submit], button[type=submit]")
    for _ in range(50):
        if "/login" not in browser.script("return location.pathname"):
            return browser
        time.sleep(0.1)
    raise AssertionError(f"{user} could not log in: {browser.source()[:2000]}")


def test_the_pages_say_what_explain_says_and_run_no_script_from_the_database(site):
    base, dags, _ = site
    browser = _login(base, "admin")
    try:
        # the test database holds the other tests' DAGs too (50 a page): this world's, by the filter
        world = os.path.commonprefix(list(dags.values()))
        browser.get(f"{base}/dataset-race-fix/?filter={world}")
        rows = {browser.attribute(row, "data-dag-id"): row for row in browser.find_all("tr.dag-row")}
        assert set(rows) == set(dags.values()), rows
        for dag_id in dags.values():
            found = _explained(dag_id)
            shown = browser.element_text(rows[dag_id])
            assert ("waits" if not found["verdict"]["creates_run"] else "runs") in shown, (dag_id, shown)
        assert browser.find_all("#fix-off"), "the page says the fix is off in this webserver process"
        browser.screenshot(SCREENSHOTS / "dags.png")
        browser.get(f"{base}/dataset-race-fix/?verdict=waits&filter={world}waits_for")
        assert browser.shown_dag_ids() == [dags["waiting"]]
        browser.get(f"{base}/dataset-race-fix/?verdict=runs&filter={world}")
        assert browser.shown_dag_ids() == [
            d for d in sorted(dags.values()) if _explained(d)["verdict"]["creates_run"]
        ]

        for role, dag_id in dags.items():
            found = _explained(dag_id)
            browser.get(f"{base}/dataset-race-fix/dag/{dag_id}")
            assert browser.text("#dag-id") == dag_id
            verdict = browser.text("#verdict")
            assert ("Waits" if not found["verdict"]["creates_run"] else "Runs") in verdict, verdict
            for reason in found["verdict"]["reasons"]:
                assert reason["code"] in verdict
            assert browser.find_all("#timeline svg rect.event"), "the events are drawn"
            if found["runs"]:
                assert len(browser.find_all("#timeline svg rect.run")) == len(found["runs"])
            shown = browser.text("#audit")  # each finding's runs or events beside its count (issue 50)
            assert all(str(row) in shown for rows in found["audit"]["rows"].values() for row in rows), shown
            browser.screenshot(SCREENSHOTS / f"dag-{role}.png")
            page_json = json.loads(
                requests.get(
                    f"{base}/dataset-race-fix/dag/{dag_id}/json", cookies=browser.cookies(), timeout=30
                ).text
            )
            assert page_json["verdict"] == found["verdict"]
            assert page_json["pending_events"] == found["pending_events"][:EVENTS_SHOWN]
            assert (
                page_json["pending_events_total"] == len(found["pending_events"])
                and not page_json["withheld"]
            )
        waiting = _explained(dags["waiting"])
        assert "condition_not_met" in [r["code"] for r in waiting["verdict"]["reasons"]]
        assert any(e["late"] for run in _explained(dags["late"])["runs"] for e in run["events"])
        assert "deferred" in [r["code"] for r in _explained(dags["ahead"])["verdict"]["reasons"]]
        assert _explained(dags["ahead"])["audit"]["rows"]["future_dated"]  # shown on its page, above

        browser.get(f"{base}/dataset-race-fix/dag/{dags['waiting']}")
        source = browser.source()
        assert XSS_URI_NAME not in source and "&lt;script&gt;window.__xss_uri=1&lt;/script&gt;" in source
        assert "<script>window.__xss_extra" not in source and "__xss_extra" in source
        assert browser.script("return [window.__xss_uri, window.__xss_extra]") == [None, None]
        browser.get(f"{base}/dataset-race-fix/")
        assert browser.script("return [window.__xss_uri, window.__xss_extra]") == [None, None]
    finally:
        browser.close()


def test_a_user_sees_only_the_dags_they_may_read(site):
    base, dags, _ = site
    browser = _login(base, "limited")
    try:
        browser.get(f"{base}/dataset-race-fix/")
        assert browser.shown_dag_ids() == [dags["waiting"]]
        browser.get(f"{base}/dataset-race-fix/dag/{dags['waiting']}")
        assert browser.text("#dag-id") == dags["waiting"]
        cookies = browser.cookies()
        for dag_id in (dags["late"], dags["ahead"]):
            browser.get(f"{base}/dataset-race-fix/dag/{dag_id}")
            assert not browser.find_all("#dag-id") and dag_id not in browser.source()
            answer = requests.get(f"{base}/dataset-race-fix/dag/{dag_id}/json", cookies=cookies, timeout=30)
            assert answer.status_code == 404 and dag_id not in answer.text
        answer = requests.get(
            f"{base}/dataset-race-fix/dag/{dags['waiting']}/json", cookies=cookies, timeout=30
        )
        assert answer.status_code == 200 and json.loads(answer.text)["dag_id"] == dags["waiting"]
        browser.screenshot(SCREENSHOTS / "dags-limited-user.png")
    finally:
        browser.close()
    # What Airflow answers 403 for (the DAG's runs, dataset events) and a producer DAG the user may
    # not read: left out of the page and its JSON, and said so
    found = _explained(dags["waiting"])
    assert found["runs"] and found["pending_events"][0]["source_run_id"] == PRODUCER_RUN  # there to withhold
    for user, withheld in (("limited", {"runs", "events"}), ("events", {"producers"})):
        browser = _login(base, user)
        try:
            browser.get(f"{base}/dataset-race-fix/dag/{dags['waiting']}")
            assert browser.text("#dag-id") == dags["waiting"]
            shown = {browser.attribute(e, "data-part") for e in browser.find_all(".withheld")}
            assert shown == withheld, shown
            source = browser.source()
            assert PRODUCER_RUN not in source and dags["late"] not in source
            assert ("__xss_extra" in source) == ("events" not in withheld)
            assert len(browser.find_all("h4.run")) == (0 if "runs" in withheld else len(found["runs"]))
            assert len(browser.find_all("#timeline svg rect.event")) == (
                0
                if "events" in withheld
                else len(
                    {
                        e["id"]
                        for e in found["pending_events"] + [e for r in found["runs"] for e in r["events"]]
                    }
                )
            )
            browser.screenshot(SCREENSHOTS / f"dag-withheld-{user}.png")
            answer = requests.get(
                f"{base}/dataset-race-fix/dag/{dags['waiting']}/json", cookies=browser.cookies(), timeout=30
            )
            page_json = json.loads(answer.text)
            assert (
                set(page_json["withheld"]) == withheld
                and page_json["verdict"]["reasons"] == found["verdict"]["reasons"]
            )
            assert PRODUCER_RUN not in answer.text and dags["late"] not in answer.text
            assert ("__xss_extra" in answer.text) == ("events" not in withheld)
            assert (page_json["runs"] == []) == ("runs" in withheld)
        finally:
            browser.close()
    anonymous = requests.get(
        f"{base}/dataset-race-fix/dag/{dags['waiting']}/json", timeout=30, allow_redirects=False
    )
    assert anonymous.status_code in (302, 401, 403) and '"verdict"' not in anonymous.text  # to the login form


def test_sorting_and_filtering_take_every_page(site):
    base, dags, (paused, running) = site
    prefix = os.path.commonprefix(paused + running)
    cookies = _login_cookies(base, "admin")

    def shown(query: str) -> tuple[list[str], str]:
        page = requests.get(
            f"{base}/dataset-race-fix/?filter={prefix}&{query}", cookies=cookies, timeout=120
        ).text
        return re.findall(r'data-dag-id="([^"]+)"', page), page

    by_id, page = shown("sort=dag_id")
    assert by_id == sorted(paused)[:50] and f"{len(paused) + 2} DAG(s)" in page  # the two that run: page 2
    by_pending, _ = shown("sort=pending")
    assert by_pending[:2] == sorted(running), by_pending[:5]
    runs = [d for d in running if _explained(d)["verdict"]["creates_run"]]
    assert runs, "the unpaused DAGs with events run"
    assert shown("verdict=runs")[0] == runs
    waits, page = shown("verdict=waits&sort=verdict")
    assert len(waits) == 50 and f"{len(paused) + len(running) - len(runs)} DAG(s)" in page
    for dag_id in running + paused[:1]:  # the list's row is explain's verdict
        found = _explained(dag_id)
        row = re.search(
            rf'data-dag-id="{dag_id}">(.*?)</tr>',
            shown("sort=pending")[1] if dag_id in running else page,
            re.S,
        )
        assert row and (("runs" if found["verdict"]["creates_run"] else "waits") in row.group(1)), dag_id
        for reason in found["verdict"]["reasons"]:
            assert reason["code"] in row.group(1), (dag_id, reason)


def test_the_page_reads_a_bounded_number_of_events(site):
    base, dags, _ = site
    cookies = _login_cookies(base, "admin")
    found = _explained(dags["bulk"])
    assert len(found["runs"][0]["events"]) == BULK and len(found["pending_events"]) == BULK
    page_json = requests.get(
        f"{base}/dataset-race-fix/dag/{dags['bulk']}/json", cookies=cookies, timeout=60
    ).json()
    run = page_json["runs"][0]
    assert len(run["events"]) == EVENTS_SHOWN and run["events_total"] == BULK
    assert len(page_json["pending_events"]) == EVENTS_SHOWN and page_json["pending_events_total"] == BULK
    for first, more, wanted in (
        (run["events"], run["events_more"], found["runs"][0]["events"]),
        (page_json["pending_events"], page_json["pending_events_more"], found["pending_events"]),
    ):
        rest = requests.get(base + more, cookies=cookies, timeout=60).json()  # the "more" link: the rest
        assert rest["more"] is None and len(rest["events"]) == BULK - EVENTS_SHOWN
        assert {e["id"] for e in first + rest["events"]} == {e["id"] for e in wanted}
    page = requests.get(f"{base}/dataset-race-fix/dag/{dags['bulk']}", cookies=cookies, timeout=60).text
    assert page.count('<tr class="event">') == 2 * EVENTS_SHOWN and page.count('class="more"') == 2


def _login_cookies(base: str, user: str) -> dict[str, str]:
    """A logged-in session's cookies, through Airflow's login form without a browser."""
    session = requests.Session()
    form = session.get(f"{base}/login/", timeout=30).text
    token = re.search(r'name="csrf_token" type="hidden" value="([^"]+)"', form).group(1)
    answer = session.post(
        f"{base}/login/", data={"username": user, "password": PASSWORD, "csrf_token": token}, timeout=30
    )
    assert answer.ok and "/login" not in answer.url, (
        answer.status_code,
        answer.url,
    )  # not logged in: say so here
    return session.cookies.get_dict()


def test_the_deployment_page_names_a_stock_scheduler_and_this_webserver(site):
    """Issue 48: the page's "Which processes ran the fix". A scheduler without the package (a Job row, no
    mark) and this webserver's worker (the package, no shim: its mark says why) are NOT fixed."""
    from airflow.jobs.job import Job
    from airflow.utils import timezone

    base, _, _ = site
    with create_session() as session:
        session.add(
            Job(
                job_type="SchedulerJob",
                hostname="adrf-web-stock-host",
                state="running",
                start_date=timezone.utcnow(),
                latest_heartbeat=timezone.utcnow(),
            )
        )
    browser = _login(base, "admin")
    try:
        browser.get(f"{base}/dataset-race-fix/")
        assert browser.attribute(browser.find("#deployment-link"), "href").endswith(
            "/dataset-race-fix/deployment"
        )
        browser.get(f"{base}/dataset-race-fix/deployment")
        components = browser.text("#components")
        stock = next(line for line in components.splitlines() if "adrf-web-stock-host" in line)
        assert "NOT fixed" in stock and "no mark" in stock, components
        webserver = [line for line in components.splitlines() if "webserver" in line]
        assert webserver and all(
            "NOT fixed" in line and "no route turned the shim on" in line for line in webserver
        )
        assert browser.find_all("#not-all-fixed")
        assert browser.script("return document.title") == "Dataset runs: processes - Airflow"
        browser.screenshot(SCREENSHOTS / "deployment.png")
        browser.get(
            f"{base}/dataset-race-fix/deployment?hours=nan"
        )  # the command's rule and line, in the browser
        shown = browser.script("return document.body.innerText")
        assert (
            "Bad Request" in shown and "hours 'nan': expected a number above 0 and at most 8784" in shown
        ), shown
    finally:
        browser.close()


def test_the_deployment_page_takes_hours_by_the_commands_rule_and_the_pages_have_titles(site):
    """``?hours=`` follows ``deployment --hours``' rule (diagnostics.deployment.period_hours): bad values
    answer 400 with the command's one-line message, 0.005 is taken as given. Each page has a title of its own.
    """
    import html

    base, dags, _ = site
    cookies = _login_cookies(base, "admin")
    for hours in ("nan", "inf", "1e9", "-1", "0", "abc"):
        answer = requests.get(
            f"{base}/dataset-race-fix/deployment", params={"hours": hours}, cookies=cookies, timeout=60
        )
        message = f"hours {hours!r}: expected a number above 0 and at most 8784 (366 days)"
        assert answer.status_code == 400 and message in html.unescape(answer.text), (
            hours,
            answer.text[-2000:],
        )
    answer = requests.get(f"{base}/dataset-race-fix/deployment?hours=0.005", cookies=cookies, timeout=60)
    assert answer.ok and "over the last 0.005 hours" in answer.text
    titles = {}
    for path in ("", f"dag/{dags['bulk']}", "deployment"):
        page = requests.get(f"{base}/dataset-race-fix/{path}", cookies=cookies, timeout=60).text
        titles[path] = re.search(r"<title>\s*(.*?)\s*</title>", page, re.S)[1]
    assert titles == {
        "": "Dataset runs - Airflow",
        f"dag/{dags['bulk']}": f"Dataset runs: {dags['bulk']} - Airflow",
        "deployment": "Dataset runs: processes - Airflow",
    }
