"""plan()'s own steps, on graphs small enough to work out by hand."""

from kerasflow.planner import OpGraph, Plan
from kerasflow.planner.baselines import with_prediction
from kerasflow.planner.planning import order_if_faster
from tests.planner.helpers import cluster, op


def two_chains(order):
    # a (1 s) on /D:0 feeds b (1 s) on /D:1 (0 B, free link); c (1.5 s) on /D:0 is independent.
    graph = OpGraph([op("a", 1.0, [0]), op("b", 1.0), op("c", 1.5)], [("a", "b", 0)])
    c = cluster(2)
    return graph, c, with_prediction(Plan(placement={"a": "/D:0", "b": "/D:1", "c": "/D:0"}, order=order), graph, c)


def test_an_order_that_stalls_a_device_is_dropped():
    # In the order c, a: c 0-1.5, a 1.5-2.5, b 2.5-3.5. Without it /D:0 takes the ready task
    # of highest upward rank first: a (1 + 1 = 2 s to the end) before c (1.5 s): a 0-1,
    # b 1-2 on /D:1, c 1-2.5.
    graph, c, ordered = two_chains({"/D:0": ["c", "a"]})
    assert ordered.predicted_step_time == 3.5
    chosen = order_if_faster(ordered, graph, c)
    assert chosen.predicted_step_time == 2.5 and not chosen.order


def test_an_order_as_fast_as_none_is_kept():
    graph, c, ordered = two_chains({"/D:0": ["a", "c"]})  # a 0-1, c 1-2.5, b 1-2: 2.5 either way
    assert order_if_faster(ordered, graph, c) is ordered


def test_an_unordered_plan_that_would_not_fit_is_not_taken():
    graph, c, ordered = two_chains({"/D:0": ["c", "a"]})
    assert order_if_faster(ordered, graph, c, fits=lambda p: bool(p.order)) is ordered
