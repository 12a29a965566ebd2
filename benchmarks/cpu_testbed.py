"""Measured training on this machine's CPU: FastTStrategy on 2 logical CPUs against the usual setups.

Seven setups, each in its own process (TensorFlow's threading is fixed when it starts), run
in alternation ``--rounds`` times; per setup the median over rounds of the median steady-
state step time, its ratio to the better of ``default`` and ``mirrored`` and, as the load of a
shared machine moves between processes, the median over rounds of each round's own ratio:

- ``default``: TensorFlow's default threading, one device (plain Keras: the default strategy);
- ``default_testbed_threads``: the default placement (no strategy) in a process with the
  threading of the setups below: what a FastT setup that drops its plan goes back to;
- ``mirrored``: 2 logical CPUs, 1 intra-op thread each, 2 inter-op threads, ``MirroredStrategy``;
- ``fastt``: the same 2 logical CPUs running ``FastTStrategy``'s plan (the planner takes each
  logical CPU for a device that runs one op at a time; they still share the process's 2
  inter-op threads and the 2 cores, which ``cost_model_check.py`` measures);
- ``fastt_split``: the same with op splitting on (``FastTStrategy(split=True)``);
- ``fastt_guarded``: ``FastTStrategy()`` as ``fit`` runs it for a user: the other two keep
  their plan whatever it measures (``drop_slower_plan=False``, to time the plan itself); this
  one times its plan in alternation with the default placement and drops a plan that measured
  more than 3 % slower (after one runner-up), and its later steps run on the default placement
  ("dropped" in the plan column);
- ``fastt_on``: the same with ``replicated="on"``: the planner may also give each replica its
  own BatchNormalization statistics, ``MirroredStrategy``'s math
  (``data_parallel_replica_statistics``; the losses then differ from one device's).

The other FastT setups plan with ``replicated="auto"``: their data-parallel plans keep the model's math,
the ResNet's BatchNormalization included (its replicas normalize with the whole batch's
statistics, where ``MirroredStrategy``'s use each replica's own).

For FastT it also prints the one-time cost (profile + plan, plus the extra time of the first
planned step, which retraces), the plans the rounds chose, and the planner's predicted step
time; the simulator's error is the median over rounds of each round's prediction against that
round's own measured step (rounds may choose different plans from their own profiles). A FastT
setup's steady steps start two steps after its plan's timing (``report["settled_step"]``).

Usage:
    python benchmarks/cpu_testbed.py [--models mlp cnn resnet lstm transformer] [--steps 60] [--rounds 3]

The models (``kerasflow/testing/testbed_models.py``): an MLP, an Inception-like CNN, a
ResNet-like CNN with BatchNormalization, a two-layer LSTM and a two-block Transformer.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

from _common import format_table, machine, step_durations
from budget import RESULT, Budget

HERE = os.path.dirname(os.path.abspath(__file__))
SETUPS = ("default", "default_testbed_threads", "mirrored", "fastt", "fastt_split", "fastt_guarded", "fastt_on")


def worker(setup: str, model_name: str, steps: int) -> dict:
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    sys.path.insert(0, os.path.join(HERE, ".."))
    import kerasflow

    if setup != "default":
        kerasflow.devices.virtual_cpus(2, intra_op_threads=1, inter_op_threads=2)
    import keras
    import tensorflow as tf

    from kerasflow.testing.testbed_models import build

    if setup.startswith("default"):
        strategy = tf.distribute.get_strategy()
    elif setup == "mirrored":
        strategy = tf.distribute.MirroredStrategy(["/CPU:0", "/CPU:1"])
    else:
        strategy = kerasflow.FastTStrategy(verbose=0, split=setup == "fastt_split",
                                           drop_slower_plan=setup in ("fastt_guarded", "fastt_on"),
                                           replicated="on" if setup == "fastt_on" else "auto")
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model, (sample_x, sample_y) = build(model_name, keras)
    import numpy as np

    batch = 64 if model_name == "mlp" else 32
    repeats = -(-steps * batch // len(sample_y))  # the zoo's sample batch, tiled to the steps' samples
    x = np.concatenate([sample_x] * repeats)[:steps * batch]
    y = np.concatenate([sample_y] * repeats)[:steps * batch]
    durations = step_durations(model, x, y, batch)
    result = {"setup": setup, "model": model_name, "batch": batch}
    if setup.startswith("fastt"):
        first_planned = strategy.options.warmup_steps + strategy.options.profile_steps
        # From two steps after the plan's timing (a dropped plan's first default step retraces).
        steady = durations[strategy.report.get("settled_step", first_planned) + 2:]
        dropped = "plan_dropped" in strategy.report
        result["predicted"] = strategy.plan.predicted_step_time if strategy.plan and not dropped else None
        result["algorithm"] = strategy.plan.algorithm if strategy.plan else "failed"
        result["dropped"] = dropped
        result["replaced"] = strategy.report.get("plan_replaced", "").split(": ")[0] or None
        result["one_time"] = float(durations[first_planned - 1] + durations[first_planned] - 2 * np.median(steady))
    else:
        steady = durations[5:]
    result["step"] = float(np.median(steady))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["mlp", "cnn", "resnet", "lstm", "transformer"])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--worker", nargs=2, metavar=("SETUP", "MODEL"))
    args = parser.parse_args()
    if args.worker:
        print(RESULT + json.dumps(worker(args.worker[0], args.worker[1], args.steps)))
        return
    results: dict[tuple[str, str], list[dict]] = {}
    for _ in range(args.rounds):
        for model in args.models:
            for setup in SETUPS:  # alternating, so drift hits all alike
                out = Budget(None).run([sys.executable, __file__, "--worker", setup, model, "--steps",
                                        str(args.steps)], cwd=HERE)
                if not out.ok:
                    raise SystemExit(f"{setup}/{model} {out.status}:\n{out.detail}")
                results.setdefault((model, setup), []).append(out.result)
                print(f"{model} {setup}: {results[(model, setup)][-1]}", flush=True)
    rows = []
    for model in args.models:
        default = statistics.median(r["step"] for r in results[(model, "default")])
        better = min(default, statistics.median(r["step"] for r in results[(model, "mirrored")]))
        # Each round's better baseline, for the median of the rounds' own ratios.
        better_per_round = [min(d["step"], m["step"]) for d, m in zip(results[(model, "default")],
                                                                      results[(model, "mirrored")])]
        for setup in SETUPS:
            runs = results[(model, setup)]
            step = statistics.median(r["step"] for r in runs)
            per_round = statistics.median(r["step"] / b for r, b in zip(runs, better_per_round))
            batch = runs[0]["batch"]
            extra = ["", "", "", ""]
            if setup.startswith("fastt"):
                plan = _plans(runs)
                dropped = sum(r["dropped"] for r in runs)
                if dropped:
                    plan += f" (dropped {dropped}/{len(runs)})"
                extra = [plan, f"{statistics.median(r['one_time'] for r in runs):.2f}", "", ""]
                # Each round's prediction against that round's own step (rounds may plan
                # differently); a dropped plan's prediction is not what ran.
                kept = [r for r in runs if r["predicted"] and not r["dropped"]]
                if kept:
                    predicted = statistics.median(r["predicted"] for r in kept)
                    error = statistics.median((r["predicted"] - r["step"]) / r["step"] for r in kept)
                    extra[2:] = [f"{predicted * 1e3:.2f}", f"{error * 100:+.0f}%"]
            rows.append([model, setup, str(batch), f"{step * 1e3:.2f}", f"{batch / step:,.0f}",
                         f"{default / step:.2f}x", f"{step / better:.2f}", f"{per_round:.2f}"] + extra)
    print()
    print(f"CPU testbed: 2 logical CPUs (1 intra-op thread each, 2 inter-op threads) vs default threading on one "
          f"device; medians of {args.rounds} alternating rounds of {args.steps} steps ({machine()})")
    print(format_table(["model", "setup", "batch", "step ms", "samples/s", "vs default", "step / better baseline",
                        "median of rounds' ratios", "plan", "one-time s", "predicted ms", "simulator error"], rows))


def _plans(runs: list[dict]) -> str:
    """The plans the rounds ran ("a > b": plan a measured slower and gave way to the runner-up b):
    one name when they agree, else each with its count."""
    counts: dict[str, int] = {}
    for run in runs:
        name = f"{run['replaced']} > {run['algorithm']}" if run.get("replaced") else run["algorithm"]
        counts[name] = counts.get(name, 0) + 1
    if len(counts) == 1:
        return next(iter(counts))
    return ", ".join(f"{name} x{count}" for name, count in sorted(counts.items(), key=lambda item: -item[1]))


if __name__ == "__main__":
    main()
