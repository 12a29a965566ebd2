"""Tests of the kerasflow command on small files, malformed input included."""

import json

import pytest

from kerasflow.cli import main
from kerasflow.planner import Cluster, Plan, plan, simulate, synthetic


def test_compare_prints_every_strategy_and_the_plan(capsys):
    assert main(["compare", "--synthetic", "mlp", "--cluster", "2xK80-pcie"]) == 0
    out = capsys.readouterr().out
    for row in ("single device", "data-parallel", "layer-wise model-parallel", "HEFT", "CPOP",
                "kerasflow plan (", "lower bound", "bound over kerasflow's plans"):
        assert row in out


def test_compare_names_the_candidates_left_out_by_their_labels():
    from kerasflow.cli import comparison_rows
    from kerasflow.planner import OpGraph

    graph = synthetic.chain_mlp(layers=2)
    refusing = OpGraph(graph.ops, graph.edges, batch_size=graph.batch_size,
                       metadata={"refused_batch_sizes": [graph.batch_size // 2]})
    rows = comparison_rows(refusing, Cluster.preset("4xV100-nvlink"))  # refused: no op splitting to search
    left_out = [row["name"] for row in rows if row.get("fits") is False]
    assert left_out == ["data-parallel", "op splitting", "Tick-Tock waves"]
    assert all(row["step_time"] is None and row["plan"] is None for row in rows if row.get("fits") is False)


def test_compare_a_profile_file_with_a_trace(tmp_path, capsys):
    profile = tmp_path / "profile.json"
    assert main(["synthetic", "inception", "-o", str(profile)]) == 0
    trace = tmp_path / "timeline.json"
    assert main(["compare", str(profile), "--cluster", "4xV100-nvlink", "--trace", str(trace)]) == 0
    assert "traceEvents" in json.loads(trace.read_text())


def test_simulate_a_saved_plan(tmp_path, capsys):
    graph = synthetic.chain_mlp(layers=3)
    graph.save(tmp_path / "profile.json")
    best = plan(graph, "2xK80-pcie", max_split_evaluations=4)
    best.save(tmp_path / "plan.json")
    assert main(["simulate", str(tmp_path / "profile.json"), "--plan", str(tmp_path / "plan.json"),
                 "--cluster", "2xK80-pcie"]) == 0
    out = capsys.readouterr().out
    assert f"{best.predicted_step_time * 1e3:.3f} ms" in out and "/GPU:1" in out


def test_clusters_lists_presets(capsys):
    assert main(["clusters"]) == 0
    out = capsys.readouterr().out
    assert all(name.split(":")[0] in out for name in Cluster.presets())


@pytest.mark.parametrize("argv, message", [
    (["compare", "--synthetic", "mlp", "--cluster", "9xTPU"], "preset name or a .json path"),
    (["compare", "--cluster", "2xK80-pcie"], "Give a PROFILE.json"),
    (["compare", "missing.json", "--cluster", "2xK80-pcie"], "does not exist"),
])
def test_bad_input_exits_2_with_one_line(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_simulate_rejects_a_plan_for_another_cluster(tmp_path, capsys):
    graph = synthetic.chain_mlp(layers=2)
    graph.save(tmp_path / "profile.json")
    plan(graph, "4xV100-pcie", max_split_evaluations=2).save(tmp_path / "plan.json")
    code = main(["simulate", str(tmp_path / "profile.json"), "--plan", str(tmp_path / "plan.json"),
                 "--cluster", "cpu-testbed:2"])
    assert code == 2 and "not in cluster" in capsys.readouterr().err


def test_malformed_profile_exits_2(tmp_path, capsys):
    bad = tmp_path / "profile.json"
    bad.write_text("{not json")
    assert main(["compare", str(bad), "--cluster", "2xK80-pcie"]) == 2
    assert "not valid JSON" in capsys.readouterr().err


def test_plan_and_show(tmp_path, capsys):
    profile = tmp_path / "profile.json"
    assert main(["synthetic", "mlp", "-o", str(profile)]) == 0
    out_plan = tmp_path / "plan.json"
    assert main(["plan", str(profile), "--cluster", "4xV100-nvlink", "--tick-tock", "off", "--no-split",
                 "-o", str(out_plan), "--trace", str(tmp_path / "t.json")]) == 0
    out = capsys.readouterr().out
    plan = Plan.load(out_plan)
    assert plan.waves is None and not plan.splits
    assert f"{plan.predicted_step_time * 1e3:.3f} ms" in out and "Plan written to" in out
    assert main(["show", str(out_plan)]) == 0
    shown = capsys.readouterr().out
    assert all(device in shown for device in plan.devices())
    assert main(["show", str(out_plan), "--profile", str(profile), "--cluster", "4xV100-nvlink"]) == 0
    assert "%" in capsys.readouterr().out
    assert main(["show", str(out_plan), "--profile", str(profile)]) == 2


def test_compare_largest_batches(capsys):
    assert main(["compare", "--synthetic", "mlp", "--cluster", "2xK80-pcie", "--max-batch"]) == 0
    assert "largest batch" in capsys.readouterr().out


def test_profile_a_saved_model(tmp_path, capsys):
    import keras

    inputs = keras.Input((6,))
    model = keras.Model(inputs, keras.layers.Dense(3, name="out")(keras.layers.Dense(8, name="hidden")(inputs)))
    model.compile(optimizer="sgd", loss="mse")
    model.save(tmp_path / "model.keras")
    assert main(["profile", str(tmp_path / "model.keras"), "--batch-size", "8", "--steps", "1",
                 "-o", str(tmp_path / "profile.json")]) == 0
    from kerasflow.planner import OpGraph

    graph = OpGraph.load(tmp_path / "profile.json")
    assert {"hidden", "out"} <= {op.layer for op in graph.ops} and graph.batch_size == 8
    assert main(["profile", str(tmp_path / "missing.keras"), "--batch-size", "8", "-o", "x.json"]) == 2
    assert main(["profile", str(tmp_path / "model.keras"), "--batch-size", "8", "--input-shape", "a,b",
                 "-o", "x.json"]) == 2


def test_profile_a_saved_model_compiled_with_xla(tmp_path):
    import keras

    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(3, name="out")])
    model.compile(optimizer="sgd", loss="mse", jit_compile=True)  # as saved on a GPU host with "auto"
    model.save(tmp_path / "model.keras")
    with pytest.warns(UserWarning, match="is profiled without XLA"):
        assert main(["profile", str(tmp_path / "model.keras"), "--batch-size", "8", "--steps", "1",
                     "-o", str(tmp_path / "profile.json")]) == 0
    assert (tmp_path / "profile.json").exists()


def test_plan_summary_on_a_known_plan():
    from kerasflow.planner import OpGraph, Shard, Waves
    from tests.planner.helpers import cluster, op

    graph = OpGraph([op("a", 1.0, [4], layer="L1"), op("b", (0.0, 1.0), [], layer="L2", batch_axis=0)],
                    [("a", "b", 0)], batch_size=2)
    c = cluster(2)
    plan = Plan(placement={"a": "/D:0", "b": "/D:0"}, splits={"L2": [Shard("/D:0", 0.5), Shard("/D:1", 0.5)]},
                waves=Waves(2, stage_maps=({}, {"/D:0": "/D:1", "/D:1": "/D:0"})), algorithm="hand",
                predicted_step_time=2.0, batch_size=2, candidates={"hand": 2.0})
    text = plan.summary(graph, c, print_fn=None)
    assert text.splitlines()[0] == 'Plan "hand", batch 2: predicted step 2000.000 ms (1 samples/s)'
    assert "L2: /D:0 50%, /D:1 50%" in text
    assert "Waves: 2 (Tick-Tock, forward offset); wave 1 runs /D:0->/D:1, /D:1->/D:0" in text
    trace = simulate(graph, c, plan).to_chrome_trace()
    names = {e["name"] for e in trace["traceEvents"] if e["ph"] == "X"}
    assert {"b@w0@s0", "b@w1@s1"} <= names  # waves and shards visible by name


@pytest.mark.parametrize("command", ["compare", "simulate", "plan", "show", "profile", "clusters", "synthetic"])
def test_every_subcommand_has_help(command, capsys):
    assert main([command, "--help"]) == 0 and "usage: kerasflow" in capsys.readouterr().out


def test_show_and_plan_reject_malformed_files(tmp_path, capsys):
    bad = tmp_path / "plan.json"
    bad.write_text('{"format_version": 1, "kind": "kerasflow.Plan", "waves": {"count": 0}}')
    assert main(["show", str(bad)]) == 2
    assert "waves.count" in capsys.readouterr().err
    profile = tmp_path / "profile.json"
    profile.write_text('{"format_version": 7}')
    assert main(["plan", str(profile), "--cluster", "2xK80-pcie", "-o", str(tmp_path / "p.json")]) == 2
    assert "format_version 7" in capsys.readouterr().err


def test_the_command_chain_from_a_saved_model_to_a_gpu_plan(tmp_path, capsys):
    # Tutorial 3's shell route: profile on this CPU, then compare, plan, show and simulate for
    # GPUs the profile has no measured costs for (estimated from its FLOPs and bytes).
    import keras

    from tests.profiling import models

    models.mlp(keras, dropout=False).save(tmp_path / "model.keras")
    profile, plan_file = str(tmp_path / "profile.json"), str(tmp_path / "plan.json")
    assert main(["profile", str(tmp_path / "model.keras"), "--batch-size", "16", "--steps", "1", "-o", profile]) == 0
    assert main(["compare", profile, "--cluster", "4xV100-nvlink"]) == 0
    assert "Costs for V100 are estimated from the profile's FLOPs and bytes" in capsys.readouterr().out
    assert main(["plan", profile, "--cluster", "4xV100-nvlink", "-o", plan_file]) == 0
    assert main(["show", plan_file]) == 0
    assert "Not checked without --profile and --cluster" in capsys.readouterr().out
    assert main(["show", plan_file, "--profile", profile, "--cluster", "4xV100-nvlink"]) == 0
    assert main(["simulate", profile, "--plan", plan_file, "--cluster", "4xV100-nvlink"]) == 0
    assert "Predicted step time" in capsys.readouterr().out
