"""Tests of FastT's critical-path op splitting and of plan(), with hand-computed answers."""


import os
import subprocess
import sys

import pytest

from kerasflow.planner import (
    Cluster, Device, InsufficientMemoryError, InvalidPlanError, Link, OpGraph, Plan, baselines, heft, plan,
    simulate, synthetic,
)
from kerasflow.planner.parallel.splitting import (
    balanced_shards, critical_tasks, hybrid_splits, layer_weight_bytes, split_pays, splittable_layers,
    split_search,
)
from kerasflow.planner.ir.graphtables import LOSS_GROUP, gradient_sums, split_groups
from kerasflow.planner.sim.taskgraph import build_task_graph
from kerasflow.planner.sim.simulator import run_task_graph
from tests.planner.helpers import cluster, op


def heft_scheduler(graph, c):
    """The split search's scheduler: HEFT with the splits, stopped once it passes the time to beat."""
    return lambda splits, to_beat: heft(graph, c, splits=splits, unless_slower_than=to_beat)


def big_layer_graph():
    # x feeds 4 B per sample to layer L (1 s per sample, batch 8); y consumes L's output.
    return OpGraph([op("x", 0.0, [(0, 4)], phase="other"),
                    op("m", (0.0, 1.0), [(0, 4)], layer="L", batch_axis=0),
                    op("y", 0.0)], [("x", "m", 0), ("m", "y", 0)], batch_size=8)


def two_fast_two_slow():
    # /D:0 and /D:1 share a fast link; every link to or from /D:2 and /D:3 is very slow.
    devices = [Device(f"/D:{i}", "X", 10**9, memory_bandwidth=1e30, launch_overhead=0.0) for i in range(4)]
    slow = Link(0.0, 0.1)
    links = {(a.name, b.name): slow for a in devices for b in devices
             if a is not b and {a.name, b.name} - {"/D:0", "/D:1"}}
    return Cluster(devices, Link(0.0, 1e9), links, name="two-fast-two-slow")


def test_splitting_the_dominant_layer_picks_the_fast_pair():
    graph, c = big_layer_graph(), two_fast_two_slow()
    base = heft(graph, c)
    assert base.predicted_step_time == 8.0
    best, evaluations = split_search(graph, c, base, heft_scheduler(graph, c))
    # k = 2 over the fast pair halves the layer: 4 s plus 16 B slices at 1 GB/s. k = 3 or 4
    # would ship slices over 0.1 B/s links (over 100 s).
    assert [s.device for s in best.splits["L"]] == ["/D:0", "/D:1"]
    assert best.predicted_step_time == pytest.approx(4.0, abs=1e-6)
    assert 3 <= evaluations <= 48


def test_more_shards_pay_on_a_fast_uniform_cluster():
    graph = big_layer_graph()
    c = Cluster([Device(f"/D:{i}", "X", 10**9, memory_bandwidth=1e30, launch_overhead=0.0) for i in range(4)],
                Link(0.0, 1e9))
    best, _ = split_search(graph, c, heft(graph, c), heft_scheduler(graph, c))
    assert len(best.splits["L"]) == 4  # 8 s / 4 = 2 s: every extra shard pays here
    assert best.predicted_step_time == pytest.approx(2.0, abs=1e-6)
    chosen = plan(graph, c)
    assert chosen.candidates["heft+split"] == pytest.approx(2.0, abs=1e-6)
    assert chosen.predicted_step_time == pytest.approx(2.0, abs=1e-6)


def loss_graph(batch_axis=0):
    # x feeds 4 B per sample to the compiled loss, outside every layer (1 s per sample, batch 8);
    # the loss' gradient (0.5 s per sample) follows it.
    return OpGraph([op("x", 0.0, [(0, 4)], phase="other"),
                    op("compile_loss/xent", (0.0, 1.0), [(0, 4)], batch_axis=batch_axis),
                    op("gradient_tape/compile_loss/xent/grad", (0.0, 0.5), [(0, 4)], phase="backward",
                       batch_axis=batch_axis)],
                   [("x", "compile_loss/xent", 0), ("compile_loss/xent", "gradient_tape/compile_loss/xent/grad", 0)],
                   batch_size=8)


def test_the_compiled_loss_is_split_as_one_layer():
    graph = loss_graph()
    c = Cluster([Device(f"/D:{i}", "X", 10**9, memory_bandwidth=1e30, launch_overhead=0.0) for i in range(4)],
                Link(0.0, 1e9))
    assert splittable_layers(graph) == {LOSS_GROUP}
    base = heft(graph, c)
    assert base.predicted_step_time == 12.0  # 8 s forward, 4 s backward, on one device
    best, _ = split_search(graph, c, base, heft_scheduler(graph, c))
    # Four shards of 2 samples: 2 s forward and 1 s backward each, side by side; the 8 B slices
    # cross 1 GB/s links in 8 ns.
    assert list(best.splits) == [LOSS_GROUP] and len(best.splits[LOSS_GROUP]) == 4
    assert best.predicted_step_time == pytest.approx(3.0, abs=1e-6)
    tg = build_task_graph(graph, c, best)
    shards = sorted((tg.names[t], tg.devices[tg.resource[t]]) for t in range(len(tg)) if tg.shard[t] >= 0)
    assert [name for name, _ in shards[:4]] == [f"compile_loss/xent@s{s}" for s in range(4)]
    assert sorted({device for _, device in shards}) == ["/D:0", "/D:1", "/D:2", "/D:3"]


def test_a_loss_that_cannot_be_split_is_left_whole():
    # The profile leaves a loss without a batch axis where its shards' weighted sum is not the
    # batch's loss (a masked mean, Dice): no split of it is tried.
    graph = loss_graph(batch_axis=None)
    assert splittable_layers(graph) == set()
    with pytest.raises(InvalidPlanError, match="cannot be split"):
        simulate(graph, cluster(2), Plan(placement={o.name: "/D:0" for o in graph.ops},
                                         splits={LOSS_GROUP: balanced_shards(cluster(2), ["/D:0", "/D:1"])}))


def residual_graph():
    # stem -> branch -> res = stem + branch; backward, the tape sums the gradients of stem's
    # output that come from res and from branch (AddN, outside every layer) for stem's gradient.
    def step(name, layer, phase="forward", type=""):
        return op(name, (0.0, 1.0), [(0, 4)], layer=layer, phase=phase, type=type, batch_axis=0)
    return OpGraph([op("x", 0.0, [(0, 4)], phase="other"), step("stem/op", "stem"), step("branch/op", "branch"),
                    step("res/op", "res"), step("gradient_tape/res/op", "res", "backward"),
                    step("gradient_tape/branch/op", "branch", "backward"), step("AddN", None, "backward", "AddN"),
                    step("gradient_tape/stem/op", "stem", "backward")],
                   [("x", "stem/op", 0), ("stem/op", "branch/op", 0), ("stem/op", "res/op", 0),
                    ("branch/op", "res/op", 0), ("res/op", "gradient_tape/res/op", 0),
                    ("gradient_tape/res/op", "gradient_tape/branch/op", 0), ("gradient_tape/res/op", "AddN", 0),
                    ("gradient_tape/branch/op", "AddN", 0), ("AddN", "gradient_tape/stem/op", 0)], batch_size=8)


@pytest.mark.parametrize("layers, sum_copies", [
    (("stem", "branch", "res"), ["AddN@s0", "AddN@s1"]),  # both readers of stem's output take its shards
    (("stem", "res"), ["AddN@s0", "AddN@s1"]),            # res does
    (("stem",), ["AddN"]),                               # neither: the whole gradient is summed, then cut
    (("branch", "res"), ["AddN"]),                       # stem is whole
])
def test_a_residual_gradient_sum_is_split_with_its_layer_where_a_reader_takes_the_shards(layers, sum_copies):
    graph = residual_graph()
    assert splittable_layers(graph) == {"stem", "branch", "res"}
    c = cluster(2)
    splits = {layer: balanced_shards(c, ["/D:0", "/D:1"]) for layer in layers}
    tg = build_task_graph(graph, c, Plan(placement={o.name: "/D:0" for o in graph.ops}, splits=splits))
    assert sorted(tg.names[t] for t in range(len(tg)) if tg.role[t] == "op" and tg.names[t].startswith("AddN")) \
        == sum_copies


def test_a_gradient_sum_read_by_two_layers_belongs_to_neither():
    # The sum of a model input's gradients feeds two layers' backward passes: no layer made the
    # summed tensor, so no split copies the sum.
    graph = residual_graph()
    extra = op("gradient_tape/other/op", (0.0, 1.0), [(0, 4)], layer="other", phase="backward", batch_axis=0)
    graph = OpGraph(list(graph.ops) + [extra], list(graph.edges) + [("AddN", "gradient_tape/other/op", 0)],
                    batch_size=8)
    assert split_groups(graph)[graph.index("AddN")] is None and gradient_sums(graph) == []
    assert split_groups(residual_graph())[residual_graph().index("AddN")] == "stem"


def test_balanced_shards_follow_device_speed():
    c = Cluster([Device("/D:0", "X", 1, speed=1.0), Device("/D:1", "X", 1, speed=3.0)], Link(0, 1))
    assert [s.fraction for s in balanced_shards(c, ["/D:0", "/D:1"])] == [0.25, 0.75]


def test_splittable_layers_exclude_batch_coupled_ones():
    graph = OpGraph([op("m", 1.0, [4], layer="dense", batch_axis=0),
                     op("bn", 1.0, [4], layer="batch_norm"),
                     op("v", 0.0, [4], layer="dense", phase="other", persistent_bytes=4, colocation="v")],
                    [("m", "bn", 0)])
    assert splittable_layers(graph) == {"dense"}
    # Unless the profile lists it as a layer whose shards compute its statistics together.
    synchronized = OpGraph(graph.ops, graph.edges, metadata={"synchronized_layers": ["batch_norm"]})
    assert splittable_layers(synchronized) == {"dense", "batch_norm"}


def test_a_layer_with_a_batch_op_pinned_in_a_group_is_not_splittable():
    # two hash ops of one lookup layer kept together on the host: shards could not follow
    graph = OpGraph([op("hash", 1.0, [4], layer="hashing", batch_axis=0, colocation="host/hashing"),
                     op("hash_1", 1.0, [4], layer="hashing", batch_axis=0, colocation="host/hashing"),
                     op("m", 1.0, [4], layer="dense", batch_axis=0)], [("hash", "m", 0), ("hash_1", "m", 0)])
    assert splittable_layers(graph) == {"dense"}


def test_a_recurrent_layer_whose_loop_reads_its_weights_is_splittable():
    # the loop sits in its variable's group, yet each shard gets the weights read for it; a
    # loop the profiler found no batch axis for (a tf-keras layer's) keeps its layer whole
    def graph(axis):
        return OpGraph([op("w", 0.0, [0], layer="lstm", phase="other", persistent_bytes=16, colocation="w"),
                        op("loop", 1.0, [4], type="While", layer="lstm", batch_axis=axis, colocation="w")],
                       [("w", "loop", 0)])
    assert splittable_layers(graph(0)) == {"lstm"}
    assert splittable_layers(graph(None)) == set()


def test_critical_tasks_walk_back_from_the_last_task():
    graph = OpGraph([op("a", 1.0, [10]), op("b", 4.0, [10]), op("c", 1.0, [10]), op("d", 1.0)],
                    [("a", "b", 0), ("a", "c", 0), ("b", "d", 0), ("c", "d", 0)])
    c = Cluster([Device(f"/D:{i}", "X", 1) for i in range(2)], Link(0.0, 1e9))
    p = Plan(placement={"a": "/D:0", "b": "/D:0", "c": "/D:1", "d": "/D:0"})
    tg = build_task_graph(graph, c, p)
    path = critical_tasks(tg, run_task_graph(tg, c), c)
    assert [tg.names[t] for t in path] == ["d", "b", "a"]


def test_critical_tasks_follow_the_dispatch_order_through_zero_length_ties():
    # One device. a (1 s) feeds w (2 s) and i (Identity, 0 s); both feed n (NoOp, 0 s). Listed
    # n, i, a, w, so n and i have the lowest task ids. Timeline: a 0-1; at 1 w (upward rank 2)
    # goes before i (rank 0): w 1-3; i 3-3; n 3-3. i started at 3 because the device was busy
    # with w, not because of its input (a, released at 1). Sorting by (start, id) puts n before
    # i, so the walk from n reached i and then "the task before i" was n again: [n, i], no
    # layer on it, and split search stopped with 0 evaluations. In dispatch order i follows w.
    graph = OpGraph([op("n", 0.0, type="NoOp"), op("i", 0.0, [1], type="Identity"), op("a", 1.0, [1]),
                     op("w", 2.0, [1])], [("a", "w", 0), ("a", "i", 0), ("w", "n", 0), ("i", "n", 0)])
    c = cluster(1)
    tg = build_task_graph(graph, c, Plan(placement={o.name: "/D:0" for o in graph.ops}))
    result = run_task_graph(tg, c)
    assert [(tg.names[t], result.task_start[t]) for t in result.dispatch_order] == [
        ("a", 0.0), ("w", 1.0), ("i", 3.0), ("n", 3.0)]
    assert [tg.names[t] for t in critical_tasks(tg, result, c)] == ["n", "i", "w", "a"]


def three_layer_chain():
    # x -> A -> B -> C -> y, batch 8, 4 B per sample between layers. A costs 3 s per sample
    # (24 s), B 2 s (16 s), C 1 s (8 s). A and B read 10,000 B of weights each, C none.
    ops, edges, previous = [op("x", 0.0, [(0, 4)], phase="other")], [], "x"
    for layer, per_sample, weight in (("A", 3.0, 10_000), ("B", 2.0, 10_000), ("C", 1.0, 0)):
        ops.append(op(f"{layer}/m", (0.0, per_sample), [(0, 4)], layer=layer, batch_axis=0))
        edges.append((previous, f"{layer}/m", 0))
        if weight:
            ops += [op(f"{layer}/w", 0.0, [weight], layer=layer, phase="other", persistent_bytes=weight,
                       colocation=f"{layer}/w"),
                    op(f"{layer}/read", 0.0, [weight], layer=layer, colocation=f"{layer}/w")]
            edges += [(f"{layer}/w", f"{layer}/read", 0), (f"{layer}/read", f"{layer}/m", 0)]
        previous = f"{layer}/m"
    return OpGraph(ops + [op("y", 0.0)], edges + [(previous, "y", 0)], batch_size=8)


def test_the_only_paying_split_is_tried_even_far_down_the_path():
    graph, c = three_layer_chain(), cluster(2)  # two devices, 100 B/s, free local copies
    base = heft(graph, c)
    assert base.predicted_step_time == 48.0  # everything on /D:0: 24 + 16 + 8
    best, evaluations = split_search(graph, c, base, heft_scheduler(graph, c))
    # Splitting A or B ships 10,000 B of weights at 100 B/s (100 s): never pays. Splitting C
    # (ranked 3rd by path time, the only paying layer) in halves: shard 0 runs on /D:0 40-44 s;
    # shard 1 gets its 16 B of input (0.16 s) and runs on /D:1 40.16-44.16 s; y joins the
    # halves on /D:1 once /D:0's 16 B arrive (44.16 s).
    assert {layer: [(s.device, s.fraction) for s in shards] for layer, shards in best.splits.items()} == {
        "C": [("/D:0", 0.5), ("/D:1", 0.5)]}
    assert best.predicted_step_time == pytest.approx(44.16, abs=1e-9)
    # round 1: [A, B, C], [C], [A], [B]; round 2 (C split): [A, B], [A], [B]; one k each
    assert evaluations == 7


def test_the_hybrid_start_splits_the_layers_that_pay_and_leaves_weight_heavy_ones_whole():
    graph, c = three_layer_chain(), cluster(2)
    base = heft(graph, c)
    # Over 2 devices a split saves half the layer's time and ships its weights out and the
    # gradient back once: A saves 12 s for 200 s of copies, B 8 s for 200 s, C 4 s for none.
    assert hybrid_splits(graph, c, base) == {"C": balanced_shards(c, ["/D:0", "/D:1"])}
    chosen = plan(graph, c, split=True, tick_tock="off")
    assert chosen.candidates["heft+hybrid"] == pytest.approx(44.16, abs=1e-9)  # as split C above


def test_plan_records_candidates_and_matches_the_simulator():
    graph = synthetic.inception_like(blocks=2)
    c = Cluster.preset("8xH100-nvlink")
    best = plan(graph, c, max_split_evaluations=12)
    assert best.predicted_step_time == simulate(graph, c, best).makespan
    assert best.predicted_step_time == min(best.candidates.values())
    assert {"single_device", "data_parallel", "layerwise_model_parallel", "heft", "cpop"} <= set(best.candidates)
    assert best.graph_fingerprint == graph.fingerprint() and best.cluster == "8xH100-nvlink"
    best.validate(graph, c)


@pytest.mark.parametrize("family", sorted(synthetic.FAMILIES))
def test_plan_is_never_worse_than_the_best_baseline(family):
    graph = synthetic.build(family)
    c = Cluster.preset("4xV100-nvlink")
    best = plan(graph, c, max_split_evaluations=8)
    baseline = min(make(graph, c).predicted_step_time for make in
                   (baselines.single_device, baselines.data_parallel, baselines.layerwise_model_parallel))
    assert best.predicted_step_time <= baseline


def test_same_inputs_give_a_byte_identical_plan(tmp_path):
    graph = synthetic.transformer_like(blocks=1)
    first = plan(graph, "4xV100-nvlink", max_split_evaluations=6)
    second = plan(synthetic.transformer_like(blocks=1), "4xV100-nvlink", max_split_evaluations=6)
    first.save(tmp_path / "a.json")
    second.save(tmp_path / "b.json")
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()
    assert Plan.load(tmp_path / "a.json") == first


def test_two_processes_with_different_hash_seeds_write_the_same_plan(tmp_path):
    # String hashing differs between processes (PYTHONHASHSEED): a set or dict iterated in
    # hash order anywhere in planning would change the plan between runs.
    script = ("import sys; from kerasflow.planner import plan, synthetic; "
              "plan(synthetic.build('inception'), '4xV100-nvlink', max_split_evaluations=6, verbose=0)"
              ".save(sys.argv[1])")
    for seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        subprocess.run([sys.executable, "-c", script, str(tmp_path / f"{seed}.json")], env=env, check=True,
                       timeout=300)
    assert (tmp_path / "1.json").read_bytes() == (tmp_path / "2.json").read_bytes()


def test_plan_spreads_a_graph_that_does_not_fit_one_device():
    from tests.planner.test_listschedule import weighty_chain
    from tests.planner.helpers import cluster

    graph = weighty_chain()
    c = cluster(2, memory=1000, bandwidth=1e6)
    best = plan(graph, c)
    assert "single_device" not in best.candidates and "data_parallel" not in best.candidates
    assert all(peak <= 900 for peak in best.predicted_peak_memory.values())


def test_plan_without_any_fit_says_what_to_do():
    from tests.planner.test_listschedule import weighty_chain
    from tests.planner.helpers import cluster

    with pytest.raises(InsufficientMemoryError, match="No strategy fits the memory.*Ways out"):
        plan(weighty_chain(layers=1, weights=5000), cluster(2, memory=1000))


def test_plan_takes_presets_and_rejects_unknown_candidates():
    graph = synthetic.chain_mlp(layers=2)
    assert plan(graph, "cpu-testbed:1").algorithm == "single_device"
    with pytest.raises(InvalidPlanError, match="Unknown candidate"):
        plan(graph, "2xK80-pcie", candidates=("magic",))


def test_kerasflow_plan_is_the_planner():
    import kerasflow

    assert kerasflow.plan is kerasflow.planner.plan
    from kerasflow.planner.ir.plan import Plan as PlanClass

    assert PlanClass is Plan


def convs_then_a_dense_layer():
    # x -> C0 -> C1 -> C2 -> F -> y at batch 8. Each C costs 1 s per sample and reads 4 B of
    # weights; F costs 0.25 s per sample and reads 1000 B of weights. Activations: 1 B/sample.
    ops, edges, previous = [op("x", 0.0, [(0, 1)], phase="other")], [], "x"
    for layer, per_sample, weights in (("C0", 1.0, 4), ("C1", 1.0, 4), ("C2", 1.0, 4), ("F", 0.25, 1000)):
        ops += [op(f"{layer}/var", 0.0, phase="other", layer=layer, persistent_bytes=weights, colocation=layer),
                op(f"{layer}/read", 0.0, [(weights, 0)], layer=layer, colocation=layer),
                op(f"{layer}/compute", (0.0, per_sample), [(0, 1)], layer=layer, batch_axis=0)]
        edges += [(f"{layer}/var", f"{layer}/read", None), (f"{layer}/read", f"{layer}/compute", 0),
                  (previous, f"{layer}/compute", 0)]
        previous = f"{layer}/compute"
    ops.append(op("y", 0.0))
    edges.append((previous, "y", 0))
    return OpGraph(ops, edges, batch_size=8)


def test_weights_per_layer_and_whether_a_split_pays():
    graph = convs_then_a_dense_layer()
    assert layer_weight_bytes(graph, 8) == {"C0": 4.0, "C1": 4.0, "C2": 4.0, "F": 1000.0}
    # C: 8 s on the path, halved saves 4 s; its weights out and gradient back: 2 x 4 B / 100 B/s.
    assert split_pays(8.0, 4.0, 2, 1 / 100)
    # F: 2 s halved saves 1 s; 2 x 1000 B / 100 B/s = 20 s of copies.
    assert not split_pays(2.0, 1000.0, 2, 1 / 100)


def test_the_paying_layers_are_split_together_and_the_dense_layer_is_left_whole():
    graph, c = convs_then_a_dense_layer(), cluster(2, bandwidth=100.0)
    base = heft(graph, c)
    assert base.predicted_step_time == pytest.approx(26.0)  # 3 x 8 s + 2 s on one device
    # Two evaluations: every path layer split in two (F's 1000 B of weights cross the link:
    # slower), then the paying subset C0-C2.
    best, evaluations = split_search(graph, c, base, heft_scheduler(graph, c),
                                     max_evaluations=2)
    assert evaluations == 2
    assert set(best.splits) == {"C0", "C1", "C2"}
    # HEFT puts F on the second device. That device first receives C0's weights and its half of
    # x over one link (4 B + 4 B at 100 B/s: 0.08 s; C1's and C2's weights follow under its
    # work), runs 3 x 4 s of convolution halves (done at 12.08 s; the first device's half of
    # C2's output arrives at 12.04 s), then F's 2 s: 14.08 s.
    assert best.splits["C0"][1].device == best.placement["F/compute"] == "/D:1"
    assert best.predicted_step_time == pytest.approx(14.08, abs=1e-6)


def test_stopping_plans_that_pass_the_rounds_best_changes_no_step_of_the_search():
    # Every evaluation run to the end, or stopped once it passes the round's best: the same
    # splits, the same evaluations, the same plan; and some evaluations were stopped.
    stopped = []

    def stopping(splits, to_beat):
        made = heft(graph, c, splits=splits, unless_slower_than=to_beat)
        stopped.append(made is None)
        return made

    for graph, preset in ((synthetic.inception_like(blocks=2), "4xV100-nvlink"),
                          (synthetic.random_layered(300, width=6, seed=1, kinds=["V100"]), "4xV100-pcie")):
        c = Cluster.preset(preset)
        base = heft(graph, c)
        to_the_end = split_search(graph, c, base, lambda splits, _: heft(graph, c, splits=splits), max_evaluations=12)
        assert split_search(graph, c, base, stopping, max_evaluations=12) == to_the_end
    assert any(stopped) and not all(stopped)


def test_heft_unless_slower_than_its_own_step_is_that_plan():
    graph, c = synthetic.inception_like(blocks=1), Cluster.preset("4xV100-nvlink")
    made = heft(graph, c)
    assert heft(graph, c, unless_slower_than=made.predicted_step_time) == made
    assert heft(graph, c, unless_slower_than=made.predicted_step_time * 0.999) is None
