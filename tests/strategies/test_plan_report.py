"""``PlanReport`` read as the dict earlier versions returned: every mapping method a dict user calls."""

import collections.abc

import pytest

from kerasflow.strategies import PlanReport


def test_a_plan_report_reads_as_the_dict_of_its_set_fields():
    report = PlanReport(algorithm="heft", predicted_step_time=0.01, plan_dropped="slower")
    expected = {"algorithm": "heft", "predicted_step_time": 0.01, "plan_dropped": "slower"}
    assert isinstance(report, collections.abc.Mapping)
    assert dict(report) == expected and dict(report.items()) == expected
    assert sorted(report.keys()) == sorted(expected) and sorted(map(str, report.values())) == ["0.01", "heft", "slower"]
    assert {name: value for name, value in report.items()} == expected  # code written for the dict
    assert report.get("measured_step_time") is None and report.get("measured_step_time", 0.0) == 0.0
    assert "plan_dropped" in report and "plan_replaced" not in report and len(report) == 3
    with pytest.raises(KeyError):
        report["settled_step"]  # noqa: B018 - a field still None is not in the mapping


def test_two_reports_compare_by_their_fields():
    assert PlanReport(algorithm="heft") == PlanReport(algorithm="heft") != PlanReport(algorithm="cpop")
