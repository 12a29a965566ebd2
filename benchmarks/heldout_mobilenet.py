"""The held-out MobileNetV2 of issue 32 under FastTStrategy: its losses beside plain Keras' and beside plain Keras' own rounding, and where its fit spends its time.

``keras.applications.MobileNetV2(input_shape=(32, 32, 3), alpha=0.35, weights=None, classes=10)``,
SGD(0.01), sparse categorical cross-entropy, batch 32, ``shuffle=False``, on 4 logical CPUs. Three
runs from the same seed and data: plain Keras (the default strategy); plain Keras again with
the rows of one batch in another order (``--control-batch``, by default the first planned one:
the same math, summed in another order); ``FastTStrategy()`` in its default configuration. For
each step the table gives the step's loss in each run and the relative difference of kerasflow's,
and of the control's, from plain Keras', and kerasflow's step time and phase. A model that
amplifies rounding shows differences of the same size in both columns from the same step on.

    python benchmarks/heldout_mobilenet.py               # 24 steps (several minutes on 2 cores)
    python benchmarks/heldout_mobilenet.py --steps 12
    python benchmarks/heldout_mobilenet.py --cluster cpu-testbed:4 --algorithm cpop   # a CPOP plan, kept

With ``--algorithm`` the planner's only plan is that list schedule's (with its order), planned
for ``--cluster``, and kept whatever it measures (``drop_slower_plan=False``); the table then
also gives the fused kernels the planned step ran beside plain Keras' step's.
"""

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import kerasflow  # noqa: E402

kerasflow.devices.virtual_cpus(4)

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from kerasflow.planner import cpop, heft  # noqa: E402
from kerasflow.strategies import Collaborators  # noqa: E402
from kerasflow.strategies.readback import fused_kernel_count  # noqa: E402
from kerasflow.testing.first_step import first_step_recorder  # noqa: E402

BATCH = 32
SCHEDULES = {"heft": heft, "cpop": cpop}


class StepLog(keras.callbacks.Callback):
    """Each step's own loss (Keras logs the epoch's running mean), its seconds and the driver's phase."""

    def __init__(self, strategy=None):
        super().__init__()
        self.strategy, self.losses, self.seconds, self.phases = strategy, [], [], []

    def on_train_batch_begin(self, batch, logs=None):
        self.started = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        self.seconds.append(time.perf_counter() - self.started)
        mean = float(logs["loss"])
        self.losses.append(mean * (batch + 1) - sum(self.losses))
        driver = self.strategy._driver_of() if self.strategy is not None else None
        self.phases.append(driver.state.name if driver is not None else "-")


def data(steps: int, control_batch: int | None):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((steps * BATCH, 32, 32, 3)).astype("float32")
    y = rng.integers(0, 10, steps * BATCH)
    if control_batch is not None:  # the same rows, in another order: the same math, other rounding
        rows = slice(control_batch * BATCH, (control_batch + 1) * BATCH)
        order = np.random.default_rng(1).permutation(BATCH)
        x[rows], y[rows] = x[rows][order], y[rows][order]
    return x, y


def run(strategy, steps: int, control_batch: int | None = None, callbacks=()) -> StepLog:
    keras.utils.set_random_seed(7)
    with strategy.scope():
        model = keras.applications.MobileNetV2(input_shape=(32, 32, 3), alpha=0.35, weights=None, classes=10)
        model.compile(optimizer=keras.optimizers.SGD(0.01), loss="sparse_categorical_crossentropy")
    log = StepLog(strategy if isinstance(strategy, kerasflow.FastTStrategy) else None)
    x, y = data(steps, control_batch)
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=[log, *callbacks])
    return log


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--control-batch", type=int, default=5, help="the batch whose rows the control reorders")
    parser.add_argument("--cluster", default=None, help="the cluster preset to plan for (default: the logical CPUs)")
    parser.add_argument("--algorithm", choices=sorted(SCHEDULES), default=None,
                        help="plan with this list schedule only, and keep its plan")
    args = parser.parse_args(argv)
    tf.config.set_soft_device_placement(False)
    recorder = first_step_recorder()
    plain = run(tf.distribute.get_strategy(), args.steps, callbacks=[recorder])
    control = run(tf.distribute.get_strategy(), args.steps, args.control_batch)
    options = {"cluster": args.cluster} if args.cluster else {}
    if args.algorithm:
        schedule = SCHEDULES[args.algorithm]
        options.update(drop_slower_plan=False, collaborators=Collaborators(planner=lambda request: [schedule(request.graph, request.cluster)]))
    strategy = kerasflow.FastTStrategy(verbose=0, **options)
    started = time.perf_counter()
    planned = run(strategy, args.steps)
    whole = time.perf_counter() - started
    print(f"Held-out MobileNetV2, {args.steps} steps of {BATCH}: per-step loss, relative difference from plain "
          f"Keras (control: batch {args.control_batch}'s rows reordered)")
    print(f"{'step':>4s} {'phase':10s} {'plain':>9s} {'kerasflow':>9s} {'diff':>9s} {'control':>9s} {'diff':>9s} "
          f"{'seconds':>8s}")
    for step in range(args.steps):
        p, k, c = plain.losses[step], planned.losses[step], control.losses[step]
        print(f"{step:4d} {planned.phases[step]:10s} {p:9.5f} {k:9.5f} {abs(k - p) / abs(p):9.2e} {c:9.5f} "
              f"{abs(c - p) / abs(p):9.2e} {planned.seconds[step]:8.2f}")
    report = strategy.report
    print(f"FastTStrategy's fit: {whole:.1f} s; plain Keras' {sum(plain.seconds):.1f} s. Plan: "
          f"{report.get('algorithm')}, {'in force' if strategy.plan_in_force else 'not in force'}"
          f"{'; dropped: ' + report['plan_dropped'] if 'plan_dropped' in report else ''}")
    placement = strategy.placement_report()
    if placement is not None and placement.fused_kernels is not None:
        print(f"Fused kernels: the planned step {placement.fused_kernels}, plain Keras' step "
              f"{fused_kernel_count(recorder.partition_graphs)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
