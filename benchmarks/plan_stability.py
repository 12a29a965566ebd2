"""Does the same model, profiled again, get the same plan? The CPU testbed's models, each profiled
several times in a row as ``fit`` profiles it, each profile planned twice: ties within the fixed
3 % margin, and ties within the profile's own noise (``planning.tie_margin_for``, the default).

One process per model, with the testbed's threading (2 logical CPUs, 1 intra-op thread each, 2
inter-op threads, as ``cpu_testbed.py``'s FastTStrategy setups). Each profile is kerasflow's
in-fit sequence (``profile_training_step``: 3 profiled steps at the batch and at half of it,
the plain step timed ``PLAIN_RUNS`` times), planned as ``FastTStrategy()`` plans inside ``fit``
(no splitting, Tick-Tock as "auto", replicas unless the model has BatchNormalization). A plan
is the same as another when its kind, its placement, its replicas and its waves are.

Usage:
    python benchmarks/plan_stability.py [--models mlp cnn resnet lstm transformer] [--profiles 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

from _common import format_table, machine

HERE = os.path.dirname(os.path.abspath(__file__))


def worker(model_name: str, profiles: int) -> dict:
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    import kerasflow

    kerasflow.devices.virtual_cpus(2, intra_op_threads=1, inter_op_threads=2)
    import keras
    import numpy as np
    import tensorflow as tf

    from kerasflow.planner import Cluster, ranked_plans
    from kerasflow.planner.search.planning import TIE_MARGIN, tie_margin_for
    from kerasflow.planner.parallel.ticktock import batch_coupled_ops
    from kerasflow.profiling.profiler import profile_training_step
    from kerasflow.testing.testbed_models import build

    keras.utils.set_random_seed(0)
    with kerasflow.FastTStrategy(verbose=0).scope():
        model, (sample_x, sample_y) = build(model_name, keras)
    size = 64 if model_name == "mlp" else 32
    repeats = -(-size // len(sample_y))
    batch = tuple(tf.convert_to_tensor(np.concatenate([a] * repeats)[:size]) for a in (sample_x, sample_y))
    cluster = Cluster.preset("cpu-testbed:2")
    runs = []
    for _ in range(profiles):
        graph = profile_training_step(model, batch, device="/CPU:0", warmup_steps=1, steps=3, quiet=True)
        options = dict(split=False, tick_tock="auto", replicated=not batch_coupled_ops(graph), verbose=0)
        fixed = ranked_plans(graph, cluster, tie_margin=TIE_MARGIN, **options)[0]
        noisy = ranked_plans(graph, cluster, **options)[0]
        runs.append({"spread": graph.metadata["plain_step_spread"], "margin": tie_margin_for(graph),
                     "fixed": _identity(fixed), "noisy": _identity(noisy)})
    return {"model": model_name, "runs": runs}


def _identity(plan) -> dict:
    """What makes two plans the same plan: kind, placement, replicas and waves (not the figures)."""
    return {"algorithm": plan.algorithm, "placement": dict(plan.placement),
            "rest": [plan.data_parallel and list(plan.data_parallel.devices),
                     plan.waves and [plan.waves.count, plan.waves.offset], sorted(plan.splits)]}


def _plans(runs: list[dict], rule: str) -> tuple[str, str, str]:
    """Under ``rule``: the kinds of plan the profiles got (with counts), how many distinct plans,
    and the fewest ops any profile's plan placed as the first profile's did."""
    counts: dict[str, int] = {}
    for run in runs:
        counts[run[rule]["algorithm"]] = counts.get(run[rule]["algorithm"], 0) + 1
    kinds = ", ".join(f"{name} x{count}" for name, count in sorted(counts.items(), key=lambda item: -item[1]))
    distinct = len({json.dumps([r[rule]["algorithm"], sorted(r[rule]["placement"].items()), r[rule]["rest"]])
                    for r in runs})
    first = runs[0][rule]
    alike = min(sum(first["placement"].get(name) == device for name, device in r[rule]["placement"].items())
                for r in runs) if first["placement"] else None
    total = len(first["placement"])
    return kinds, f"{distinct} of {len(runs)}", f"{alike} of {total}" if alike is not None else "(replicas)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["mlp", "cnn", "resnet", "lstm", "transformer"])
    parser.add_argument("--profiles", type=int, default=5)
    parser.add_argument("--worker", metavar="MODEL")
    args = parser.parse_args()
    if args.worker:
        print("RESULT " + json.dumps(worker(args.worker, args.profiles)))
        return
    rows = []
    for model in args.models:
        out = subprocess.run([sys.executable, __file__, "--worker", model, "--profiles", str(args.profiles)],
                             capture_output=True, text=True, cwd=HERE)
        line = next((l for l in out.stdout.splitlines() if l.startswith("RESULT ")), None)
        if line is None:
            raise SystemExit(f"{model} failed:\n{out.stderr[-3000:]}")
        runs = json.loads(line[7:])["runs"]
        spreads = [r["spread"] for r in runs]
        print(f"{model}: spreads {spreads}, plans at 3 % {[r['fixed']['algorithm'] for r in runs]}, "
              f"within the noise {[r['noisy']['algorithm'] for r in runs]}", flush=True)
        for rule, label in (("fixed", "3 %"), ("noisy", "profile's noise")):
            margins = [0.03] if rule == "fixed" else [r["margin"] for r in runs]
            rows.append([model, label, f"{min(margins):.3f}-{max(margins):.3f}", f"{statistics.median(spreads):.3f}",
                         *_plans(runs, rule)])
    print()
    print(f"Plan stability: each model profiled {args.profiles} times in a row on 2 logical CPUs (1 intra-op thread "
          f"each), each profile planned with both tie rules ({machine()})")
    print(format_table(["model", "ties within", "tie margin", "median step spread", "plans", "distinct plans",
                        "ops placed as the first"], rows))


if __name__ == "__main__":
    main()
