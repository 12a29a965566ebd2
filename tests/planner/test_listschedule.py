"""Hand-computed tests of HEFT and CPOP: placement, order, memory limits, colocation."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kerasflow.planner import (
    Cluster, Device, InsufficientMemoryError, Link, Op, OpGraph, Shard, cpop, heft, simulate, synthetic,
)
from kerasflow.planner.schedule.listschedule import _Timelines, list_schedule, memory_budgets, scheduling_tasks
from tests.planner.helpers import cluster, op


def fork_join():
    # a (1 s) sends 10 B to b and c (4 s each), which join in d (1 s).
    return OpGraph([op("a", 1.0, [10]), op("b", 4.0, [10]), op("c", 4.0, [10]), op("d", 1.0)],
                   [("a", "b", 0), ("a", "c", 0), ("b", "d", 0), ("c", "d", 0)])


@pytest.mark.parametrize("scheduler", [heft, cpop])
def test_branches_spread_over_fast_links(scheduler):
    # 10 B at 1 GB/s is ~1e-8 s: b and c run side by side, about 6 s instead of 10.
    plan = scheduler(fork_join(), cluster(2, bandwidth=1e9))
    assert plan.placement["b"] != plan.placement["c"]
    assert plan.predicted_step_time == pytest.approx(6.0, abs=1e-6)


@pytest.mark.parametrize("scheduler", [heft, cpop])
def test_branches_stay_together_over_slow_links(scheduler):
    # 10 B at 1 B/s is 10 s: moving a branch costs more than it saves; all on one device.
    plan = scheduler(fork_join(), cluster(2, bandwidth=1.0))
    assert len(set(plan.placement.values())) == 1
    assert plan.predicted_step_time == 10.0


def test_heft_counts_the_cores_a_transfer_takes_on_the_device_it_goes_to():
    # a (1 s, D0) feeds c (2 s, ranked first: D0 1-3) and b (1 s); 300 B to the other host arrive
    # at 1 + 0.2 + 1.5 = 2.7. b on D0 ends at 4, on D1 at 3.7: there. If the receiving core
    # copies the transfer (0.2 s of gap and 1.5 s of bytes), b on D1 ends at 5.4: it stays on D0.
    graph = OpGraph([op("a", 1.0, [300]), op("b", 1.0), op("c", 2.0)], [("a", "b", 0), ("a", "c", 0)])

    def on_two_hosts(share):
        devices = [Device(f"/D:{i}", "X", 10**9, host=i, memory_bandwidth=1e30, launch_overhead=0.0) for i in range(2)]
        return Cluster(devices, Link(0.2, 200.0), message_gap=0.2, core_share=share)

    plan = heft(graph, on_two_hosts(0.0), memory_limit=None)
    assert plan.placement["b"] != plan.placement["a"] == plan.placement["c"]
    plan = heft(graph, on_two_hosts(1.0), memory_limit=None)
    assert set(plan.placement.values()) == {"/D:0"} and plan.predicted_step_time == 4.0


def test_cpop_puts_the_critical_path_on_the_fastest_device():
    c = Cluster([Device("/D:0", "X", 10**9, speed=1.0), Device("/D:1", "X", 10**9, speed=2.0)],
                Link(0.0, 1e9))
    plan = cpop(fork_join(), c)
    # The path a-b-d (b first on ties) goes to /D:1, which runs it twice as fast.
    assert plan.placement["a"] == plan.placement["b"] == plan.placement["d"] == "/D:1"


def test_insertion_fills_an_idle_gap():
    graph = OpGraph([op("long", 3.0, [1]), op("after", 1.0), op("side", 0.5)], [("long", "after", 0)])
    tg, _ = scheduling_tasks(graph, cluster(1), None, 1)
    # One device, priorities long > after > side: back to back, 0-3, 3-4, 4-4.5.
    schedule = list_schedule(tg, graph, cluster(1), [3.0, 2.0, 1.0])
    assert schedule.start == [0.0, 3.0, 4.0]
    # 'long' pinned to /D:1: its 1 B reaches /D:0 at 3 + 2 s latency + 0.01 s = 5.01, so
    # /D:0 idles until then; 'side', scheduled last, takes that gap instead of the end.
    schedule = list_schedule(tg, graph, cluster(2, latency=2.0), [3.0, 2.0, 1.0], fixed=[1, 0, 0])
    assert schedule.start[1] == pytest.approx(5.01)
    assert schedule.start[2] == 0.0
    assert schedule.sequence[0] == [2, 1]


def test_order_respects_dependencies_and_is_the_start_order():
    graph = synthetic.inception_like(blocks=2)
    c = Cluster.preset("4xV100-nvlink")
    for make in (heft, cpop):
        plan = make(graph, c)
        plan.validate(graph, c)  # raises if an order contradicts a dependency
        result = simulate(graph, c, plan)
        assert result.start_order() == {d: list(o) for d, o in plan.order.items()}
        assert plan.predicted_step_time == result.makespan


def test_colocation_groups_share_a_device():
    graph = synthetic.transformer_like(blocks=2)
    for make in (heft, cpop):
        plan = make(graph, Cluster.preset("8xH100-nvlink"))
        groups = {}
        for o in graph.ops:
            if o.colocation:
                groups.setdefault(o.colocation, set()).add(plan.placement[o.name])
        assert groups and all(len(devices) == 1 for devices in groups.values())


def test_weights_sit_where_they_are_used():
    # A variable and its read wait until the op using them is placed, then join it.
    graph = synthetic.chain_mlp(layers=3)
    plan = heft(graph, Cluster.preset("4xV100-nvlink"))
    for i in range(3):
        assert plan.placement[f"dense_{i}/kernel"] == plan.placement[f"dense_{i}/MatMul"]


def weighty_chain(layers=4, weights=400):
    ops, edges = [], []
    for i in range(layers):
        ops += [op(f"v{i}", 0.0, [], phase="other", persistent_bytes=weights, colocation=f"v{i}"),
                op(f"r{i}", 0.0, [40], colocation=f"v{i}"),
                op(f"m{i}", 1.0, [10], layer=f"L{i}")]
        edges += [(f"v{i}", f"r{i}", None), (f"r{i}", f"m{i}", 0)]
        if i:
            edges.append((f"m{i - 1}", f"m{i}", 0))
    return OpGraph(ops, edges)


def test_a_graph_too_big_for_one_device_is_spread_within_budget():
    # Four 400 B variables; each device has 1000 B, 900 B after the 10 % headroom: one
    # device cannot hold all four (1600 B), two can.
    graph = weighty_chain()
    c = cluster(2, memory=1000, bandwidth=1e6)
    budget = memory_budgets(c)[0]
    assert budget == 900.0
    for make in (heft, cpop):
        plan = make(graph, c)
        assert len(set(plan.placement.values())) == 2
        peaks = simulate(graph, c, plan).peak_memory
        assert all(peak <= budget for peak in peaks.values()), peaks


def test_an_op_that_fits_nowhere_raises_with_the_ways_out():
    graph = weighty_chain(layers=1, weights=5000)
    with pytest.raises(InsufficientMemoryError, match=r"No device can hold op '(v0|r0|m0)'.*Ways out: more devices"):
        heft(graph, cluster(2, memory=1000))


def test_memory_limit_caps_every_device():
    assert memory_budgets(cluster(2, memory=1000), memory_limit=500, headroom=0.0) == [500, 500]
    with pytest.raises(InsufficientMemoryError, match="headroom"):
        memory_budgets(cluster(1), headroom=1.5)


def test_plans_are_valid_for_every_family():
    for family in sorted(synthetic.FAMILIES):
        graph = synthetic.build(family)
        c = Cluster.preset("4xV100-pcie")
        for make in (heft, cpop):
            plan = make(graph, c, affinity="layer")
            plan.validate(graph, c)
            assert set(plan.placement) == {o.name for o in graph.ops}


def two_hosts_of_two(inter_bandwidth):
    # Hosts {D0, D1} and {D2, D3}: nearly free copies inside a host, inter_bandwidth between.
    devices = [Device(f"/D:{i}", "X", 10**9, memory_bandwidth=1e30, launch_overhead=0.0, host=i // 2)
               for i in range(4)]
    return Cluster.two_level(devices, Link(0.0, 1e12), Link(0.0, inter_bandwidth), name="2x2")


def chatty_fork():
    # p fans out to c1, c2, c3 (100 B each), which join in j; every op takes 1 s.
    ops = [op("p", 1.0, [100]), op("c1", 1.0, [100]), op("c2", 1.0, [100]), op("c3", 1.0, [100]), op("j", 1.0)]
    edges = [("p", c, 0) for c in ("c1", "c2", "c3")] + [(c, "j", 0) for c in ("c1", "c2", "c3")]
    return OpGraph(ops, edges)


def test_chatty_ops_stay_inside_a_host_when_the_network_is_slow():
    graph = chatty_fork()
    # Between hosts at 1 B/s a 100 B tensor takes 100 s: the third branch waits for a device of
    # p's host instead (p 0-1 s, two branches 1-2 s, the third 2-3 s, j 3-4 s).
    slow = heft(graph, two_hosts_of_two(1.0))
    assert {slow.placement[name] for name in slow.placement} <= {"/D:0", "/D:1"}
    assert slow.predicted_step_time == pytest.approx(4.0, abs=1e-6)
    # With a network as fast as the host's links, the third branch runs beside the others.
    fast = heft(graph, two_hosts_of_two(1e12))
    assert fast.predicted_step_time == pytest.approx(3.0, abs=1e-6)
    assert len(set(fast.placement[c] for c in ("c1", "c2", "c3"))) == 3


def test_on_two_hosts_data_parallelism_inside_one_host_is_a_candidate():
    from kerasflow.planner.search.planning import candidate_plans, strongest_host

    graph = synthetic.chain_mlp(layers=2, kinds=["V100"])
    two = Cluster.preset("2x8xV100")
    assert strongest_host(two) == two.hosts()[0]
    plans, _ = candidate_plans(graph, two, split=False, tick_tock="off", verbose=0)
    assert plans["data_parallel_one_host"].data_parallel.devices == tuple(two.hosts()[0])
    assert set(plans["data_parallel"].data_parallel.devices) == set(two.device_names)
    # one host: the candidate is not offered
    plans, _ = candidate_plans(graph, "8xV100-nvlink", split=False, tick_tock="off", verbose=0)
    assert "data_parallel_one_host" not in plans


def two_split_layers_with_updates():
    # x -> A -> B -> y, batch 8, no bytes moved (every copy is free). Each layer: a variable w,
    # its read, a batch op m (0.5 s per sample: 4 s whole, 2 s per half) and a 3 s update
    # colocated with w.
    ops, edges, previous = [op("x", 0.0, [0], phase="other")], [], "x"
    for layer in ("A", "B"):
        ops += [op(f"{layer}/w", 0.0, [0], layer=layer, phase="other", persistent_bytes=4, colocation=f"{layer}/w"),
                op(f"{layer}/read", 0.0, [0], layer=layer, colocation=f"{layer}/w"),
                op(f"{layer}/m", (0.0, 0.5), [0], layer=layer, batch_axis=0),
                op(f"{layer}/update", 3.0, [], layer=layer, phase="update", colocation=f"{layer}/w")]
        edges += [(f"{layer}/w", f"{layer}/read", 0), (previous, f"{layer}/m", 0),
                  (f"{layer}/read", f"{layer}/m", 0), (f"{layer}/m", f"{layer}/update", 0)]
        previous = f"{layer}/m"
    return OpGraph(ops + [op("y", 0.0)], edges + [(previous, "y", 0)], batch_size=8)


def test_split_layers_weights_are_homed_by_load_not_on_the_first_shard():
    graph, c = two_split_layers_with_updates(), cluster(2)
    halves = (Shard("/D:0", 0.5), Shard("/D:1", 0.5))
    chosen = heft(graph, c, splits={"A": halves, "B": halves})
    # A's group goes to /D:0 (both devices have no group work yet: the first); B's to /D:1,
    # where it adds 3 s of updates against /D:0's 3 s + 3 s. Timeline on each device: A's
    # half 0-2, B's half 2-4, then the layer's update homed there 4-7. With both groups on
    # the first shard's device the updates queue there: 4-7, 7-10.
    assert [chosen.placement[name] for name in ("A/w", "A/update", "B/w", "B/update")] == [
        "/D:0", "/D:0", "/D:1", "/D:1"]
    assert chosen.predicted_step_time == 7.0


def test_a_colocation_group_of_batch_ops_stays_together_when_another_layer_is_split():
    # Two 1 s string ops kept together on the host (one group) feed a dense layer split in
    # halves. Alone, each would take its own device (both ready at 0); together they share one.
    graph = OpGraph([op("s1", (0.0, 0.125), [(0, 1)], batch_axis=0, colocation="host/lookup"),
                     op("s2", (0.0, 0.125), [(0, 1)], batch_axis=0, colocation="host/lookup"),
                     op("m", (0.0, 0.125), [(0, 1)], layer="dense", batch_axis=0)],
                    [("s1", "m", 0), ("s2", "m", 0)], batch_size=8)
    chosen = heft(graph, cluster(2), splits={"dense": (Shard("/D:0", 0.5), Shard("/D:1", 0.5))})
    assert chosen.placement["s1"] == chosen.placement["s2"]


def test_cpop_keeps_the_critical_path_on_its_device_even_where_another_finishes_first():
    # Device kinds X (/D:0) and Y (/D:1). a, b, d cost 1, 10, 1 s on X and 2, 4, 2 s on Y; c 1 s
    # on both. With the average costs (a 1.5, b 7, c 1, d 1.5) the critical path is a-b-d, and it
    # runs in 12 s on /D:0 but 8 s on /D:1: CPOP puts all three on /D:1, although a alone would
    # finish first on /D:0 (1 s against 2 s), where earliest finish time (HEFT) puts it.
    costs = {"a": (1, 2), "b": (10, 4), "c": (1, 1), "d": (1, 2)}
    ops = [Op(name, cost={"X": x, "Y": y}, output_bytes=[10] if name != "d" else []) for name, (x, y) in
           costs.items()]
    graph = OpGraph(ops, [("a", "b", 0), ("a", "c", 0), ("b", "d", 0), ("c", "d", 0)])
    c = Cluster([Device("/D:0", "X", 10**9, memory_bandwidth=1e30, launch_overhead=0.0),
                 Device("/D:1", "Y", 10**9, memory_bandwidth=1e30, launch_overhead=0.0)], Link(0.0, 1e9))
    plan = cpop(graph, c)
    assert [plan.placement[n] for n in "abd"] == ["/D:1"] * 3
    assert heft(graph, c).placement["a"] == "/D:0"


def test_an_input_received_from_another_device_counts_in_the_memory_it_needs():
    # a (500 B out) and z (10 s) are pinned to /D:1; b (1 s) reads a. On /D:1 b waits for z until
    # 11 s, on /D:0 it could start at once, but receiving a's 500 B needs 500 B there and /D:0's
    # budget is 400 B: b runs on /D:1.
    graph = OpGraph([op("a", 1.0, [500]), op("z", 10.0), op("b", 1.0)], [("a", "b", 0)])
    c = cluster(2, bandwidth=1e9)
    tg, _ = scheduling_tasks(graph, c, None, 1)
    schedule = list_schedule(tg, graph, c, [3.0, 2.0, 1.0], fixed=[1, 1, -1], budgets=[400.0, 1e9])
    assert schedule.device[2] == 1 and schedule.start[2] == pytest.approx(11.0)
    roomy = list_schedule(tg, graph, c, [3.0, 2.0, 1.0], fixed=[1, 1, -1], budgets=[600.0, 1e9])
    assert roomy.device[2] == 0 and roomy.start[2] == pytest.approx(1.0, abs=1e-6)


class _TwoGapBlocks(_Timelines):
    BLOCK = 2  # blocks split and empty after a few tasks


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.integers(0, 6)), max_size=60))
def test_the_gap_blocks_find_the_slot_a_scan_of_every_gap_finds(tasks):
    # The reference: one sorted list of gaps (the last open-ended), scanned from the first
    # that ends at or after the task's ready time.
    starts, ends = [0.0], [float("inf")]
    timelines = _TwoGapBlocks(1)
    for t, (ready, duration) in enumerate(tasks):
        q = next(q for q in range(len(ends)) if ends[q] >= ready and max(starts[q], ready) + duration <= ends[q])
        begin = max(starts[q], float(ready))
        pieces = [(x, y) for x, y in ((starts[q], begin), (begin + duration, ends[q])) if y > x] if duration else [
            (starts[q], ends[q])]
        starts[q:q + 1], ends[q:q + 1] = [x for x, _ in pieces], [y for _, y in pieces]
        assert timelines.slot(0, ready, duration) == begin
        assert timelines.occupy(0, t, ready, duration) == begin
    assert [x for block in timelines.gap_starts[0] for x in block] == starts
    assert [y for block in timelines.gap_ends[0] for y in block] == ends


def test_a_task_takes_a_later_gap_exactly_its_length():
    timelines = _TwoGapBlocks(1)
    for k, ready in enumerate([1, 3, 5, 7, 9, 11, 14, 16, 18, 20, 22, 24]):
        timelines.occupy(0, k, ready, 1.0)
    # Gaps: [0, 1), [2, 3), ..., [10, 11) of 1 s, [12, 14) of 2 s, [15, 16), ... [23, 24), [25, inf),
    # in blocks of two to four: the 2 s gap is in neither the first nor the last block.
    blocks = timelines.gap_starts[0]
    assert not any(12.0 in block for block in (blocks[0], blocks[-1]))
    assert timelines.slot(0, 0, 2.0) == 12.0
    assert timelines.slot(0, 0, 2.5) == 25.0
