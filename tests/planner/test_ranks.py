"""Known-answer tests of the list-scheduling priorities."""

import pytest

from kerasflow.planner import OpGraph, Plan
from kerasflow.planner.schedule.ranks import (
    TaskCosts, average_link, critical_path, downward_ranks, topological_tasks, upward_ranks,
)
from kerasflow.planner.sim.taskgraph import build_task_graph
from tests.planner.helpers import cluster, op


def fork_join():
    # a -> b -> d and a -> c -> d; a sends 10 B, b 20 B, c nothing.
    graph = OpGraph([op("a", 1.0, [10]), op("b", 4.0, [20]), op("c", 4.0, [0]), op("d", 1.0)],
                    [("a", "b", 0), ("a", "c", 0), ("b", "d", 0), ("c", "d", 0)])
    c = cluster(2, latency=0.0, bandwidth=10.0)
    tg = build_task_graph(graph, c, Plan(placement={n: "/D:0" for n in "abcd"}))
    return graph, c, tg


def test_upward_and_downward_ranks_by_hand():
    graph, c, tg = fork_join()
    average = TaskCosts(tg, graph, c).average
    link = average_link(c)
    assert link == (0.0, 0.1)
    # rank_u: d = 1; c = 4 + 0 + 1 = 5; b = 4 + 2 + 1 = 7; a = 1 + max(1 + 7, 1 + 5) = 9.
    assert upward_ranks(tg, average, link) == pytest.approx([9.0, 7.0, 5.0, 1.0])
    # rank_d: a = 0; b = c = 0 + 1 + 1 = 2; d = max(2 + 4 + 2, 2 + 4 + 0) = 8.
    assert downward_ranks(tg, average, link) == pytest.approx([0.0, 2.0, 2.0, 8.0])


def test_critical_path_follows_the_largest_priority():
    graph, c, tg = fork_join()
    average = TaskCosts(tg, graph, c).average
    link = average_link(c)
    path = critical_path(tg, upward_ranks(tg, average, link), downward_ranks(tg, average, link))
    assert [tg.names[t] for t in path] == ["a", "b", "d"]


def test_average_costs_over_heterogeneous_devices():
    from kerasflow.planner import Cluster, Device, Link

    graph = OpGraph([op("a", 4.0)], [])
    c = Cluster([Device("/D:0", "X", 1, speed=1.0), Device("/D:1", "X", 1, speed=4.0)], Link(0, 1))
    tg = build_task_graph(graph, c, Plan(placement={"a": "/D:0"}))
    costs = TaskCosts(tg, graph, c)
    assert (costs.on(0, 0), costs.on(0, 1), costs.average[0]) == (4.0, 1.0, 2.5)
    assert TaskCosts(tg, graph, c, fixed=[1]).average[0] == 1.0


def test_topological_tasks():
    _, _, tg = fork_join()
    assert [tg.names[t] for t in topological_tasks(tg)] == ["a", "b", "c", "d"]
