"""Known-answer tests of the simulator on devices that share compute; every timeline worked out by hand."""

import pytest

from kerasflow.planner import Cluster, DataParallel, Link, OpGraph, Plan, simulate, synthetic
from kerasflow.planner.ir.machine import SharedCompute
from kerasflow.planner.search.planning import candidate_plans
from kerasflow.planner.sim.eventloop import EventLoop
from kerasflow.planner.sim.sharedpools import shared_pools
from kerasflow.planner.sim.simulator import run_task_graph
from kerasflow.planner.sim.taskgraph import build_task_graph
from tests.planner.helpers import devices, op


def shared(count=2, threads=2, latency=0.0, bandwidth=100.0):
    """``count`` devices of kind X drawing on one pool of compute."""
    names = tuple(f"/D:{i}" for i in range(count))
    return Cluster(devices(count), default_link=Link(latency, bandwidth), shared=[SharedCompute(names, threads)])


def two_independent_ops():
    return OpGraph([op("a", 2.0), op("b", 1.0)], [])


def test_two_tasks_running_side_by_side_share_the_pool():
    # From 0 both run at half speed: b's 1 s of work ends at 2, when a has done 1 of its 2 s;
    # alone from 2, a ends at 3. Independent devices would end at 2.
    plan = Plan(placement={"a": "/D:0", "b": "/D:1"})
    result = simulate(two_independent_ops(), shared(), plan)
    assert result.times() == {"a": (0.0, 3.0), "b": (0.0, 2.0)}
    assert result.makespan == 3.0


def test_one_thread_runs_the_pool_one_task_at_a_time():
    # a (device 0 is filled first) 0-2 alone, then b 2-3.
    plan = Plan(placement={"a": "/D:0", "b": "/D:1"})
    result = simulate(two_independent_ops(), shared(threads=1), plan)
    assert result.times() == {"a": (0.0, 2.0), "b": (2.0, 3.0)}


def test_a_device_without_an_order_runs_several_tasks_at_once():
    # The default placement: both on /D:0, no order: they share the pool as on two devices.
    plan = Plan(placement={"a": "/D:0", "b": "/D:0"})
    assert simulate(two_independent_ops(), shared(), plan).times() == {"a": (0.0, 3.0), "b": (0.0, 2.0)}


def test_a_device_with_an_order_runs_one_task_at_a_time():
    # Order b, a on /D:0: b 0-1 alone, then a 1-3.
    plan = Plan(placement={"a": "/D:0", "b": "/D:0"}, order={"/D:0": ["b", "a"]})
    assert simulate(two_independent_ops(), shared(), plan).times() == {"a": (1.0, 3.0), "b": (0.0, 1.0)}


def test_a_task_joining_midway_slows_the_running_one():
    # a (2 s) on /D:0 -> c (1 s) on /D:1 after a 50-byte hop at 100 B/s (0.5 s); b (3 s) on /D:1
    # from 0. 0-4: a and b at half speed (a's 2 s done at 4; b has 1 s left). 4-4.5: b alone
    # (0.5 s left). From 4.5: b and c at half speed: b's 0.5 s ends at 5.5, when c has 0.5 s
    # left; alone, c ends at 6.
    graph = OpGraph([op("a", 2.0, [50]), op("b", 3.0), op("c", 1.0)], [("a", "c", 0)])
    plan = Plan(placement={"a": "/D:0", "b": "/D:1", "c": "/D:1"})
    result = simulate(graph, shared(), plan)
    assert result.times() == {"a": (0.0, 4.0), "b": (0.0, 5.5), "c": (4.5, 6.0)}


def test_replicas_sharing_compute_are_all_simulated():
    # Two replicas of a 2-op chain (1 s + 1 s per sample, batch 2: 1 s each on a replica's one
    # sample) and a free ring: the replicas share the pool, so the step takes all 4 s of work;
    # on independent devices the second replica mirrors the first and the step takes 2 s.
    graph = OpGraph([op("x", (0.0, 1.0), [0], batch_axis=0), op("y", (0.0, 1.0), batch_axis=0)],
                    [("x", "y", 0)], batch_size=2)
    plan = Plan(data_parallel=DataParallel(("/D:0", "/D:1")))
    assert simulate(graph, shared(), plan).makespan == pytest.approx(4.0)
    independent = Cluster(devices(2), default_link=Link(0.0, 100.0))
    assert simulate(graph, independent, plan).makespan == pytest.approx(2.0)


@pytest.mark.parametrize("preset", ["4xV100-nvlink", "cpu-testbed:4", "2x8xV100"])
def test_without_shared_compute_the_loop_gives_the_simulators_timeline(preset):
    cluster = Cluster.preset(preset)
    graph = synthetic.inception_like(blocks=2)
    plans, _ = candidate_plans(graph, cluster, verbose=0, max_split_evaluations=4)
    for name, plan in plans.items():
        tg = build_task_graph(graph, cluster, plan)
        start, end, transfers, _, _ = EventLoop(tg, cluster, shared_pools).run()
        expected = run_task_graph(tg, cluster, memory=False)
        assert (start, end) == (expected.task_start[:len(tg)], expected.task_end[:len(tg)]), name
        assert len(transfers) == len(expected.transfers), name


def test_shared_compute_is_checked_and_round_trips():
    cluster = Cluster.preset("logical-cpus:4")
    assert Cluster.from_dict(cluster.to_dict()).shared == cluster.shared
    assert cluster.shares_compute(["/CPU:0", "/CPU:3"]) and not Cluster.preset("cpu-testbed:4").shares_compute(
        ["/CPU:0", "/CPU:3"])
    with pytest.raises(Exception, match="two groups"):
        Cluster(devices(3), shared=[SharedCompute(("/D:0", "/D:1"), 1), SharedCompute(("/D:1", "/D:2"), 1)])
    with pytest.raises(Exception, match="not in the cluster"):
        Cluster(devices(2), shared=[SharedCompute(("/D:0", "/D:9"), 1)])
    with pytest.raises(Exception, match="two or more distinct"):
        SharedCompute(("/D:0",), 1)


def test_with_two_lanes_two_tasks_run_at_full_speed_and_a_third_slows_them():
    # Lanes 2: a (2 s), b (1 s), c (1 s) all on the pool from 0 run at 2/3 speed: b and c end at
    # 1.5, when a has 1 s left; alone, a ends at 2.5.
    graph = OpGraph([op("a", 2.0), op("b", 1.0), op("c", 1.0)], [])
    names = ("/D:0", "/D:1", "/D:2")
    cluster = Cluster(devices(3), shared=[SharedCompute(names, threads=3, lanes=2)])
    plan = Plan(placement={"a": "/D:0", "b": "/D:1", "c": "/D:2"})
    assert simulate(graph, cluster, plan).times() == {"a": (0.0, 2.5), "b": (0.0, 1.5), "c": (0.0, 1.5)}
    two = OpGraph([op("a", 2.0), op("b", 1.0)], [])
    assert simulate(two, cluster, Plan(placement={"a": "/D:0", "b": "/D:1"})).makespan == 2.0

