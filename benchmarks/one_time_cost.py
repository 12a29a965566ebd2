"""What kerasflow's planning costs the user: the extra wall time of ``fit`` against plain Keras over the same steps.

For each model, in one process of its own on 4 logical CPUs: a fresh model trained ``--steps``
steps by plain Keras (the default strategy) and a fresh model trained the same steps under
``FastTStrategy()`` as a user runs it, alternating ``--rounds`` times. Both fits include Keras'
own tracing; their difference is everything kerasflow adds: the profiled steps, planning, any
retrace, timed default steps and runner-ups, and the steps after. Per model the median over
rounds of each round's difference, what ``report["plan_seconds"]`` said, the plan, how many
steps were timed beside the default placement (none when the planner kept the default placement),
and whether ``plan_seconds`` stays within the one-time budget (10 s).

``--cluster cpu-testbed:4`` plans for the 4 logical CPUs taken for independent devices instead
of the host's shared pool: ``split="auto"`` then splits, as on GPUs, so ``plan_seconds`` includes
the split search. The extra time then also counts the steps run on a plan made for devices this
host does not have (its cores are shared), so only ``plan_seconds`` is held to the budget there.

    python benchmarks/one_time_cost.py                               # the quick start's CNN + 16 tutorial patterns
    python benchmarks/one_time_cost.py --models quickstart mnist_convnet --rounds 3
    python benchmarks/one_time_cost.py --cluster cpu-testbed:4       # planned with op splitting
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

BUDGET_SECONDS = 10.0  # profiling and planning inside fit, at most (docs/benchmarks.md)


def model_and_fit(name: str):
    """``(build, fit's arguments, built)``: a function building the compiled model, ``fit``'s
    ``(args, kwargs)``, and whether to mark the model built (a tutorial model without ``call()``,
    which Keras builds under no strategy)."""
    if name == "quickstart":
        import numpy as np

        sys.path.insert(0, os.path.join(HERE, "..", "examples"))
        import quickstart

        rng = np.random.default_rng(0)
        x = rng.random((32 * 30, 32, 32, 3), dtype=np.float32)
        y = rng.integers(0, 10, 32 * 30)
        return lambda: quickstart.compiled(quickstart.inception_like()), ((x, y), {"batch_size": 32}), False
    from kerasflow.testing.tutorial_models import PATTERNS
    from kerasflow.testing.tutorial_runs import fit_arguments

    pattern = next(p for p in PATTERNS if p.name == name)
    return pattern.build, fit_arguments(pattern), not pattern.callable


def worker(name: str, rounds: int, cluster: str | None) -> dict:
    import time

    import kerasflow

    kerasflow.devices.virtual_cpus(4)
    import keras
    import tensorflow as tf

    from kerasflow.strategies.collaborators import Collaborators, stopwatch

    build, (args, kwargs), built = model_and_fit(name)
    results = {"model": name, "extra": [], "plan_seconds": [], "plans": [], "timed": []}

    def fit(strategy) -> float:
        keras.utils.set_random_seed(7)
        with strategy.scope():
            model = build()
            if built:
                model.built = True
        started = time.perf_counter()
        model.fit(*args, epochs=1, verbose=0, shuffle=False, **kwargs)
        return time.perf_counter() - started

    for _ in range(rounds):
        plain = fit(tf.distribute.get_strategy())
        timed = []

        def counting(step, plan):
            outputs, seconds = stopwatch(step, plan)
            if plan is None:
                timed.append(seconds)
            return outputs, seconds

        strategy = kerasflow.FastTStrategy(verbose=0, cluster=cluster, collaborators=Collaborators(stopwatch=counting))
        planned = fit(strategy)
        report = strategy.report
        results["extra"].append(planned - plain)
        results["plan_seconds"].append(report.get("plan_seconds"))
        plan = report.get("algorithm", "none: fit ended before the profiled steps")  # a 4-step epoch
        results["plans"].append(plan + (" (dropped)" if "plan_dropped" in report else ""))
        results["timed"].append(len(timed))
    return results


def main(argv=None) -> int:
    from kerasflow.testing.tutorial_models import PATTERNS

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["quickstart"] + [p.name for p in PATTERNS])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cluster", default=None, help="the cluster FastTStrategy plans for, e.g. cpu-testbed:4 "
                                                         "(default: the host's logical CPUs)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        print("RESULT " + json.dumps(worker(args.worker, args.rounds, args.cluster)), flush=True)
        return 0
    sys.path.insert(0, HERE)
    from _common import format_table, machine

    rows = []
    for name in args.models:
        cluster = ["--cluster", args.cluster] if args.cluster else []
        out = subprocess.run([sys.executable, __file__, "--worker", name, "--rounds", str(args.rounds), *cluster],
                             capture_output=True, text=True, cwd=HERE)
        line = next((l for l in out.stdout.splitlines() if l.startswith("RESULT ")), None)
        if line is None:
            print(f"{name} failed:\n{out.stderr[-3000:]}", flush=True)
            continue
        result = json.loads(line[7:])
        plans = sorted(set(result["plans"]))
        planned = [s for s in result["plan_seconds"] if s is not None]  # none where fit ends before planning
        plan_seconds = statistics.median(planned) if planned else None
        within = "-" if plan_seconds is None else "yes" if plan_seconds <= BUDGET_SECONDS else "NO"
        rows.append([name, f"{statistics.median(result['extra']):.1f}",
                     "-" if plan_seconds is None else f"{plan_seconds:.1f}", within, f"{max(result['timed'])}",
                     ", ".join(plans)])
        print(" | ".join(rows[-1]), flush=True)
    print()
    planned_for = f", planned for {args.cluster}" if args.cluster else ""
    print(f"The one-time cost: fit's extra wall time under FastTStrategy() against plain Keras over the same steps, "
          f"median of {args.rounds} alternating rounds, 4 logical CPUs{planned_for} ({machine()})")
    print(format_table(["model", "extra s", "plan_seconds", f"plan_seconds <= {BUDGET_SECONDS:.0f} s",
                        "default steps timed", "plan"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
