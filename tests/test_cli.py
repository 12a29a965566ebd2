"""Tests of the kerasflow command on small files, malformed input included."""

import json

import pytest

from kerasflow.cli import main
from kerasflow.planner import Cluster, plan, synthetic


def test_compare_prints_every_strategy_and_the_plan(capsys):
    assert main(["compare", "--synthetic", "mlp", "--cluster", "2xK80-pcie"]) == 0
    out = capsys.readouterr().out
    for row in ("single device", "data-parallel", "layer-wise model-parallel", "HEFT", "CPOP",
                "kerasflow plan (", "lower bound"):
        assert row in out


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
