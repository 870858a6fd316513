"""Every race scenario, deterministic, against stock Airflow (must show the bug) and the fix (must not)."""

from __future__ import annotations

import pytest
from conftest import BACKEND

from reproduce.harness.scenarios import SCENARIOS, run_scenario


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.id for s in SCENARIOS])
def test_scenario(scenario, variant):
    if not scenario.applies_to(BACKEND):
        pytest.skip(f"{scenario.id} cannot happen on {BACKEND}")
    outcome = run_scenario(scenario)
    print(f"{scenario.id} {variant} on {BACKEND}: {outcome.report.totals()}")
    if variant == "stock":
        assert outcome.shows_bug(), (
            f"stock Airflow should show {scenario.expect_stock}: {outcome.report.totals()}"
        )
    else:
        assert outcome.violations == {}, outcome.report.as_dict()
