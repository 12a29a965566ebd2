"""Multi-host figures: a plan across tasks on loopback (measured), and 2x8xV100 on the model zoo (simulated).

1. Measured, on this machine: two ``python -m kerasflow.worker`` processes (2 logical CPUs
   each) and a chief connected through ``TF_CONFIG`` train the Inception-like CNN of
   ``kerasflow.testing.testbed_models`` with ``FastTStrategy``; the network figure is given as
   fast (20 us, 5 GB/s) so that the plan spans the tasks. The same plan, its devices renamed
   (``Plan.with_devices``), then runs in one process on 5 logical CPUs. Medians of the steady
   step times over ``--rounds`` alternating rounds: what crossing tasks through gRPC costs.
   The network measured over loopback is printed too.
2. Simulated: for every workload of the model zoo, the predicted step time of kerasflow's plan
   on two hosts of 8 V100s (``2x8xV100``: NVLink inside a host, 100 Gb/s Ethernet between)
   against data parallelism on one host (``8xV100-nvlink``) and on both hosts.

Usage:
    python benchmarks/multihost.py [--rounds 3] [--steps 40] [--workloads vgg16 gnmt ...] [--skip-loopback]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

from _common import format_table, machine, step_durations
from budget import RESULT, Budget

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BATCH = 32


def _train(strategy, steps: int) -> float:
    """Trains the CNN under ``strategy`` for ``steps`` steps; the median steady step time."""
    import keras
    import numpy as np

    from kerasflow.testing.testbed_models import build

    keras.utils.set_random_seed(0)
    with strategy.scope():
        model, _ = build("cnn", keras)
    rng = np.random.default_rng(0)
    x = rng.random((steps * BATCH, 32, 32, 3), dtype=np.float32)
    y = rng.integers(0, 10, steps * BATCH)
    durations = step_durations(model, x, y, BATCH)
    planned_from = strategy.options.warmup_steps + strategy.options.profile_steps
    return float(np.median(durations[planned_from + 3:]))


def chief(steps: int, plan_path: str) -> dict:
    """Runs in the chief's process (TF_CONFIG set by ``loopback``)."""
    import kerasflow
    from kerasflow.multihost import multihost_cluster, task_of

    strategy = kerasflow.FastTStrategy(inter_host_link=(20e-6, 5e9), verbose=0, drop_slower_plan=False)
    step = _train(strategy, steps)
    strategy.plan.save(plan_path)
    devices = strategy.devices
    other = next(d for d in devices if task_of(d) != task_of(devices[0]))
    link = multihost_cluster(devices).link(devices[0], other)
    return {"step": step, "devices": devices, "algorithm": strategy.plan.algorithm,
            "predicted": strategy.plan.predicted_step_time,
            "tasks": sorted({task_of(d) for d in strategy.plan.devices()}),
            "loopback": [link.latency, link.bandwidth]}


def one_task(steps: int, plan_path: str, devices: list[str]) -> dict:
    import kerasflow
    from kerasflow.planner import Plan

    local = kerasflow.devices.virtual_cpus(len(devices))
    plan = Plan.load(plan_path).with_devices(dict(zip(devices, local)))
    strategy = kerasflow.FastTStrategy(plan=plan, verbose=0)
    return {"step": _train(strategy, steps)}


def _run(args: list[str], env: dict) -> dict:
    out = Budget(None).run([sys.executable, __file__] + args, cwd=HERE, env=env, limit=900)
    if not out.ok:
        raise SystemExit(f"{args[:2]} {out.status}:\n{out.detail}")
    return out.result


def loopback(rounds: int, steps: int) -> list[str]:
    from kerasflow.worker import local_cluster

    base_env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    base_env.pop("TF_CONFIG", None)
    cross, local = [], []
    with local_cluster(2, virtual_cpus=2) as cluster, tempfile.TemporaryDirectory() as folder:
        plan_path = os.path.join(folder, "plan.json")
        chief_env = dict(base_env, TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": "chief", "index": 0}}))
        for _ in range(rounds):  # alternating, so drift hits both alike
            cross.append(_run(["--chief", plan_path, "--steps", str(steps)], chief_env))
            print(f"across tasks: {cross[-1]}", flush=True)
            local.append(_run(["--one-task", plan_path, "--steps", str(steps), "--devices"] + cross[-1]["devices"],
                              base_env))
            print(f"one task: {local[-1]}", flush=True)
    step_cross = statistics.median(r["step"] for r in cross)
    step_local = statistics.median(r["step"] for r in local)
    latency, bandwidth = cross[-1]["loopback"]
    rows = [["across 3 tasks (chief + 2 workers)", f"{step_cross * 1e3:.2f}", f"{BATCH / step_cross:,.0f}", "1.00x"],
            ["same plan, one task (5 logical CPUs)", f"{step_local * 1e3:.2f}", f"{BATCH / step_local:,.0f}",
             f"{step_cross / step_local:.2f}x"]]
    return [f"Loopback: Inception-like CNN (batch {BATCH}), plan {cross[-1]['algorithm']!r} over "
            f"{len(cross[-1]['tasks'])} tasks, predicted {cross[-1]['predicted'] * 1e3:.2f} ms; medians of {rounds} "
            f"alternating rounds of {steps} steps (measured; {machine()})",
            format_table(["setup", "step ms", "samples/s", "cross-task / one-task"], rows),
            f"Network measured over loopback (chief -> worker): latency {latency * 1e6:.0f} us, bandwidth "
            f"{bandwidth / 1e9:.2f} GB/s."]


def zoo_on_two_hosts(workloads: list[str], split_evaluations: int) -> list[str]:
    import zoo
    from kerasflow.planner import Cluster, baselines, plan

    two, one = Cluster.preset("2x8xV100"), Cluster.preset("8xV100-nvlink")
    rows = []
    for name in workloads:
        graph = zoo.graph(name)
        started = time.perf_counter()
        best = plan(graph, two, max_split_evaluations=split_evaluations, verbose=0)
        seconds = time.perf_counter() - started
        dp_one = baselines.data_parallel(graph, one).predicted_step_time
        dp_two = best.candidates.get("data_parallel")
        hosts = {two.device(d).host for d in best.devices()}
        rows.append([name, f"{dp_one * 1e3:.2f}", f"{dp_two * 1e3:.2f}" if dp_two else "n/a",
                     f"{best.predicted_step_time * 1e3:.2f}", best.algorithm, str(len(hosts)),
                     f"{dp_one / best.predicted_step_time:.2f}x", f"{seconds:.1f}"])
        print(" | ".join(rows[-1]), flush=True)
    return [f"Model zoo on two hosts (simulated; planned on {machine()})",
            format_table(["workload", "DP 8xV100-nvlink ms", "DP 2x8xV100 ms", "plan 2x8xV100 ms", "plan",
                          "hosts used", "plan vs 1-host DP", "plan s"], rows)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--workloads", nargs="+", default=None)
    parser.add_argument("--split-evaluations", type=int, default=16)
    parser.add_argument("--skip-loopback", action="store_true")
    parser.add_argument("--chief", metavar="PLAN", help=argparse.SUPPRESS)
    parser.add_argument("--one-task", metavar="PLAN", help=argparse.SUPPRESS)
    parser.add_argument("--devices", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.chief:
        print(RESULT + json.dumps(chief(args.steps, args.chief)))
        return
    if args.one_task:
        print(RESULT + json.dumps(one_task(args.steps, args.one_task, args.devices)))
        return
    import zoo

    lines = [] if args.skip_loopback else loopback(args.rounds, args.steps) + [""]
    lines += zoo_on_two_hosts(args.workloads or list(zoo.WORKLOADS), args.split_evaluations)
    print()
    print("\n".join(lines))


if __name__ == "__main__":
    main()
