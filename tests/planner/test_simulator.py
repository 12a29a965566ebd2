"""Known-answer and invariant tests of the step simulator; every figure computed by hand."""

import dataclasses
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kerasflow.planner import (
    Cluster, DataParallel, Device, Link, InvalidClusterError, InvalidGraphError, InvalidPlanError, OpGraph, Plan, Shard,
    Waves, lower_bound, simulate,
    synthetic,
)
from kerasflow.planner.ir.graphtables import weight_bound_layers
from kerasflow.planner.sim.simulator import run_task_graph
from kerasflow.planner.sim.taskgraph import TaskGraph, build_task_graph
from tests.planner.helpers import cluster, normalization, op, split_normalization


def fork_join():
    # a -> b, a -> c, (b, c) -> d; a sends 100 bytes, c sends 200 bytes.
    ops = [op("a", 1.0, [100]), op("b", 2.0, [0]), op("c", 3.0, [200]), op("d", 1.0)]
    edges = [("a", "b", 0), ("a", "c", 0), ("b", "d", 0), ("c", "d", 0)]
    return OpGraph(ops, edges)


def test_two_branches_on_two_devices_include_transfers():
    # Link: 0.5 s latency, 100 B/s. a 0-1 on D0; a->c 1-2.5; b 1-3 on D0; c 2.5-5.5 on D1;
    # c->d 5.5-8.0 (0.5 + 200/100); d 8-9.
    c = cluster(2, latency=0.5, bandwidth=100.0)
    plan = Plan(placement={"a": "/D:0", "b": "/D:0", "c": "/D:1", "d": "/D:0"})
    result = simulate(fork_join(), c, plan)
    times = result.times()
    assert times["a"] == (0.0, 1.0)
    assert times["b"] == (1.0, 3.0)
    assert times["c"] == (2.5, 5.5)
    assert times["d"] == (8.0, 9.0)
    assert result.makespan == 9.0
    assert result.link_bytes == {("/D:0", "/D:1"): 100.0, ("/D:1", "/D:0"): 200.0}
    assert result.busy == {"/D:0": 4.0, "/D:1": 3.0}
    assert result.utilization["/D:1"] == pytest.approx(3.0 / 9.0)


def test_everything_on_one_device_takes_the_total_work():
    graph = fork_join()
    result = simulate(graph, cluster(2), Plan(placement={o.name: "/D:1" for o in graph.ops}))
    assert result.makespan == 7.0 == graph.total_work("X")
    assert result.transfers == []


def test_a_chain_forced_across_devices_pays_each_hop():
    # Each hop moves 50 bytes at 100 B/s: 0.5 s. a 0-1, b 1.5-2.5, c 3-4.
    graph = OpGraph([op("a", 1.0, [50]), op("b", 1.0, [50]), op("c", 1.0)], [("a", "b", 0), ("b", "c", 0)])
    plan = Plan(placement={"a": "/D:0", "b": "/D:1", "c": "/D:0"})
    result = simulate(graph, cluster(2), plan)
    assert result.times() == {"a": (0.0, 1.0), "b": (1.5, 2.5), "c": (3.0, 4.0)}


def test_one_transfer_per_link_at_a_time_and_one_copy_per_destination():
    # a's two outputs (100 B each, 1 s each) queue on the one link: b gets its at 2, c at 3.
    two_outputs = OpGraph([op("a", 1.0, [100, 100]), op("b", 1.0), op("c", 1.0)],
                          [("a", "b", 0), ("a", "c", 1)])
    plan = Plan(placement={"a": "/D:0", "b": "/D:1", "c": "/D:1"})
    result = simulate(two_outputs, cluster(2), plan)
    assert result.times()["b"] == (2.0, 3.0)
    assert result.times()["c"] == (3.0, 4.0)
    assert result.link_bytes[("/D:0", "/D:1")] == 200.0
    # Both read output 0: one transfer serves both consumers on D1.
    shared = OpGraph(two_outputs.ops, [("a", "b", 0), ("a", "c", 0)])
    result = simulate(shared, cluster(2), plan)
    assert result.link_bytes[("/D:0", "/D:1")] == 100.0
    assert result.makespan == 4.0


def two_hosts(**figures):
    """Two devices of kind X on hosts 0 and 1, a link of 0.5 s latency and 100 B/s."""
    devices = [Device(f"/D:{i}", "X", 10**9, host=i, memory_bandwidth=1e30, launch_overhead=0.0) for i in range(2)]
    return Cluster(devices, default_link=Link(0.5, 100.0), name="two hosts", **figures)


def test_transfers_between_hosts_hold_their_link_only_for_the_message_gap_and_their_bytes():
    # a's two outputs (100 B each) go to D1. With its latency held, the second waits for the
    # first: b gets its at 2.5 (1 + 0.5 + 1), c at 4 (2.5 + 0.5 + 1). With a gap of 0.1 s, the
    # link is free at 1 + 0.1 + 1 = 2.1: c's starts then and arrives at 2.1 + 0.5 + 1 = 3.6.
    graph = OpGraph([op("a", 1.0, [100, 100]), op("b", 1.0), op("c", 1.0)], [("a", "b", 0), ("a", "c", 1)])
    plan = Plan(placement={"a": "/D:0", "b": "/D:1", "c": "/D:1"})
    assert simulate(graph, two_hosts(), plan).times() == {"a": (0.0, 1.0), "b": (2.5, 3.5), "c": (4.0, 5.0)}
    assert simulate(graph, two_hosts(message_gap=0.1), plan).times() == {
        "a": (0.0, 1.0), "b": (2.5, 3.5), "c": (3.6, 4.6)}
    # Within one host a transfer holds its link for its latency whatever the gap.
    one_host = Cluster([Device(f"/D:{i}", "X", 10**9, memory_bandwidth=1e30, launch_overhead=0.0) for i in range(2)],
                       default_link=Link(0.5, 100.0), message_gap=0.1)
    assert simulate(graph, one_host, plan).times()["c"] == (4.0, 5.0)


def test_a_step_that_runs_ops_on_another_host_pays_the_dispatch_once():
    graph = OpGraph([op("a", 1.0, [0]), op("b", 1.0)], [("a", "b", 0)])
    cluster = two_hosts(step_dispatch=0.25)
    assert simulate(graph, cluster, Plan(placement={"a": "/D:0", "b": "/D:0"})).makespan == 2.0
    # On D1 alone, or on both (1 + 0.5 latency + 1), the step pays 0.25 more.
    assert simulate(graph, cluster, Plan(placement={"a": "/D:1", "b": "/D:1"})).makespan == 2.25
    assert simulate(graph, cluster, Plan(placement={"a": "/D:0", "b": "/D:1"})).makespan == 2.75


def test_a_transfer_whose_cores_copy_it_keeps_both_devices_busy_for_their_share():
    # a (D0, 1 s) sends 100 B to b (D1): 0.5 s latency, 1 s of bytes, held 1.5 s; a share of 1
    # keeps each end busy 1.5 s. D0's next op x starts at 1 and ends 1.5 later than its 1 s: 3.5;
    # D1's y starts at 0, before the transfer, and z, started when y ends at 1, owes the 1.5 s:
    # 1-3.5; b then runs 3.5-4.5. A share of a half: 0.75 s each.
    graph = OpGraph([op("a", 1.0, [100]), op("b", 1.0), op("x", 1.0), op("y", 1.0), op("z", 1.0)],
                    [("a", "b", 0), ("a", "x", None), ("y", "z", None), ("z", "b", None)])
    plan = Plan(placement={"a": "/D:0", "x": "/D:0", "b": "/D:1", "y": "/D:1", "z": "/D:1"})
    assert simulate(graph, two_hosts(), plan).times() == {
        "a": (0.0, 1.0), "x": (1.0, 2.0), "y": (0.0, 1.0), "z": (1.0, 2.0), "b": (2.5, 3.5)}
    assert simulate(graph, two_hosts(core_share=1.0), plan).times() == {
        "a": (0.0, 1.0), "x": (1.0, 3.5), "y": (0.0, 1.0), "z": (1.0, 3.5), "b": (3.5, 4.5)}
    assert simulate(graph, two_hosts(core_share=0.5), plan).times()["z"] == (1.0, 2.75)


def test_the_machine_figures_of_tasks_round_trip_and_bad_ones_are_refused():
    cluster = two_hosts(step_dispatch=1e-3, message_gap=4e-5, core_share=0.5)
    again = Cluster.from_dict(json.loads(json.dumps(cluster.to_dict())))
    assert (again.step_dispatch, again.message_gap, again.core_share) == (1e-3, 4e-5, 0.5)
    assert "step_dispatch" not in two_hosts().to_dict()  # files of clusters without them read as before
    for figures, match in (({"step_dispatch": -1.0}, "step_dispatch"), ({"message_gap": "fast"}, "message_gap"),
                           ({"core_share": 1.5}, "core_share is a fraction")):
        with pytest.raises(InvalidClusterError, match=match):
            two_hosts(**figures)


def test_control_edges_move_no_bytes_but_pay_latency():
    graph = OpGraph([op("a", 1.0), op("b", 1.0)], [("a", "b", None)])
    result = simulate(graph, cluster(2, latency=0.25), Plan(placement={"a": "/D:0", "b": "/D:1"}))
    assert result.times()["b"] == (1.25, 2.25)
    assert result.link_bytes[("/D:0", "/D:1")] == 0.0


def test_the_plans_order_is_followed():
    graph = OpGraph([op("x", 1.0), op("y", 2.0)], [])
    placement = {"x": "/D:0", "y": "/D:0"}
    by_priority = simulate(graph, cluster(1), Plan(placement=placement))
    assert by_priority.times() == {"x": (0.0, 1.0), "y": (1.0, 3.0)}
    ordered = simulate(graph, cluster(1), Plan(placement=placement, order={"/D:0": ["y", "x"]}))
    assert ordered.times() == {"y": (0.0, 2.0), "x": (2.0, 3.0)}
    assert ordered.start_order() == {"/D:0": ["y", "x"]}


def test_an_ordered_device_waits_for_its_next_task_even_if_another_is_ready():
    # D0 must run b (waiting on a from D1, ready at 2) before c (ready at 0).
    graph = OpGraph([op("a", 1.0, [100]), op("b", 1.0), op("c", 1.0)], [("a", "b", 0)])
    plan = Plan(placement={"a": "/D:1", "b": "/D:0", "c": "/D:0"}, order={"/D:0": ["b", "c"]})
    assert simulate(graph, cluster(2), plan).times()["c"] == (3.0, 4.0)


def test_an_order_against_a_dependency_is_refused():
    graph = OpGraph([op("a", 1.0, [1]), op("b", 1.0)], [("a", "b", 0)])
    plan = Plan(placement={"a": "/D:0", "b": "/D:0"}, order={"/D:0": ["b", "a"]})
    with pytest.raises(InvalidPlanError, match="'b' too early: it depends on 'a'"):
        simulate(graph, cluster(1), plan)


def test_an_order_deadlocking_through_another_device_is_refused():
    # D0 runs b before a, but b needs c on D1, which needs a.
    graph = OpGraph([op("a", 1.0, [1]), op("c", 1.0, [1]), op("b", 1.0)], [("a", "c", 0), ("c", "b", 0)])
    plan = Plan(placement={"a": "/D:0", "b": "/D:0", "c": "/D:1"}, order={"/D:0": ["b", "a"]})
    with pytest.raises(InvalidPlanError, match="too early"):
        simulate(graph, cluster(2), plan)


def test_memory_peak_counts_weights_outputs_and_temp():
    # v owns 100 B of weights; a 0-1 makes 10 B (freed when b ends at 2); b 1-2 makes 20 B
    # (freed when c ends at 3) with 5 B temp. During [1, 2): 100 + 10 + 20 + 5 = 135.
    graph = OpGraph([op("v", 0.0, persistent_bytes=100), op("a", 1.0, [10]), op("b", 1.0, [20], temp_bytes=5),
                     op("c", 1.0)], [("v", "a", None), ("a", "b", 0), ("b", "c", 0)])
    result = simulate(graph, cluster(1), Plan(placement={o.name: "/D:0" for o in graph.ops}))
    assert result.peak_memory == {"/D:0": 135.0}
    times, level = result.memory_timeline["/D:0"]
    assert dict(zip(times, level)) == {0.0: 110.0, 1.0: 135.0, 2.0: 120.0, 3.0: 100.0}


def test_a_received_copy_lives_on_the_receiver_until_its_consumer_ends():
    # a (D0, 0-1) sends 50 B (1.5-... at 100 B/s: 1-1.5) to b on D1 (1.5-3.5).
    graph = OpGraph([op("a", 1.0, [50]), op("b", 2.0)], [("a", "b", 0)])
    result = simulate(graph, cluster(2), Plan(placement={"a": "/D:0", "b": "/D:1"}))
    assert result.peak_memory == {"/D:0": 50.0, "/D:1": 50.0}
    times, level = result.memory_timeline["/D:1"]
    assert dict(zip(times, level)) == {1.0: 50.0, 3.5: 0.0}
    times, level = result.memory_timeline["/D:0"]
    assert dict(zip(times, level)) == {0.0: 50.0, 1.5: 0.0}  # held until the send ends


def split_graph():
    # x feeds 4 B/sample; m (layer L) costs 1 s/sample and makes 4 B/sample; y consumes it.
    return OpGraph([op("x", 0.0, [(0, 4)], phase="other"),
                    op("m", (0.0, 1.0), [(0, 4)], layer="L", batch_axis=0),
                    op("y", 0.0)], [("x", "m", 0), ("m", "y", 0)], batch_size=2)


def test_a_split_layer_runs_as_shards_with_split_and_concat():
    # Batch 2 over two shards of 1 sample: m@s0 0-1 on D0; D1 gets its 4 B slice in 0.1 s
    # (40 B/s) and runs m@s1 0.1-1.1; its 4 B come back 1.1-1.2; concat, then y at 1.2.
    c = cluster(2, bandwidth=40.0)
    plan = Plan(placement={"x": "/D:0", "m": "/D:0", "y": "/D:0"},
                splits={"L": [Shard("/D:0", 0.5), Shard("/D:1", 0.5)]})
    result = simulate(split_graph(), c, plan)
    times = result.times()
    assert times["m@s0"] == pytest.approx((0.0, 1.0))
    assert times["m@s1"] == pytest.approx((0.1, 1.1))
    assert result.makespan == pytest.approx(1.2)
    roles = dict(zip(result.task_names, result.task_role))
    assert sorted(r for r in roles.values() if r != "op") == ["concat", "split"]
    unsplit = simulate(split_graph(), c, Plan(placement={"x": "/D:0", "m": "/D:0", "y": "/D:0"}))
    assert unsplit.makespan == 2.0


def test_split_and_concat_copies_cost_device_memory_time():
    # With 8 B/s local copies and no launch cost: the split reads 8 B and writes 8 B (2 s),
    # the concat likewise (2 s).
    c = cluster(2, bandwidth=40.0, memory_bandwidth=8.0)
    plan = Plan(placement={"x": "/D:0", "m": "/D:0", "y": "/D:0"},
                splits={"L": [Shard("/D:0", 0.5), Shard("/D:1", 0.5)]})
    result = simulate(split_graph(), c, plan)
    times = result.times()
    assert times["x:0@split"] == (0.0, 2.0)
    assert times["m@s0"] == (2.0, 3.0)
    assert result.makespan == pytest.approx(3.2 + 2.0)


def weights_graph():
    # A weight read w (fixed 8 B) feeds the split layer L's backward op m, whose weight gradient
    # (fixed 8 B) the update u takes; x is the batch (4 B per sample).
    return OpGraph([
        op("v", 0.0, [8], phase="other", persistent_bytes=24, colocation="v"),
        op("w", 0.0, [8], colocation="v"),
        op("x", 0.0, [(0, 4)], phase="other"),
        op("m", (0.0, 1.0), [8], layer="L", batch_axis=0, phase="backward"),
        op("u", 1.0, [], phase="update", colocation="v"),
    ], [("v", "w", 0), ("w", "m", 0), ("x", "m", 0), ("m", "u", 0), ("v", "u", None)], batch_size=2)


def halves_of_l(**fields):
    return Plan(placement={n: "/D:0" for n in "vwxmu"}, splits={"L": [Shard("/D:0", 0.5), Shard("/D:1", 0.5)]},
                **fields)


def test_weights_are_copied_to_every_shard_and_gradients_summed():
    # Each shard of m gets w; each shard's gradient is summed on the update's device.
    result = simulate(weights_graph(), cluster(2, bandwidth=8.0), halves_of_l())
    times = result.times()
    # D1: weights (1 s) then its 4 B slice (0.5 s) on the same link: m@s1 1.5-2.5; its
    # gradient back 2.5-3.5; sum at 3.5; u 3.5-4.5.
    assert times["m@s1"] == pytest.approx((1.5, 2.5))
    assert times["u"] == pytest.approx((3.5, 4.5))
    assert any(role == "sum" for role in result.task_role)
    assert result.link_bytes == {("/D:0", "/D:1"): 12.0, ("/D:1", "/D:0"): 8.0}


def test_each_wave_sends_a_split_layers_weights_again():
    # The same as two waves of one sample: each wave runs the model's call again and so reads w
    # again, and D1's shard of each wave receives its 8 B (the runtime's reads, one per wave);
    # each wave's split of x sends D1 its 2 B (half a sample); both waves' gradients (8 B each)
    # come back to one sum. Before, one copy of w served both waves: 12 B, not 20.
    result = simulate(weights_graph(), cluster(2, bandwidth=8.0), halves_of_l(waves=Waves(2)))
    weights = [(t.dst, t.bytes) for t in result.transfers if t.task == "w"]
    assert weights == [("/D:1", 8.0), ("/D:1", 8.0)]
    assert result.link_bytes == {("/D:0", "/D:1"): 20.0, ("/D:1", "/D:0"): 16.0}


def recurrent_graph(loop_type="While"):
    # A variable v (24 B) whose handle (0 B) goes into the recurrent layer's time loop, which
    # reads the weights inside and runs 1 s per sample on its input x (4 B per sample).
    return OpGraph([
        op("v", 0.0, [0], phase="other", persistent_bytes=24, colocation="v"),
        op("x", 0.0, [(0, 4)], phase="other"),
        op("loop", (0.0, 1.0), [(0, 4)], type=loop_type, layer="L", batch_axis=0, colocation="v"),
        op("y", 0.0, []),
    ], [("v", "loop", 0), ("x", "loop", 0), ("loop", "y", 0)], batch_size=2)


def test_a_split_loop_that_reads_its_weights_gets_them_on_each_shards_device():
    # The loop is copied per shard; D1's copy receives the 24 B of weights (3 s at 8 B/s), then
    # its 4 B slice (0.5 s): loop@s1 3.5-4.5; its 4 B back 4.5-5.0; concat; y at 5.0.
    c = cluster(2, bandwidth=8.0)
    plan = Plan(placement={n: "/D:0" for n in ("v", "x", "loop", "y")},
                splits={"L": [Shard("/D:0", 0.5), Shard("/D:1", 0.5)]})
    result = simulate(recurrent_graph(), c, plan)
    times = result.times()
    assert times["loop@s0"] == pytest.approx((0.0, 1.0))
    assert times["loop@s1"] == pytest.approx((3.5, 4.5))
    assert result.makespan == pytest.approx(5.0)
    assert result.link_bytes == {("/D:0", "/D:1"): 28.0, ("/D:1", "/D:0"): 4.0}
    assert weight_bound_layers(recurrent_graph()) == {"L"}
    assert weight_bound_layers(recurrent_graph("ResourceGather")) == set()


def test_an_op_on_a_variable_that_is_no_loop_runs_once_where_the_variable_lives():
    # A gather from the variable (no loop) is not copied: it runs whole on D0 (2 s) and only
    # the layer's other ops would be split; nothing crosses.
    c = cluster(2, bandwidth=8.0)
    plan = Plan(placement={n: "/D:0" for n in ("v", "x", "loop", "y")},
                splits={"L": [Shard("/D:0", 0.5), Shard("/D:1", 0.5)]})
    result = simulate(recurrent_graph("ResourceGather"), c, plan)
    assert result.times()["loop"] == pytest.approx((0.0, 2.0))
    assert result.link_bytes == {}


def test_a_chain_folded_into_a_constant_sends_only_its_last_value():
    # one (Const) -> tiled -> expanded: TensorFlow folds the chain into one constant where
    # "expanded" is placed (D0), so nothing passes from "tiled" (D1); its 8 B still go to
    # "scaled" on D1, which also reads the batch x (not a constant).
    graph = OpGraph([
        op("one", 0.0, [4], type="Const"), op("x", 0.0, [8], type="Placeholder"),
        op("tiled", 0.0, [8], type="Tile"), op("expanded", 0.0, [8], type="ExpandDims"),
        op("scaled", 1.0, [8], type="Mul"),
    ], [("one", "tiled", 0), ("tiled", "expanded", 0), ("expanded", "scaled", 0), ("x", "scaled", 0)])
    plan = Plan(placement={"one": "/D:1", "x": "/D:1", "tiled": "/D:1", "expanded": "/D:0", "scaled": "/D:1"})
    result = simulate(graph, cluster(2, bandwidth=8.0), plan)
    assert {pair: sent for pair, sent in result.link_bytes.items() if sent} == {("/D:0", "/D:1"): 8.0}
    assert result.makespan == pytest.approx(2.0)  # 8 B at 8 B/s, then scaled's 1 s


def test_waves_run_as_micro_batches_with_the_forward_offset():
    # f (forward) and b (backward) cost 1 s/sample; batch 2 as two waves of 1 sample.
    # Wave 1's forward waits for wave 0's forward; the earlier wave goes first when both
    # are ready: f@w0 0-1, b@w0 1-2 (ahead of f@w1), f@w1 2-3, b@w1 3-4, then one update.
    graph = OpGraph([op("f", (0.0, 1.0), [(0, 4)], batch_axis=0), op("b", (0.0, 1.0), [4], phase="backward", batch_axis=0),
                     op("u", 1.0, [], phase="update")], [("f", "b", 0), ("b", "u", 0)], batch_size=2)
    plan = Plan(placement={"f": "/D:0", "b": "/D:0", "u": "/D:0"}, waves=Waves(2))
    result = simulate(graph, cluster(1), plan)
    times = result.times()
    assert times["f@w0"] == (0.0, 1.0)
    assert times["b@w0"] == (1.0, 2.0)
    assert times["f@w1"] == (2.0, 3.0)
    assert times["b@w1"] == (3.0, 4.0)
    assert times["u"] == (4.0, 5.0)
    assert result.makespan == graph.total_work("X") == 5.0


def test_a_pipeline_runs_every_forward_before_the_backward():
    graph = OpGraph([op("f", (0.0, 1.0), [(0, 4)], batch_axis=0), op("b", (0.0, 1.0), [4], phase="backward", batch_axis=0),
                     op("u", 1.0, [], phase="update")], [("f", "b", 0), ("b", "u", 0)], batch_size=2)
    plan = Plan(placement={"f": "/D:0", "b": "/D:0", "u": "/D:0"}, waves=Waves(2, offset="none"))
    times = simulate(graph, cluster(1), plan).times()
    assert [times[n][0] for n in ("f@w0", "f@w1", "b@w0", "b@w1")] == [0.0, 1.0, 2.0, 3.0]


def test_tock_wave_runs_on_the_mapped_devices():
    graph = OpGraph([op("f", (0.0, 1.0), [(0, 4)], batch_axis=0), op("g", (0.0, 1.0), [], batch_axis=0)],
                    [("f", "g", 0)], batch_size=2)
    swap = {"/D:0": "/D:1", "/D:1": "/D:0"}
    plan = Plan(placement={"f": "/D:0", "g": "/D:1"}, waves=Waves(2, stage_maps=({}, swap)))
    devices = simulate(graph, cluster(2), plan).device_of()
    assert devices["f@w0"] == "/D:0" and devices["f@w1"] == "/D:1"
    assert devices["g@w0"] == "/D:1" and devices["g@w1"] == "/D:0"


def test_data_parallel_ring_allreduce_takes_its_formula():
    # Per replica (batch 1): m 0-1, g 1-2; ring all-reduce of 400 B over 2 devices at
    # 100 B/s: 2(D-1)(G/(D*bw)) = 2 * 1 * 2 = 4 s, 2-6; u 6-7 on each replica.
    graph = OpGraph([
        op("v", 0.0, [400], phase="other", persistent_bytes=400, colocation="v"),
        op("r", 0.0, [400], colocation="v"),
        op("m", (0.0, 1.0), [(0, 4)], batch_axis=0),
        op("g", (0.0, 1.0), [400], phase="backward", batch_axis=0),
        op("u", 1.0, [], phase="update", colocation="v"),
    ], [("v", "r", 0), ("r", "m", 0), ("m", "g", 0), ("g", "u", 0), ("v", "u", None)], batch_size=2)
    plan = Plan(data_parallel=DataParallel(("/D:0", "/D:1")))
    result = simulate(graph, cluster(2), plan)
    times = result.times()
    assert times["g:0@allreduce"] == (2.0, 6.0)
    assert times["u@r0"] == times["u@r1"] == (6.0, 7.0)
    assert result.makespan == 7.0
    # Weights are replicated: both devices hold v's 400 B.
    assert all(peak >= 400 for peak in result.peak_memory.values())


def input_into_a_gradient(batch=4):
    """A batch input "x" (8 B a sample) read by "m" (1 s a sample), whose gradient "g" (0.5 s a
    sample, 400 B) updates the weight "v" in "u" (1 s)."""
    return OpGraph([
        op("x", 0.0, [(0, 8)], type="Placeholder", phase="other"),  # as profiles record inputs
        op("v", 0.0, [400], phase="other", persistent_bytes=400, colocation="v"),
        op("m", (0.0, 1.0), [(0, 4)], batch_axis=0),
        op("g", (0.0, 0.5), [400], phase="backward", batch_axis=0),
        op("u", 1.0, [], phase="update", colocation="v"),
    ], [("x", "m", 0), ("m", "g", 0), ("g", "u", 0), ("v", "u", None)], batch_size=batch)


def test_each_replica_receives_its_rows_from_the_device_holding_the_batch():
    # D:1 runs twice as fast, so the replicas are not mirrored. Replica 0 holds the batch on
    # D:0: m 0-2, g 2-3. Replica 1's 2 rows (16 B) leave D:0 at 0 and arrive at 0.16 (100 B/s);
    # m 0.16-1.16, g 1.16-1.66 on D:1. The all-reduce of 400 B waits for both: 2(D-1)(400/(2*100))
    # = 4 s, 3-7; u 7-8 on D:0, 7-7.5 on D:1.
    devices = [Device("/D:0", "X", 10**9, memory_bandwidth=1e30, launch_overhead=0.0),
               Device("/D:1", "X", 10**9, speed=2.0, memory_bandwidth=1e30, launch_overhead=0.0)]
    result = simulate(input_into_a_gradient(), Cluster(devices, default_link=Link(0.0, 100.0)),
                      Plan(data_parallel=DataParallel(("/D:0", "/D:1"))))
    times = result.times()
    assert times["m@r0"] == (0.0, 2.0) and times["m@r1"] == pytest.approx((0.16, 1.16))
    assert times["g:0@allreduce"] == (3.0, 7.0) and result.makespan == 8.0
    assert [(t.task, t.src, t.dst, t.bytes) for t in result.transfers] == [("x@r1", "/D:0", "/D:1", 16.0)]
    # As two waves, replica 1 still receives its 2 rows at once and cuts them into its waves.
    waved = simulate(input_into_a_gradient(), Cluster(devices, default_link=Link(0.0, 100.0)),
                     Plan(data_parallel=DataParallel(("/D:0", "/D:1")), waves=Waves(2)))
    assert [(t.task, t.src, t.dst, t.bytes) for t in waved.transfers] == [("x@r1", "/D:0", "/D:1", 16.0)]


def test_the_replica_simulated_for_identical_devices_receives_its_rows():
    # Identical independent devices: replica 0 is simulated and mirrored, and it stands for
    # the replicas that receive their rows: x@r0 is sent from D:1 (0-0.16); m 0.16-2.16,
    # g 2.16-3.16, the all-reduce 3.16-7.16, u 7.16-8.16.
    result = simulate(input_into_a_gradient(), cluster(2), Plan(data_parallel=DataParallel(("/D:0", "/D:1"))))
    assert result.times()["g:0@allreduce"] == pytest.approx((3.16, 7.16))
    assert result.makespan == pytest.approx(8.16)
    assert [(t.task, t.src, t.dst, t.bytes) for t in result.transfers] == [("x@r0", "/D:1", "/D:0", 16.0)]


def test_data_parallel_buffers_are_copied_in_and_out_on_each_replica():
    # As above, with two gradients g (400 B) and h (200 B) fused into one 600 B buffer and
    # local copies at 1,200 B/s (no launch cost). Per replica: m 0-1, g 1-2, h 2-3; into the
    # buffer, a concat reading and writing 600 B: 1 s, 3-4; the collective, 2(D-1)(600/(2*100))
    # = 6 s, 4-10; out of it, a cut into g and h, 10-11; the updates u and w, 11-12 and 12-13.
    graph = OpGraph([
        op("v", 0.0, [400], phase="other", persistent_bytes=400, colocation="v"),
        op("r", 0.0, [400], colocation="v"),
        op("m", (0.0, 1.0), [(0, 4)], batch_axis=0),
        op("g", (0.0, 1.0), [400], phase="backward", batch_axis=0),
        op("h", (0.0, 1.0), [200], phase="backward", batch_axis=0),
        op("u", 1.0, [], phase="update", colocation="v"),
        op("w", 1.0, [], phase="update", colocation="v"),
    ], [("v", "r", 0), ("r", "m", 0), ("m", "g", 0), ("g", "h", None), ("g", "u", 0), ("h", "w", 0),
        ("v", "u", None), ("v", "w", None)], batch_size=2)
    plan = Plan(data_parallel=DataParallel(("/D:0", "/D:1")))
    result = simulate(graph, cluster(2, memory_bandwidth=1200.0), plan)
    times = result.times()
    assert times["g:0@concat@r0"] == times["g:0@concat@r1"] == (3.0, 4.0)
    assert times["g:0@allreduce"] == (4.0, 10.0)
    assert times["g:0@split@r0"] == times["g:0@split@r1"] == (10.0, 11.0)
    assert result.makespan == 13.0
    # A buffer of one gradient is the gradient itself (reshaped): no copy, the collective at 2 s.
    single = OpGraph([o for o in graph.ops if o.name not in ("h", "w")],
                     [e for e in graph.edges if "h" not in (e.src, e.dst) and "w" not in (e.src, e.dst)],
                     batch_size=2)
    times = simulate(single, cluster(2, memory_bandwidth=1200.0), plan).times()
    assert times["g:0@concat@r0"] == (2.0, 2.0) and times["g:0@allreduce"] == (2.0, 6.0)


def test_chrome_trace_has_a_row_per_device_and_link():
    c = cluster(2, latency=0.5)
    plan = Plan(placement={"a": "/D:0", "b": "/D:0", "c": "/D:1", "d": "/D:0"})
    trace = simulate(fork_join(), c, plan).to_chrome_trace()
    json.dumps(trace)
    rows = {e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "thread_name"}
    assert {"/D:0", "/D:1", "/D:0 -> /D:1", "/D:1 -> /D:0"} <= rows
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(spans) == 4 + 2 and all(e["dur"] >= 0 for e in spans)


def test_the_simulator_is_deterministic():
    graph = synthetic.random_layered(400, seed=3)
    c = Cluster.preset("4xV100-pcie")
    names = c.device_names
    plan = Plan(placement={o.name: names[hash(o.colocation or o.name) % 4] for o in graph.ops})
    first, second = simulate(graph, c, plan), simulate(graph, c, plan)
    assert first.task_start == second.task_start and first.peak_memory == second.peak_memory


# ---------------------------------------------------------------------- invariants

@st.composite
def random_cases(draw):
    seed = draw(st.integers(0, 10_000))
    graph = synthetic.random_layered(draw(st.integers(30, 160)), width=draw(st.integers(1, 4)), seed=seed,
                                     kinds=["V100"], batch_size=draw(st.sampled_from([4, 16, 64])))
    count = draw(st.integers(1, 4))
    c = Cluster.preset("4xV100-pcie").subset([f"/GPU:{i}" for i in range(count)])
    names = c.device_names
    groups = {}
    placement = {}
    for o in graph.ops:
        key = o.colocation or o.name
        if key not in groups:
            groups[key] = names[draw(st.integers(0, count - 1))]
        placement[o.name] = groups[key]
    mode = draw(st.sampled_from(["placement", "split", "waves", "dp"]))
    if mode == "dp":
        return graph, c, Plan(data_parallel=DataParallel(tuple(names)))
    splits, waves = {}, None
    if mode == "split" and count > 1:
        layers = list(graph.layers())
        for layer in draw(st.lists(st.sampled_from(layers), max_size=3, unique=True)):
            splits[layer] = [Shard(names[0], 0.5), Shard(names[-1], 0.5)]
    if mode == "waves":
        waves = Waves(2, offset=draw(st.sampled_from(["forward", "none"])))
    return graph, c, Plan(placement=placement, splits=splits, waves=waves)


@settings(max_examples=40, deadline=None)
@given(random_cases())
def test_invariants_hold_for_random_plans(case):
    graph, c, plan = case
    result = simulate(graph, c, plan)
    tg = build_task_graph(graph, c, plan)
    start, end = result.task_start, result.task_end
    # Each task runs once, for its duration, after all its inputs have finished.
    assert len(set(result.task_names)) == len(result.task_names)
    for t in range(len(tg)):
        assert end[t] == pytest.approx(start[t] + tg.duration[t])
        for _, _, consumers in tg.outputs[t]:
            for consumer in consumers:
                assert start[consumer] >= end[t] - 1e-12
    # One task at a time per device.
    per_device = {}
    for t, device in enumerate(result.task_device):
        if device:
            per_device.setdefault(device, []).append((start[t], end[t]))
    for spans in per_device.values():
        spans.sort()
        for (_, e1), (s2, _) in zip(spans, spans[1:]):
            assert s2 >= e1 - 1e-12
    # No plan beats the lower bound; memory never goes negative.
    assert result.makespan >= lower_bound(graph, c).seconds * (1 - 1e-9)
    for times, level in result.memory_timeline.values():
        assert min(level) >= 0.0
    assert all(peak >= 0 for peak in result.peak_memory.values())


@settings(max_examples=25, deadline=None)
@given(st.integers(20, 200), st.integers(0, 1000), st.sampled_from([0.5, 1.0, 2.0]))
def test_one_device_takes_total_work_over_speed(num_ops, seed, speed):
    from kerasflow.planner import Device, Link

    graph = synthetic.random_layered(num_ops, seed=seed, kinds=["V100"])
    c = Cluster([Device("/GPU:0", "V100", 2**34, speed=speed)], Link(0, 1e9))
    result = simulate(graph, c, Plan(placement={o.name: "/GPU:0" for o in graph.ops}))
    assert result.makespan == pytest.approx(graph.total_work("V100") / speed, rel=1e-9)


def test_replicas_sum_the_whole_batchs_statistics_around_the_ring():
    # Per replica (batch 1): m 0-1, mean 1-2; the ring sums the 40 B statistic over 2 devices
    # at 100 B/s: 2(D-1)(40/(D*bw)) = 0.4 s, 2-2.4; norm 2.4-3.4; g 3.4-4.4 and its ring
    # 4.4-4.8; dx 4.8-5.8. The moving average takes the summed statistic as it is (at 2.4).
    plan = Plan(data_parallel=DataParallel(("/D:0", "/D:1")))
    result = simulate(normalization(), cluster(2), plan)
    times = result.times()
    assert times["mean:0@allreduce"] == pytest.approx((2.0, 2.4))
    assert times["g:0@allreduce"] == pytest.approx((4.4, 4.8))
    assert result.makespan == pytest.approx(5.8)
    # Each statistic and its gradient: one collective of 10 floats over both devices.
    assert [(c.task, c.devices, c.bytes) for c in result.collectives] == [
        (name, ("/D:0", "/D:1"), 40.0) for name in ("mean:0@allreduce", "g:0@allreduce")]


def test_replicas_with_their_own_statistics_send_none_of_them():
    # As above without the rings: m 0-1, mean 1-2, norm 2-3, g 3-4, dx 4-5; the moving average
    # keeps the replica's own statistic, so nothing crosses.
    own = Plan(data_parallel=DataParallel(("/D:0", "/D:1"), synchronized=False))
    result = simulate(normalization(), cluster(2), own)
    assert result.makespan == pytest.approx(5.0) and result.collectives == []
    # Two waves' statistics are each wave's own, synchronized or not.
    waved = Plan(data_parallel=DataParallel(("/D:0", "/D:1")), waves=Waves(2))
    assert not waved.synchronizes_statistics
    assert simulate(normalization(), cluster(2), waved).collectives == []


def test_a_split_layers_shards_sum_their_statistics_on_the_first_shard():
    # At 100 B/s: m 0-2 on D:0; the second shard's row (4 B) reaches D:1 at 2.04. mean@s0 2-3,
    # mean@s1 2.04-3.04; its 40 B reach D:0 at 3.44, where the sum runs, and the total is back on
    # D:1 at 3.84. norm@s0 3.44-4.44, norm@s1 3.84-4.84; g@s0 4.44-5.44, g@s1 4.84-5.84, summed on
    # D:0 at 6.24 and back at 6.64; dx@s0 6.24-7.24, dx@s1 6.64-7.64. One shard updates the
    # moving average: there is one statistic. Each shard sends its part of the weight's gradient
    # (dscale, free, on D:1 at 5.84, after g, which comes first in the graph) to the update.
    graph, plan = split_normalization()
    result = simulate(graph, cluster(2), plan)
    times = result.times()
    assert times["mean:0@sum@w0@/D:0"] == pytest.approx((3.44, 3.44))
    assert times["norm@s1"] == pytest.approx((3.84, 4.84))
    assert times["g:0@sum@w0@/D:0"] == pytest.approx((6.24, 6.24))
    assert times["dx@s1"] == pytest.approx((6.64, 7.64))
    assert result.makespan == pytest.approx(7.64)
    assert "decay@s0" in times and "decay@s1" not in times
    assert times["dscale@s1"] == pytest.approx((5.84, 5.84))
    # Sent: the second shard's row; each statistic's part (mean, g) to D:0 and its total back;
    # the second shard's part of the weight's gradient.
    assert sorted((t.src, t.dst, t.bytes) for t in result.transfers if t.src != t.dst) == [
        ("/D:0", "/D:1", 4.0), ("/D:0", "/D:1", 40.0), ("/D:0", "/D:1", 40.0),
        ("/D:1", "/D:0", 40.0), ("/D:1", "/D:0", 40.0), ("/D:1", "/D:0", 40.0)]


def test_a_layer_the_profile_does_not_synchronize_cannot_be_split():
    graph, plan = split_normalization(synchronized_layers=())
    with pytest.raises(InvalidPlanError, match="layer 'bn' cannot be split: its op 'mean'"):
        simulate(graph, cluster(2), plan)


def test_a_malformed_list_of_normalization_layers_is_refused_naming_it():
    plan = Plan(data_parallel=DataParallel(("/D:0", "/D:1")))
    with pytest.raises(InvalidGraphError, match=r"metadata\['synchronized_layers'\] must be a list of layer names.*"
                                               r"Received: synchronized_layers='bn'"):
        simulate(normalization(synchronized_layers="bn"), cluster(2), plan)


def _one_device_three_tasks(copy_priority):
    """A (1 s) feeds op B (1 s, priority 1) and a split copy S (1 s) on the one device."""
    tg = TaskGraph(["/D:0"])
    a = tg.add("a", 0, "op", 0, 1.0, (4.0,), 0.0, 0.0, 0)
    b = tg.add("b", 1, "op", 0, 1.0, (), 0.0, 0.0, 1)
    s = tg.add("a:0/split", -1, "split", 0, 1.0, (), 0.0, 0.0, copy_priority)
    tg.outputs[a].append((0, 4.0, [b, s]))
    tg.npreds[b] = tg.npreds[s] = 1
    return tg, b, s


def test_an_op_started_while_a_copy_waited_means_its_start_order_would_not_replay():
    one = cluster(1)
    tg, b, s = _one_device_three_tasks(copy_priority=5)
    by_priority = run_task_graph(tg, one)
    assert (by_priority.task_start[b], by_priority.task_start[s]) == (1.0, 2.0)  # b's priority wins
    assert not by_priority.start_order_replays
    tg.orders = [[0, b]]  # the same start order, fixed: a ready copy runs before the order's next task
    ordered = run_task_graph(tg, one)
    assert (ordered.task_start[b], ordered.task_start[s]) == (2.0, 1.0)


def test_where_no_op_passed_a_waiting_copy_the_start_order_replays_the_same_timeline():
    one = cluster(1)
    tg, b, s = _one_device_three_tasks(copy_priority=0.5)
    by_priority = run_task_graph(tg, one)
    assert by_priority.start_order_replays
    tg.orders = [[0, b]]
    ordered = run_task_graph(tg, one)
    assert (ordered.task_start, ordered.task_end) == (by_priority.task_start, by_priority.task_end)


def test_shared_compute_never_claims_a_replay():
    shared = Cluster.preset("logical-cpus:2")
    graph = synthetic.chain_mlp(layers=2)
    result = simulate(graph, shared, Plan(placement={o.name: shared.device_names[0] for o in graph.ops}))
    assert not result.start_order_replays


@pytest.mark.parametrize("preset", ["4xV100-nvlink", "2xK80-pcie", "8xH100-nvlink"])
def test_wave_plans_that_claim_a_replay_replay_exactly(preset):
    from kerasflow.planner.parallel.onecopy import one_copy_data_parallel
    from kerasflow.planner.sim.planchecks import attach_orders
    from kerasflow.planner.parallel.ticktock import tick_tock_model_parallel

    cluster_ = Cluster.preset(preset)
    claims = {True: 0, False: 0}
    for graph in (synthetic.chain_mlp(layers=4), synthetic.inception_like(blocks=2),
                  synthetic.transformer_like(blocks=2)):
        for made in (one_copy_data_parallel(graph, cluster_), tick_tock_model_parallel(graph, cluster_)):
            unordered = dataclasses.replace(made, order={})
            tasks = build_task_graph(graph, cluster_, unordered)
            first = run_task_graph(tasks, cluster_)
            claims[first.start_order_replays] += 1
            attach_orders(tasks, cluster_, dataclasses.replace(unordered, order=first.start_order()))
            again = run_task_graph(tasks, cluster_)
            if first.start_order_replays:
                assert (again.task_start, again.task_end, again.peak_memory) == (
                    first.task_start, first.task_end, first.peak_memory)
    assert claims[True] > 0  # the claim is exercised


def test_a_run_stops_once_its_clock_passes_its_deadline():
    # fork_join's run on two devices (test_two_branches_on_two_devices_include_transfers) ends at
    # 9 s; with a 0.5 s step overhead, at 9.5 s, and the deadline counts the overhead.
    from kerasflow.planner.sim.simulator import STEP_OVERHEAD_FIELD, simulate_tasks

    c = cluster(2, latency=0.5, bandwidth=100.0)
    plan = Plan(placement={"a": "/D:0", "b": "/D:0", "c": "/D:1", "d": "/D:0"})
    tasks = build_task_graph(fork_join(), c, plan)
    assert run_task_graph(tasks, c, deadline=9.0).makespan == 9.0
    assert run_task_graph(tasks, c, deadline=8.99) is None
    graph = fork_join()
    graph = OpGraph(graph.ops, graph.edges, metadata={STEP_OVERHEAD_FIELD: 0.5})
    assert simulate_tasks(graph, c, tasks, deadline=9.5).makespan == 9.5
    assert simulate_tasks(graph, c, tasks, deadline=9.49) is None


def test_a_run_in_which_an_op_passed_a_waiting_copy_is_not_stopped():
    # By priority: a 0-1, then b 1-2 while the copy waits, the copy 2-3. A replay of that start
    # order runs the copy first (test_an_op_started_while_a_copy_waited_...), so the run goes on.
    one = cluster(1)
    tg, _, _ = _one_device_three_tasks(copy_priority=5)
    assert run_task_graph(tg, one, deadline=2.5).makespan == 3.0
    tg, _, _ = _one_device_three_tasks(copy_priority=0.5)  # a 0-1, the copy 1-2, b 2-3: stopped
    assert run_task_graph(tg, one, deadline=2.5) is None
