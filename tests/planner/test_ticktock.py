"""Hand-computed tests of Tick-Tock waves, pipelines, and the largest batch that fits."""

import dataclasses

import pytest

from kerasflow.planner import (
    Cluster, InsufficientMemoryError, InvalidPlanError, OpGraph, Plan, Waves, baselines, plan, simulate, synthetic,
)
from kerasflow.planner.search.maxbatch import STRATEGIES, max_batch
from kerasflow.planner.search.planning import candidate_plans
from kerasflow.planner.parallel.ticktock import (
    batch_coupled_ops, pipeline, slower_than, tick_tock_data_parallel, tick_tock_model_parallel, with_waves,
)
from tests.planner.helpers import cluster, op


def chain():
    # f1 -> f2 (forward) -> b2 -> b1 (backward, b1 also reads f1) -> u (update). Each
    # batch op costs 1 s and makes 10 B per sample; b1 makes a 4 B gradient.
    return OpGraph([
        op("f1", (0.0, 1.0), [(0, 10)], batch_axis=0),
        op("f2", (0.0, 1.0), [(0, 10)], batch_axis=0),
        op("b2", (0.0, 1.0), [(0, 10)], phase="backward", batch_axis=0),
        op("b1", (0.0, 1.0), [4], phase="backward", batch_axis=0),
        op("u", 1.0, [], phase="update"),
    ], [("f1", "f2", 0), ("f2", "b2", 0), ("b2", "b1", 0), ("f1", "b1", 0), ("b1", "u", 0)], batch_size=2)


def on_one_device(**kwargs):
    return Plan(placement={n: "/D:0" for n in ("f1", "f2", "b2", "b1", "u")}, **kwargs)


def test_peak_memory_without_waves():
    # f1 0-2 (20 B to 8), f2 2-4 (20 B to 6), b2 4-6 (20 B to 8): 60 B during [4, 6).
    assert simulate(chain(), cluster(1), on_one_device()).peak_memory["/D:0"] == 60.0


def test_two_offset_waves_interleave_their_peaks():
    # Waves of 1 sample; the tick wave goes first whenever both are ready:
    # f1w0 0-1, f2w0 1-2, b2w0 2-3, b1w0 3-4, f1w1 4-5, f2w1 5-6, b2w1 6-7, b1w1 7-8, sum, u 8-9.
    # During [6, 7): b1w0's 4 B gradient + f1w1, f2w1, b2w1 at 10 B each = 34 B.
    result = simulate(chain(), cluster(1), on_one_device(waves=Waves(2)))
    assert result.times()["b1@w0"] == (3.0, 4.0) and result.times()["f1@w1"] == (4.0, 5.0)
    assert result.peak_memory["/D:0"] == 34.0
    times, level = result.memory_timeline["/D:0"]
    assert dict(zip(times, level))[6.0] == 34.0


def test_a_loop_filling_gradient_accumulators_is_behind_the_wave_barrier():
    # As a recurrent layer's loop after TensorFlow's gradient rewrite: the forward loop fills
    # accumulators that the gradient's scope made from shapes alone (backward, reading nothing
    # of the batch). The runtime starts the tock wave once the tick wave's prediction is made;
    # so must the simulator. Waves of 1 sample (1 s a batch op, 10 B a sample at 100 B/s):
    # a@w0 0-1 on D0, sent 1-1.1; loop@w0 1.1-2.1, p@w0 2.1-3.1 on D1; a@w1 3.1-4.1.
    graph = OpGraph([
        op("a", (0.0, 1.0), [(0, 10)], batch_axis=0),
        op("acc", 0.0, [0], phase="backward", batch_axis=0),
        op("loop", (0.0, 1.0), [(0, 10)], batch_axis=0),
        op("p", (0.0, 1.0), [(0, 10)], batch_axis=0),
        op("g", (0.0, 1.0), [4], phase="backward", batch_axis=0),
    ], [("a", "loop", 0), ("acc", "loop", 0), ("loop", "p", 0), ("p", "g", 0)], batch_size=2)
    plan = Plan(placement={"a": "/D:0", "acc": "/D:1", "loop": "/D:1", "p": "/D:1", "g": "/D:1"},
                waves=Waves(2))
    times = simulate(graph, cluster(2), plan).times()
    assert times["p@w0"] == pytest.approx((2.1, 3.1))
    assert times["a@w1"] == pytest.approx((3.1, 4.1))


def test_both_micro_batches_at_once_peak_higher():
    # A pipeline (no offset) runs both forwards first: f1w0, f1w1, f2w0, f2w1, b2w0, ...
    # During [4, 6): f1 x2, f2w0 (or f2w1), b2 copies: 50 B, above Tick-Tock's 34 B.
    result = simulate(chain(), cluster(1), on_one_device(waves=Waves(2, offset="none")))
    assert result.peak_memory["/D:0"] == 50.0


def test_gradients_are_summed_once_before_one_update():
    result = simulate(chain(), cluster(1), on_one_device(waves=Waves(2)))
    roles = dict(zip(result.task_names, result.task_role))
    assert [n for n, r in roles.items() if r == "sum"] == ["b1:0@sum@/D:0"]
    assert [n for n in result.task_names if n.startswith("u")] == ["u"]
    assert result.makespan == chain().total_work("X") == 9.0


def test_tock_stages_run_in_reverse_device_order():
    graph = synthetic.chain_mlp(layers=4)
    c = Cluster.preset("4xV100-nvlink")
    tt = tick_tock_model_parallel(graph, c)
    mp = baselines.layerwise_model_parallel(graph, c)
    assert dict(tt.waves.stage_maps[1]) == {"/GPU:0": "/GPU:3", "/GPU:1": "/GPU:2", "/GPU:2": "/GPU:1",
                                            "/GPU:3": "/GPU:0"}
    devices = simulate(graph, c, tt).device_of()
    for layer in range(4):
        tick = mp.placement[f"dense_{layer}/MatMul"]
        assert devices[f"dense_{layer}/MatMul@w0"] == tick
        assert devices[f"dense_{layer}/MatMul@w1"] == tt.waves.stage_maps[1][tick]
    # Weights stay home: the read runs once, on the tick device.
    assert devices["dense_0/ReadVariableOp"] == mp.placement["dense_0/ReadVariableOp"]


def test_tick_tock_data_parallel_all_reduces_once_after_both_waves():
    # Two small weight gradients fuse into one buffer: one all-reduce, which starts only after
    # both waves of both gradients on every simulated replica are done.
    graph = synthetic.chain_mlp(layers=2)
    c = Cluster.preset("4xV100-pcie")
    result = simulate(graph, c, tick_tock_data_parallel(graph, c))
    times = result.times()
    reductions = [n for n in times if n.endswith("@allreduce")]
    assert len(reductions) == 1
    waves = [n for n in times if "_grad_weight" in n and "@w" in n]
    assert {n[-3:] for n in waves} == {"@w0", "@w1"}
    assert times[reductions[0]][0] >= max(times[n][1] for n in waves)
    assert any(n.endswith("@r3@w1") for n in result.task_names)


def test_a_pipeline_overlaps_its_stages_by_micro_batch():
    # Layers L0 (a) and L1 (b), 1 s per sample each, batch 4: layer-wise model parallelism puts
    # them on /D:0 and /D:1 and runs 4 + 4 = 8 s. With 2 micro-batches: a 0-2, 2-4 on /D:0 and
    # b 2-4, 4-6 on /D:1 (6 s); with 4: a in 0-4, b 1-2, ..., 4-5 (5 s).
    graph = OpGraph([op("a", (0.0, 1.0), [(0, 4)], layer="L0", batch_axis=0),
                     op("b", (0.0, 1.0), [], layer="L1", batch_axis=0)], [("a", "b", 0)], batch_size=4)
    c = cluster(2, bandwidth=1e15)
    assert baselines.layerwise_model_parallel(graph, c).predicted_step_time == pytest.approx(8.0)
    for micro_batches, seconds in ((2, 6.0), (4, 5.0)):
        gpipe = pipeline(graph, c, micro_batches)
        assert (gpipe.waves.count, gpipe.waves.offset, gpipe.algorithm) == (micro_batches, "none",
                                                                           f"gpipe-{micro_batches}")
        assert gpipe.predicted_step_time == pytest.approx(seconds)


def test_auto_fits_with_waves_what_does_not_fit_without():
    # One device of 40 B, no headroom: no waves peaks at 60 B, Tick-Tock at 34 B.
    c = cluster(1, memory=40)
    with pytest.raises(InsufficientMemoryError, match="tick_tock='on'"):
        plan(chain(), c, memory_headroom=0.0, tick_tock="off")
    chosen = plan(chain(), c, memory_headroom=0.0, tick_tock="auto")
    assert chosen.waves is not None and chosen.algorithm == "single_device+waves"
    assert chosen.predicted_peak_memory["/D:0"] == 34.0


def test_off_never_adds_waves_and_auto_is_never_worse():
    graph = synthetic.inception_like(blocks=1)
    for preset in ("2xK80-pcie", "4xV100-nvlink"):
        off = plan(graph, preset, tick_tock="off", max_split_evaluations=4)
        auto = plan(graph, preset, tick_tock="auto", max_split_evaluations=4)
        assert off.waves is None and not any("wave" in n or "tick" in n for n in off.candidates)
        assert auto.predicted_step_time <= off.predicted_step_time
        tried, _ = candidate_plans(graph, preset, tick_tock="auto", max_split_evaluations=4, verbose=0)
        assert any("tick_tock" in n for n in tried)


def test_on_returns_a_plan_with_waves():
    chosen = plan(synthetic.chain_mlp(layers=3), "4xV100-nvlink", tick_tock="on", max_split_evaluations=2)
    assert chosen.waves is not None


def test_batch_coupled_models_get_no_waves_unless_forced():
    graph = OpGraph([op("bn", (0.0, 1.0), [(0, 4)], layer="batch_norm"),
                     op("g", (0.0, 1.0), [4], phase="backward", batch_axis=0),
                     op("u", 1.0, [], phase="update")], [("bn", "g", 0), ("g", "u", 0)], batch_size=4)
    assert batch_coupled_ops(graph) == ["bn"]
    auto = plan(graph, cluster(2))
    assert not any("wave" in n or "tick" in n for n in auto.candidates)
    with pytest.warns(UserWarning, match="BatchNormalization statistics come from each wave"):
        forced = plan(graph, cluster(2), tick_tock="on")
    assert forced.waves is not None


def test_max_batch_by_hand():
    # Peak memory is 30 B per sample without waves, 15 B per sample + 4 B with Tick-Tock:
    # under 100 B, batches of 3 and of 6.
    c = cluster(1, memory=100)
    plain = max_batch(chain(), c, lambda g, cl, b, *_: baselines.single_device(g, cl, batch=b), memory_headroom=0.0)
    waved = max_batch(chain(), c, lambda g, cl, b, *_: with_waves(baselines.single_device(g, cl, batch=b), g, cl,
                                                                  batch=b), memory_headroom=0.0)
    assert (plain.batch, waved.batch) == (3, 6)
    assert plain.samples_per_second == pytest.approx(3 / (4 * 3 + 1))
    assert waved.peak_memory["/D:0"] == 94.0


def test_max_batch_errors():
    with pytest.raises(InvalidPlanError, match="Unknown strategy"):
        max_batch(chain(), cluster(1), "magic")
    with pytest.raises(InsufficientMemoryError, match="not fit even a batch of 1"):
        max_batch(chain(), cluster(1, memory=20), "data_parallel", memory_headroom=0.0)
    with pytest.raises(InvalidPlanError, match="tick_tock must be one of"):
        plan(chain(), cluster(1), tick_tock="sometimes")


def test_plan_skips_strategies_that_do_not_apply():
    chosen = plan(chain(), cluster(2), max_split_evaluations=2)  # no layers: no layer-wise stages
    assert "layerwise_model_parallel" not in chosen.candidates and chosen.predicted_step_time > 0


def test_named_strategies_build_what_they_name_at_the_largest_batch_that_fits():
    graph, c, limit = synthetic.chain_mlp(layers=3), Cluster.preset("2xK80-pcie"), 2**28
    budget = limit * 0.9  # the default 10 % headroom
    shapes = {
        "data_parallel": lambda p: p.data_parallel is not None and len(p.data_parallel.devices) == 2,
        "gpipe-2": lambda p: (p.waves.count, p.waves.offset) == (2, "none"),
        "gpipe-4": lambda p: (p.waves.count, p.waves.offset) == (4, "none"),
        "tick_tock_model_parallel": lambda p: p.waves.count == 2 and dict(p.waves.stage_maps[1]) == {
            "/GPU:0": "/GPU:1", "/GPU:1": "/GPU:0"},
        "fastt+waves": lambda p: p.waves is not None and p.waves.count == 2,
    }
    for name, has_shape in shapes.items():
        found = max_batch(graph, c, name, memory_limit=limit)
        assert found.strategy == name and has_shape(found.plan), name
        assert max(found.peak_memory.values()) <= budget
        # One more sample does not fit: the batch is the largest.
        try:
            bigger = STRATEGIES[name](graph, c, found.batch + 1, limit, 0.1)
        except InsufficientMemoryError:
            continue  # the planner found no plan for it at all
        assert max(bigger.predicted_peak_memory.values()) > budget, name


def test_the_tock_waves_forward_pass_waits_for_the_tick_waves():
    # f1 (2 s per sample) on /D:0, then f2 and the backward b (1 s per sample) on /D:1; batch 2,
    # so each wave's ops take 2 s and 1 s. Tick-Tock: f1w0 0-2, f2w0 2-3; the tock wave's
    # forward starts when the tick wave's forward ends: f1w1 3-5 (while bw0 runs 3-4), f2w1 5-6,
    # bw1 6-7: 7 s. Without the offset (a pipeline) f1w1 runs 2-4 and the step takes 6 s.
    graph = OpGraph([op("f1", (0.0, 2.0), [(0, 0)], batch_axis=0), op("f2", (0.0, 1.0), [(0, 0)], batch_axis=0),
                     op("b", (0.0, 1.0), [], phase="backward", batch_axis=0)],
                    [("f1", "f2", 0), ("f2", "b", 0)], batch_size=2)
    placement = {"f1": "/D:0", "f2": "/D:1", "b": "/D:1"}
    tick_tock = simulate(graph, cluster(2), Plan(placement=placement, waves=Waves(2)))
    assert tick_tock.times()["f1@w1"] == (3.0, 5.0) and tick_tock.makespan == 7.0
    piped = simulate(graph, cluster(2), Plan(placement=placement, waves=Waves(2, offset="none")))
    assert piped.times()["f1@w1"] == (2.0, 4.0) and piped.makespan == 6.0


def _op_seconds_per_device(tasks):
    work = {}
    for t in range(len(tasks)):
        if tasks.role[t] == "op":
            work[tasks.resource[t]] = work.get(tasks.resource[t], 0.0) + tasks.duration[t]
    return max(work.values())


@pytest.mark.parametrize("preset", ["4xV100-nvlink", "2xK80-pcie"])
def test_the_busiest_device_sums_the_op_tasks_a_plan_builds_and_neither_bound_exceeds_its_step(preset):
    from kerasflow.planner import Shard
    from kerasflow.planner.parallel.onecopy import one_copy_data_parallel
    from kerasflow.planner.sim.taskgraph import build_task_graph, busiest_device_seconds, longest_chain_seconds

    cluster_ = Cluster.preset(preset)
    first, second = cluster_.device_names[:2]
    graph = synthetic.chain_mlp(layers=4)
    layers = sorted({o.layer for o in graph.ops if o.layer and o.layer.startswith("dense")})
    split = Plan(placement={o.name: first for o in graph.ops},
                 splits={layers[0]: [Shard(first, 0.25), Shard(second, 0.75)]})
    plans = [baselines.layerwise_model_parallel(graph, cluster_), baselines.data_parallel(graph, cluster_),
             one_copy_data_parallel(graph, cluster_), tick_tock_model_parallel(graph, cluster_),
             tick_tock_data_parallel(graph, cluster_), split,
             with_waves(split, graph, cluster_)]
    for made in plans:
        bound = busiest_device_seconds(graph, cluster_, made)
        assert bound == pytest.approx(_op_seconds_per_device(build_task_graph(graph, cluster_, made)), rel=1e-12)
        makespan = simulate(graph, cluster_, made).makespan
        assert bound <= makespan * (1 + 1e-12)
        assert longest_chain_seconds(graph, cluster_, made) <= makespan * (1 + 1e-12)


def test_the_longest_chain_takes_each_op_at_its_quickest_copy():
    from kerasflow.planner.sim.taskgraph import busiest_device_seconds, longest_chain_seconds

    # Whole batch (2 samples): f1, f2, b2, b1 take 2 s each, then u 1 s: a 9 s chain on any
    # devices; across two, D0 works f1 + b1 + u = 5 s. Two waves: each batch copy takes 1 s,
    # a 5 s chain; on one device it works 2 waves x 4 ops x 1 s + u = 9 s.
    graph, two = chain(), cluster(2)
    across = Plan(placement={"f1": "/D:0", "f2": "/D:1", "b2": "/D:1", "b1": "/D:0", "u": "/D:0"})
    assert (longest_chain_seconds(graph, two, across), busiest_device_seconds(graph, two, across)) == (9.0, 5.0)
    waved = on_one_device(waves=Waves(2))
    assert (longest_chain_seconds(graph, two, waved), busiest_device_seconds(graph, two, waved)) == (5.0, 9.0)


def test_a_wave_plan_whose_longest_chain_alone_is_slower_is_not_simulated():
    # Two waves over three devices: D0 works f1 and b1 (2 x 2 x 1 s), D1 f2 and u (3 s), D2 b2
    # (2 s); the chain f1 f2 b2 b1 u takes 5 s, longer than the busiest device's 4 s.
    graph, three = chain(), cluster(3)
    spread = Plan(placement={"f1": "/D:0", "f2": "/D:1", "b2": "/D:2", "b1": "/D:0", "u": "/D:1"})
    assert with_waves(spread, graph, three, unless_slower_than=4.5) is None
    made = with_waves(spread, graph, three, unless_slower_than=7.44)
    assert made is not None and made.predicted_step_time == pytest.approx(7.44)


def test_a_wave_plan_whose_run_passes_the_time_to_beat_is_stopped_there():
    # The plan above runs by priority: f1@w0 0-1, f2@w0 1.1-2.1, f1@w1 2.1-3.1, b2@w0 2.2-3.2,
    # f2@w1 3.2-4.2, b1@w0 3.3-4.3, b2@w1 4.3-5.3, b1@w1 5.4-6.4, u 6.44-7.44 (transfers between):
    # 7.44 s. Both bounds (4 and 5 s) let 5.5 s through; the run passes it and is stopped.
    graph, three = chain(), cluster(3)
    spread = Plan(placement={"f1": "/D:0", "f2": "/D:1", "b2": "/D:2", "b1": "/D:0", "u": "/D:1"})
    waved = dataclasses.replace(spread, waves=Waves(2), batch_size=graph.batch_size)
    assert not slower_than(graph, three, waved, graph.batch_size, 5.5)
    assert with_waves(spread, graph, three, unless_slower_than=5.5) is None


def test_a_wave_plan_whose_busiest_device_alone_is_slower_is_not_simulated():
    graph, two = synthetic.chain_mlp(layers=2), Cluster.preset("2xK80-pcie")
    base = baselines.single_device(graph, two)
    waved = with_waves(base, graph, two)
    assert with_waves(base, graph, two, unless_slower_than=waved.predicted_step_time * 1.01) is not None
    # Both waves on one device do its work and a fixed cost per kernel more: more than that device alone.
    assert with_waves(base, graph, two, unless_slower_than=base.predicted_step_time) is None
    cpus = Cluster.preset("logical-cpus:2")  # shared compute: the busiest device's work is no bound there
    assert with_waves(baselines.single_device(graph, cpus), graph, cpus, unless_slower_than=1e-12) is not None
