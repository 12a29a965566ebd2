"""Hand-computed tests of Tick-Tock waves, pipelines, and the largest batch that fits."""


import pytest

from kerasflow.planner import (
    Cluster, InsufficientMemoryError, InvalidPlanError, OpGraph, Plan, Waves, baselines, plan, simulate, synthetic,
)
from kerasflow.planner.ticktock import (
    batch_coupled_ops, max_batch, pipeline, tick_tock_data_parallel, tick_tock_model_parallel, with_waves,
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


def test_tick_tock_data_parallel_all_reduces_once_per_gradient():
    graph = synthetic.chain_mlp(layers=2)
    c = Cluster.preset("4xV100-pcie")
    result = simulate(graph, c, tick_tock_data_parallel(graph, c))
    reductions = [n for n in result.task_names if n.endswith("@allreduce")]
    assert len(reductions) == len([o for o in graph.ops if o.phase == "update"])
    assert any(n.endswith("@r3@w1") for n in result.task_names)


def test_pipeline_names_and_order():
    graph = synthetic.chain_mlp(layers=4)
    c = Cluster.preset("2xK80-pcie")
    gpipe = pipeline(graph, c, 4)
    assert gpipe.waves.count == 4 and gpipe.waves.offset == "none"
    assert simulate(graph, c, gpipe).makespan == gpipe.predicted_step_time


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
        assert any("tick_tock" in n for n in auto.candidates)


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


def test_named_strategies_run():
    graph = synthetic.chain_mlp(layers=3)
    for name in ("data_parallel", "gpipe-2", "tick_tock_model_parallel", "fastt+waves"):
        found = max_batch(graph, "2xK80-pcie", name, memory_limit=2**28)
        assert found.batch >= 1 and found.strategy == name
