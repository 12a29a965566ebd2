"""What a plan's per-device order costs: HEFT's plan with its order against the same placement without it.

The order is applied as control edges, and TensorFlow's graph optimizer fuses a convolution or
matmul with its bias and activation (and a filter's gradient with its bias') only when no
control edge touches the chain; the applier leaves fused chains out of the order
(``graphtables.FUSED_GROUP``). Before it did, the HEFT plan of the zoo's Inception-like CNN
measured 41 ms a step with its order and 27 ms without (``calibration.py``).

Per model, in one process on 4 logical CPUs (``kerasflow.devices.virtual_cpus(4)``,
TensorFlow's default threading), three setups: ``FastTStrategy`` with HEFT's plan and its order
(the planner's own ranking drops an order that simulates slower than none: the plan is forced
here, and kept with ``drop_slower_plan=False``), the same plan without its order (the same
placement: the first setup's plan, ``order={}``), and plain Keras (the default placement). A
first round profiles, plans and retraces; then ``--rounds`` alternating rounds of ``--steps``
steps, each round starting with another setup. Prints per setup the median over rounds of each
round's median step, and the fused kernels its step ran (``PlacementReport.fused_kernels``;
``fused_kernel_count`` for plain Keras' first step); then per model the ratio with / without
the order (the median over rounds of each round's own ratio, as the load of a shared machine
moves) and whether it is within 5 %.

    python benchmarks/order_cost.py                            # the CNN, 9 rounds of 30 steps
    python benchmarks/order_cost.py --models cnn mlp --rounds 5 --steps 20
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from _common import format_table, machine, step_durations  # noqa: E402

from kerasflow.testing.first_step import first_step_recorder  # noqa: E402

SETUPS = ("with order", "without order", "default")
FIRST_ROUND = 20  # steps: warm-up, profile, plan, the plan's timing beside the default placement
SETTLED = 1  # steps left out at the start of each round's fit (the iterator's first batch)
WITHIN = 0.05  # the order may cost at most this much of the step


def measure(name: str, rounds: int, steps: int) -> dict:
    """Times the three setups of the zoo model ``name`` in alternating rounds (see the module's
    docstring).

    Returns:
        ``{"steps": setup -> each round's median step (s), "ratios": each round's step with /
        without the order, "fused_kernels": setup -> count, "devices": the plan's devices}``.
    """
    import keras
    import numpy as np
    from keras.src.utils import naming

    import kerasflow
    from kerasflow.planner import heft
    from kerasflow.strategies import Collaborators
    from kerasflow.strategies.readback import fused_kernel_count
    from kerasflow.testing.testbed_models import build

    made = {}  # the plan the first setup made, for the second

    def heft_with_its_order(request):
        made["plan"] = heft(request.graph, request.cluster)
        return [made["plan"]]

    def same_placement_without_order(request):
        return [dataclasses.replace(made["plan"], order={})]

    first_step = first_step_recorder()  # plain Keras' step's fused kernels

    models, strategies = {}, {}
    for setup, planner in zip(SETUPS, (heft_with_its_order, same_placement_without_order, None)):
        naming.reset_uids()  # Keras' names start afresh: both planned models' ops have the plan's names
        keras.utils.set_random_seed(0)
        strategy = kerasflow.FastTStrategy(verbose=0, warmup_steps=2, profile_steps=1, drop_slower_plan=False,
                                           collaborators=Collaborators(planner=planner)) if planner else None
        with strategy.scope() if strategy else contextlib.nullcontext():
            models[setup], (x, y) = build(name, keras)
        strategies[setup] = strategy
    batch = len(y)

    def steps_of(setup: str, count: int, callbacks=()) -> list[float]:
        """Each step's seconds over ``count`` steps of the zoo's batch (``build``'s data, one batch)."""
        return list(step_durations(models[setup], np.concatenate([x] * count), np.concatenate([y] * count), batch,
                                   callbacks))

    for setup in SETUPS:  # round 0: profiles, plans (the first setup's plan before the second's), retraces
        steps_of(setup, FIRST_ROUND, [first_step] if setup == "default" else [])
        strategy = strategies[setup]
        if strategy is not None:
            report = strategy.placement_report()
            if not (strategy.plan_in_force and report == [] and report.not_applied == []):
                raise SystemExit(f"{name}, {setup}: the plan is not applied as made: {report.summary()}")
    fused = {setup: (strategies[setup].placement_report().fused_kernels if strategies[setup]
                     else fused_kernel_count(first_step.partition_graphs)) for setup in SETUPS}
    measured = {setup: [] for setup in SETUPS}
    for number in range(rounds):
        for setup in SETUPS[number % len(SETUPS):] + SETUPS[:number % len(SETUPS)]:  # each round starts elsewhere
            measured[setup].append(statistics.median(steps_of(setup, steps + SETTLED)[SETTLED:]))
    ratios = [a / b for a, b in zip(measured["with order"], measured["without order"])]
    return {"steps": measured, "ratios": ratios, "fused_kernels": fused, "devices": made["plan"].devices()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["cnn"], choices=["cnn", "mlp"])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args(argv)
    import kerasflow

    kerasflow.devices.virtual_cpus(4)
    rows, summary = [], []
    for name in args.models:
        started = time.perf_counter()
        result = measure(name, args.rounds, args.steps)
        for setup in SETUPS:
            rows.append([name, setup, f"{statistics.median(result['steps'][setup]) * 1e3:.2f}",
                         str(result["fused_kernels"][setup])])
        ratio = statistics.median(result["ratios"])
        summary.append([name, f"{statistics.median(result['steps']['with order']) * 1e3:.2f}",
                        f"{statistics.median(result['steps']['without order']) * 1e3:.2f}", f"{ratio:.3f}",
                        "yes" if ratio <= 1 + WITHIN else "no", str(args.rounds),
                        f"{len(result['devices'])}", f"{time.perf_counter() - started:.0f}"])
    print(f"Step time (ms), medians of {args.rounds} alternating rounds of {args.steps} steps, HEFT's plan, "
          f"4 logical CPUs ({machine()})")
    print(format_table(["model", "setup", "step", "fused kernels"], rows))
    print()
    print(format_table(["model", "with order", "without order", "ratio (median of rounds)",
                        f"within {WITHIN:.0%}", "rounds", "plan's devices", "seconds"], summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
