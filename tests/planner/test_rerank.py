"""rerank and same_kind: the runners-up of a measured plan, their predictions corrected by its measurement."""

import math

import pytest

from kerasflow.planner import DataParallel, InvalidPlanError, Plan, rerank
from kerasflow.planner.search.rerank import same_kind

REPLICAS = DataParallel(("/D:0", "/D:1"))


def replicated(name, predicted):
    return Plan(placement={}, data_parallel=REPLICAS, predicted_step_time=predicted, algorithm=name)


def whole(name, predicted):
    return Plan(placement={}, predicted_step_time=predicted, algorithm=name)


def names(ranked):
    return [(plan.algorithm, round(seconds, 6)) for plan, seconds in ranked]


def test_a_replicated_plan_measured_slow_takes_its_kind_down_with_it():
    # data_parallel: predicted 20 ms, measured 34 ms, 1.7x. one_copy (replicated, 21 ms) is
    # expected at 21 * 1.7 = 35.7 ms; heft (25 ms) and single (30 ms) replicate nothing and keep
    # their predictions. Fastest first: heft 25, single 30, one_copy 35.7.
    others = [replicated("one_copy", 0.021), whole("heft", 0.025), whole("single", 0.030)]
    ranked = rerank(others, replicated("data_parallel", 0.020), 0.034)
    assert names(ranked) == [("heft", 0.025), ("single", 0.030), ("one_copy", 0.0357)]


def test_a_plan_placed_whole_measured_slow_scales_the_whole_plans_only():
    # cpop: predicted 10 ms, measured 15 ms, 1.5x. heft (11 ms) -> 16.5 ms, layerwise (12 ms)
    # -> 18 ms; data_parallel keeps its 14 ms and comes first.
    others = [whole("heft", 0.011), replicated("data_parallel", 0.014), whole("layerwise", 0.012)]
    ranked = rerank(others, whole("cpop", 0.010), 0.015)
    assert names(ranked) == [("data_parallel", 0.014), ("heft", 0.0165), ("layerwise", 0.018)]


def test_a_plan_faster_than_predicted_scales_its_kind_up_and_ties_keep_their_order():
    # heft: predicted 10 ms, measured 5 ms, 0.5x: cpop (12 ms) -> 6 ms, ahead of data_parallel
    # (6 ms, unscaled) by order alone; a plan without a prediction is left out.
    others = [whole("cpop", 0.012), replicated("data_parallel", 0.006), whole("unpriced", None)]
    ranked = rerank(others, whole("heft", 0.010), 0.005)
    assert names(ranked) == [("cpop", 0.006), ("data_parallel", 0.006)]


def test_nothing_left_is_an_empty_ranking():
    assert rerank([], whole("heft", 0.010), 0.02) == []


@pytest.mark.parametrize("seconds", [0.0, -1.0, math.nan, math.inf, True, "0.02"])
def test_a_measured_step_that_is_not_a_positive_number_is_one_clear_error(seconds):
    with pytest.raises(InvalidPlanError, match=r"measured_seconds must be a positive number .* Received: "
                                               r"measured_seconds="):
        rerank([whole("cpop", 0.01)], whole("heft", 0.010), seconds)


def test_a_measured_plan_without_a_prediction_is_one_clear_error():
    with pytest.raises(InvalidPlanError, match=r"positive predicted_step_time .* Received: predicted_step_time=None"):
        rerank([whole("cpop", 0.01)], whole("heft", None), 0.02)


def test_plans_are_of_one_kind_when_both_or_neither_replicate():
    assert same_kind(replicated("a", 1.0), replicated("b", 2.0))
    assert same_kind(whole("a", 1.0), whole("b", 2.0))
    assert not same_kind(whole("a", 1.0), replicated("b", 2.0))
