"""Where the simulator's cost model parts from the CPU testbed: predicted against measured per plan.

The testbed (``cpu_testbed.py``) treats each of 2 logical CPUs (1 intra-op thread each, 2
inter-op threads shared by the process) as a device that runs one op at a time. This script
checks that premise on one model, in one process:

- ``kernel sum / plain step``: the profiled kernel times of one step added up, against the
  wall time of the same step on one logical CPU. Above 1, ops overlapped on the shared
  inter-op threads, which a one-op-at-a-time device never does.
- per setup, the simulator's prediction from that profile against the median steady step
  measured in ``fit``, in alternating rounds: ``default`` is the model on TensorFlow's own
  placement over the logical CPUs (no strategy); ``single`` and ``data_parallel`` are
  ``FastTStrategy`` running those plans (``kerasflow.planner.parallel.baselines``), each built from a
  profile of its own model; ``planned`` is the plan ``kerasflow.plan`` picks from that profile.

Usage:
    cd benchmarks && python cost_model_check.py [--model lstm] [--rounds 4] [--steps 30]

Models as in ``profile_zoo.py`` (``kerasflow/testing/testbed_models.py``). About 2 to 4 minutes
per model on 2 cores.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from _common import format_table, machine, step_durations  # noqa: E402

SETUPS = ("default", "single", "data_parallel", "planned")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="lstm")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()

    import kerasflow

    kerasflow.devices.virtual_cpus(2, intra_op_threads=1, inter_op_threads=2)
    import keras
    import numpy as np

    from kerasflow.planner import Cluster, baselines
    from kerasflow.profiling import profile_model
    from kerasflow.testing.testbed_models import build

    batch = 64 if args.model == "mlp" else 32
    cluster = Cluster.preset("cpu-testbed:2")
    keras.utils.set_random_seed(0)
    models, predicted, algorithms = {}, {}, {}
    for setup in SETUPS:
        strategy = None if setup == "default" else kerasflow.FastTStrategy(verbose=0)
        with strategy.scope() if strategy else contextlib.nullcontext():
            model, (sample_x, sample_y) = build(args.model, keras)
        graph = profile_model(model, (sample_x[:batch], sample_y[:batch]), verbose=False)
        if setup == "default":
            kernel_sum = sum(op.duration("CPU", batch) for op in graph.ops)
            plain = graph.metadata["plain_step_seconds"]
            plan = baselines.single_device(graph, cluster, batch=batch)
        elif setup == "planned":
            plan = kerasflow.plan(graph, cluster)
        else:
            plan = getattr(baselines, "single_device" if setup == "single" else "data_parallel")(
                graph, cluster, batch=batch)
        if strategy is not None:
            strategy.use_plan(plan)
        models[setup], predicted[setup], algorithms[setup] = model, plan.predicted_step_time, plan.algorithm
    repeats = -(-args.steps * batch // len(sample_y))
    x = np.concatenate([sample_x] * repeats)[:args.steps * batch]
    y = np.concatenate([sample_y] * repeats)[:args.steps * batch]
    measured: dict[str, list[float]] = {setup: [] for setup in SETUPS}
    for _ in range(args.rounds):
        for setup in SETUPS:  # alternating, so drift hits all alike
            measured[setup].append(float(np.median(step_durations(models[setup], x, y, batch)[5:])))
    rows = []
    for setup in SETUPS:
        step = statistics.median(measured[setup][1:] or measured[setup])  # the first round warms up
        error = (predicted[setup] - step) / step * 100
        rows.append([setup, algorithms[setup] if setup != "default" else "(TensorFlow's)", f"{predicted[setup] * 1e3:.2f}",
                     f"{step * 1e3:.2f}", f"{error:+.0f}%"])
    print()
    print(f"Cost model check, {args.model}, batch {batch}: 2 logical CPUs (1 intra-op thread each, 2 inter-op threads); "
          f"medians of {args.rounds - 1 if args.rounds > 1 else 1} alternating rounds of {args.steps} steps ({machine()})")
    print(f"kernel sum {kernel_sum * 1e3:.2f} ms / plain step {plain * 1e3:.2f} ms on one logical CPU = "
          f"{kernel_sum / plain:.2f}")
    print("(the 'default' row's prediction is the single-device plan's: one op at a time on one device)")
    print(format_table(["setup", "plan", "predicted ms", "measured ms", "simulator error"], rows))


if __name__ == "__main__":
    main()
