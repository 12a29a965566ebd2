"""kerasflow quick start: train an Inception-like CNN with FastTStrategy on synthetic data.

Uses every GPU when there are some, else splits the CPU into 4 logical devices. Inside one
`fit` call kerasflow profiles the step, plans it, rebuilds it and keeps training; this script
prints the plan and the measured step time before and after the rebuild.

    python examples/quickstart.py
"""

import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import kerasflow  # noqa: E402

import tensorflow as tf  # noqa: E402

if not tf.config.list_physical_devices("GPU"):
    kerasflow.devices.virtual_cpus(4)  # must run before TensorFlow starts

import keras  # noqa: E402
import numpy as np  # noqa: E402


def inception_like(classes: int = 10) -> keras.Model:
    inputs = keras.Input((32, 32, 3))
    x = keras.layers.Conv2D(32, 3, padding="same", activation="relu", name="stem")(inputs)
    for block in range(2):
        branches = [keras.layers.Conv2D(16, k, padding="same", activation="relu", name=f"b{block}_conv{k}x{k}")(x)
                    for k in (1, 3, 5)]
        branches.append(keras.layers.MaxPooling2D(3, strides=1, padding="same", name=f"b{block}_pool")(x))
        x = keras.layers.Concatenate(name=f"b{block}_join")(branches)
    x = keras.layers.GlobalAveragePooling2D(name="gap")(x)
    return keras.Model(inputs, keras.layers.Dense(classes, name="logits")(x), name="inception_like")


class StepTimes(keras.callbacks.Callback):
    """Wall time of every training step."""

    def on_train_begin(self, logs=None):
        self.ends = [time.perf_counter()]

    def on_train_batch_end(self, batch, logs=None):
        self.ends.append(time.perf_counter())


def main() -> None:
    rng = np.random.default_rng(0)
    x = rng.random((1280, 32, 32, 3), dtype=np.float32)
    y = rng.integers(0, 10, 1280)
    strategy = kerasflow.FastTStrategy(log_dir="kerasflow_logs")
    print(f"Devices: {strategy.devices}")
    with strategy.scope():
        model = inception_like()
        model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
    clock = StepTimes()
    model.fit(x, y, batch_size=32, epochs=1, callbacks=[clock], verbose=2)
    steps = np.diff(clock.ends)
    plan = strategy.plan
    if plan is None:
        print("No plan was applied (see the warning above); training ran on the default placement.")
        return
    print()
    print(f"Plan: {plan.algorithm}, {len(plan.devices())} devices, predicted step {plan.predicted_step_time * 1e3:.2f} ms")
    for name, seconds in sorted(plan.candidates.items(), key=lambda item: item[1]):
        print(f"  {name:40s} {seconds * 1e3:8.2f} ms")
    if plan.splits:
        print(f"  split layers: {', '.join(sorted(plan.splits))}")
    mismatches = strategy.placement_report()
    print(f"Ops placed where planned: {'all' if not mismatches else f'all but {len(mismatches)}'}")
    first_planned = 2 + 3  # warm-up steps + profiled steps
    before = np.median(steps[2:first_planned])
    after = np.median(steps[first_planned + 2:])
    print(f"Measured step time: {before * 1e3:.1f} ms before the rebuild, {after * 1e3:.1f} ms after "
          f"({before / after:.2f}x)")
    print("Plan, profile and timeline written to kerasflow_logs/ (open timeline.json in chrome://tracing).")


if __name__ == "__main__":
    main()
