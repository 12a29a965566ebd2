"""The model zoo's cached graphs load without TensorFlow, and the report regenerates from them."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import zoo  # noqa: E402


@pytest.mark.parametrize("name", sorted(zoo.WORKLOADS))
def test_every_cached_zoo_graph_is_a_valid_training_step(name):
    graph = zoo.graph(name)  # raises FileFormatError on a stale or broken cache
    assert graph.batch_size == zoo.WORKLOADS[name].batch
    phases = {op.phase for op in graph.ops}
    assert {"forward", "backward", "update"} <= phases
    assert set(zoo.KINDS) <= set(graph.device_kinds())
    # FLOPs are affine in the batch: the traced convolutions and products grow with it.
    assert sum(op.flops.per_sample for op in graph.ops) > 1e6


def test_the_report_regenerates_from_the_cache(tmp_path):
    out = tmp_path / "benchmarks.md"
    run = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "report.py"), "--workloads", "vgg16",
                          "--presets", "4xV100-pcie", "--testbed-rounds", "0", "--memory-limit", "4e9",
                          "--out", str(out)], capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PYTHONPATH": ROOT}, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    text = out.read_text()
    for heading in ("## Headline", "## Planner speed (measured)", "### 4xV100-pcie",
                    "## Under a binding memory budget", "## CPU testbed (measured)", "## Published figures"):
        assert heading in text
    row = next(line for line in text.splitlines() if line.startswith("vgg16") and "x" in line)
    assert "yes" in row  # FastT never worse than the best baseline



def test_planner_speed_times_two_checkouts_in_alternating_pairs():
    # This checkout against itself: both plan the same graph the same way.
    run = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "planner_speed.py"), "--sizes", "200",
                          "--devices", "2", "--split-limit", "200", "--rounds", "2", "--against", ROOT],
                         capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": ROOT})
    assert run.returncode == 0, run.stderr[-3000:]
    rows = [line.split() for line in run.stdout.splitlines() if "|" not in line and line.endswith("same")]
    assert [row[2] for row in rows] == ["no", "yes"]  # without and with splitting, the same plan
    assert all(float(row[5]) > 0 for row in rows)  # the ratio of the pairs' medians


def test_the_report_counts_one_copy_data_parallel_among_the_plans_with_waves():
    import report
    from kerasflow.planner import DataParallel, Plan, Waves

    plans = {"data_parallel": Plan(data_parallel=DataParallel(("/GPU:0", "/GPU:1")), predicted_step_time=2.0),
             "one_copy_data_parallel": Plan(waves=Waves(2, "none"), predicted_step_time=1.0),
             "heft+waves": Plan(waves=Waves(2), predicted_step_time=0.5)}
    # For a model with BatchNormalization plan() tries no waves: FastT, plan() and 1 replica are chosen from these.
    assert report.without_waves(plans) == {"data_parallel": 2.0}


def test_the_vocabulary_bound_shrinks_the_weights_of_the_vocabulary_layers_only():
    import vocabulary_bound

    graph = zoo.graph("rnnlm")
    cheaper = vocabulary_bound.sharded_weights(graph, ("softmax",), 4)
    shrunk = 0
    for before, after in zip(graph.ops, cheaper.ops):
        for old, new in zip(before.output_bytes, after.output_bytes, strict=True):
            if before.layer == "softmax" and not old.scales_with_batch and old.fixed > 0:
                assert new.fixed == old.fixed / 4
                shrunk += 1
            else:
                assert new == old
    assert shrunk > 0 and cheaper.edges == graph.edges and cheaper.metadata == graph.metadata


def test_a_calibration_records_its_kinds_trusted_gain_beside_the_others(tmp_path):
    import shutil

    import calibration

    from kerasflow.planner import Plan
    from kerasflow.strategies.verdict import TRUSTED_GAINS_FILE, needs_confirmation, trusted_gains

    path = str(tmp_path / "trusted_gains.json")
    shutil.copy(TRUSTED_GAINS_FILE, path)
    # Two models' tables: the worst plan measured 1.8x its prediction; the default placement's
    # and plan()'s cells do not count, nor a setup that failed.
    results = [{"setups": {"default": {"measured": 3.0, "predicted": 1.0}, "heft": {"measured": 1.5, "predicted": 1.0},
                           "plan()": {"measured": 5.0, "predicted": 1.0, "pick": "default_placement"}}},
               {"setups": {"data_parallel": {"measured": 0.9, "predicted": 0.5}, "heft+split": {"error": "no plan"}}}]
    worst = calibration.worst_ratio(results)
    assert worst == pytest.approx(1.8)
    calibration.write_trusted_gain(path, "H100", worst, "by hand")
    assert trusted_gains(path) == {**trusted_gains(), "H100": 0.8}  # the CPU's entry kept
    plan = Plan(placement={}, predicted_step_time=0.010, candidates={"default_placement": 0.0181})
    assert needs_confirmation(plan, ["H100"]) and not needs_confirmation(plan, ["H100"], trusted_gains(path))
    assert not os.path.exists(path + ".partial")


def _alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie, killed and not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_budget_kills_a_hung_process_and_what_it_started_at_its_limit(tmp_path):
    import time

    from budget import Budget

    # The hung process starts another that holds its output open: killing the first alone would
    # leave the wait for the second's 60 s.
    pid_file = tmp_path / "grandchild"
    script = ("import subprocess, sys, time; child = subprocess.Popen([sys.executable, '-c', "
              "'import time; time.sleep(60)']); open(sys.argv[1], 'w').write(str(child.pid)); time.sleep(60)")
    started = time.monotonic()
    outcome = Budget(60.0).run([sys.executable, "-c", script, str(pid_file)], limit=3.0)
    assert outcome.status == "hung" and outcome.result is None and "killed after 3 s" in outcome.detail
    assert time.monotonic() - started < 10
    deadline = time.monotonic() + 5
    while _alive(int(pid_file.read_text())) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(int(pid_file.read_text()))


def test_a_budget_reads_results_names_failures_and_starts_nothing_once_spent():
    from budget import Budget

    budget = Budget(30.0)
    assert budget.run([sys.executable, "-c", "print('noise'); print('RESULT {\"step\": 0.25}')"]).result == {"step": 0.25}
    failed = budget.run([sys.executable, "-c", "import sys; sys.exit('no GPU answered')"])
    assert failed.status == "failed" and "no GPU answered" in failed.detail
    clock = iter([0.0, 31.0, 31.0])  # made at 0 s, asked at 31 s: a 30-second budget is spent
    spent = Budget(30.0, clock=lambda: next(clock))
    assert spent.spent() and spent.run([sys.executable, "-c", "print('RESULT {}')"]).status == "skipped"


def test_the_gpu_check_keeps_to_its_budget_and_still_prints_its_table(tmp_path):
    import time

    # One second is spent describing the devices (TensorFlow alone takes longer to start): that
    # process is killed, no setup starts, and the table and the calibration's line still print.
    started = time.monotonic()
    run = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "gpu_check.py"), "--models", "mlp",
                          "--budget-s", "1", "--profile-dir", str(tmp_path / "profile")],
                         capture_output=True, text=True, timeout=120)
    assert time.monotonic() - started < 20, run.stdout
    assert run.returncode == 1, run.stdout + run.stderr
    assert "Describing the devices: hung (killed after 1 s)" in run.stdout
    for setup in ("default", "default_xla", "mirrored", "fastt", "fastt_callback"):
        assert any(line.split()[:3] == ["mlp", setup, "not"] for line in run.stdout.splitlines()), run.stdout
    assert "The calibration table is left out: the 1-second budget is spent." in run.stdout


@pytest.mark.slow
def test_a_hung_gpu_check_setup_is_killed_reported_and_the_others_measured(tmp_path):
    # The MirroredStrategy setup's process sleeps for ever, as one stuck on a GPU would: it is
    # killed at its limit, its row says so, and every other setup of the model is measured.
    run = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "gpu_check.py"), "--models", "mlp",
                          "--steps", "14", "--rounds", "1", "--calibration-rounds", "0", "--setup-limit-s", "90",
                          "--stall", "mirrored", "--profile-dir", str(tmp_path / "profile")],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "mlp mirrored: hung (killed after 90 s)" in run.stderr
    rows = {line.split()[1]: line.split() for line in run.stdout.splitlines() if line.startswith("mlp ")}
    assert rows["mirrored"][2] == "hung"
    for setup in ("default", "default_xla", "fastt", "fastt_callback"):
        assert rows[setup][2] == "64" and float(rows[setup][3]) > 0, run.stdout
