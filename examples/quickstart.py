"""kerasflow quick start: train an Inception-like CNN with FastTStrategy on synthetic data.

Uses every GPU when there are some, else splits the CPU into 4 logical devices. The script
first trains the model for a few steps as plain Keras does (the default placement, no
profiler) and under tf.distribute.MirroredStrategy on the same devices, then with
FastTStrategy: inside that one `fit` call kerasflow warms up, profiles the step, plans it (in
a process of its own, while the steps go on), rebuilds it and keeps training. It prints the plan, whether it is in force, the one-time
cost and the three measured step times side by side. On logical CPUs, which share one host's
cores, the planner usually keeps the default placement (no plan is predicted faster there, so
none is tried); then, or when a plan measured slower and was dropped, it prints what the planner
predicts for the model on four V100 GPUs instead, marked as simulated.

    python examples/quickstart.py
"""

import contextlib
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import kerasflow  # noqa: E402

import tensorflow as tf  # noqa: E402

if not tf.config.list_physical_devices("GPU"):
    kerasflow.devices.virtual_cpus(4)  # must run before TensorFlow starts

import keras  # noqa: E402
import numpy as np  # noqa: E402

BATCH, STEPS = 32, 60
SIMULATED_CLUSTER = "4xV100-nvlink"  # shown when no plan runs here


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


def compiled(model: keras.Model) -> keras.Model:
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


class StepTimes(keras.callbacks.Callback):
    """Wall time of every training step."""

    def on_train_begin(self, logs=None):
        self.ends = [time.perf_counter()]

    def on_train_batch_end(self, batch, logs=None):
        self.ends.append(time.perf_counter())

    def steps(self) -> np.ndarray:
        return np.diff(self.ends)


def baseline_step(distribution, x, y) -> float:
    """Median step time of 15 steps of the model trained without kerasflow (steps 0-2 trace and warm up)."""
    clock = StepTimes()
    with distribution.scope() if distribution is not None else contextlib.nullcontext():
        model = compiled(inception_like())
    model.fit(x[:BATCH * 15], y[:BATCH * 15], batch_size=BATCH, epochs=1, callbacks=[clock], verbose=2)
    return float(np.median(clock.steps()[3:]))


def simulated_on(preset: str, profile) -> str:
    """What kerasflow's planner predicts for this model on ``preset``: the profile's ops priced
    from their FLOPs and bytes on that preset's GPUs (a roofline on datasheet figures)."""
    cluster = kerasflow.Cluster.preset(preset)
    graph = kerasflow.profiling.estimate_costs(profile, cluster.devices[0].kind)
    plan = kerasflow.plan(graph, cluster)
    one_gpu = plan.candidates["single_device"]
    return (f"Simulated, not measured: on {preset}, kerasflow.plan predicts {plan.algorithm} at "
            f"{plan.predicted_step_time * 1e3:.2f} ms a step against {one_gpu * 1e3:.2f} ms on one of those GPUs "
            f"({one_gpu / plan.predicted_step_time:.2f}x; `kerasflow compare kerasflow_logs/profile.json "
            f"--cluster {preset}` shows every strategy).")


def main() -> None:
    rng = np.random.default_rng(0)
    x = rng.random((BATCH * STEPS, 32, 32, 3), dtype=np.float32)
    y = rng.integers(0, 10, BATCH * STEPS)

    print("Default placement (plain Keras, no profiler):")
    default_step = baseline_step(None, x, y)
    strategy = kerasflow.FastTStrategy(log_dir="kerasflow_logs")
    print(f"\nMirroredStrategy on {strategy.devices}:")
    mirrored_step = baseline_step(tf.distribute.MirroredStrategy(strategy.devices), x, y)
    print(f"\nFastTStrategy on {strategy.devices}:")
    with strategy.scope():
        model = compiled(inception_like())
    clock = StepTimes()
    model.fit(x, y, batch_size=BATCH, epochs=1, callbacks=[clock], verbose=2)

    plan, report = strategy.plan, strategy.placement_report()
    dropped = strategy.report.get("plan_dropped")  # it measured slower than the default placement
    kept_default = report is not None and report.default_kept  # no plan predicted enough faster: none tried
    if plan is None or report is None or not (report.in_force or dropped or kept_default):
        reason = report.fallback if report is not None else "no plan was made"
        print(f"\nThe plan is not in force ({reason}); training ran on the default placement.")
        return
    print(f"\nPlan: {plan.algorithm}, {len(plan.devices())} devices, predicted step "
          f"{plan.predicted_step_time * 1e3:.2f} ms")
    for name, seconds in sorted(plan.candidates.items(), key=lambda item: item[1]):
        print(f"  {name:40s} {seconds * 1e3:8.2f} ms")
    if plan.splits:
        print(f"  split layers: {', '.join(sorted(plan.splits))}")
    print(report.summary())
    # The steps after the plan was timed beside the default placement (clock.steps()[k] is step
    # k + 1; the first step after a dropped plan retraces), or after the planner, which ran beside
    # training, kept the default.
    beside = strategy.report.get("steps_while_planning", 0)
    settled = strategy.report.get("settled_step", strategy.options.warmup_steps + strategy.options.profile_steps + beside)
    planned_step = float(np.median(clock.steps()[settled + 1:]))
    one_time = float(np.sum(clock.steps()[:settled + 1]) - (settled + 1) * default_step)
    waited, planned = strategy.report["wait_seconds"], strategy.report["plan_seconds"]
    print(f"One-time cost: {one_time:.1f} s more than plain Keras' steps over steps 0-{settled} (fit waited "
          + (f"{waited:.1f} s for the profile; the planner took {planned - waited:.1f} s more in a process of its own, "
             f"while {beside} steps trained" if beside else f"{waited:.1f} s for profiling and planning") + ")")
    measured = (f"Measured step time: {default_step * 1e3:.1f} ms on the default placement, {mirrored_step * 1e3:.1f} ms "
                f"with MirroredStrategy, {planned_step * 1e3:.1f} ms with ")
    if dropped or kept_default:  # both FastTStrategy figures are then the default placement's: no speed-up
        went = "which kept the default placement" if kept_default else "which went back to the default placement"
        print(measured + f"FastTStrategy, {went} (so no speed-up to report)")
        print(simulated_on(SIMULATED_CLUSTER, strategy.profile))
    else:
        print(measured + f"the plan ({default_step / planned_step:.2f}x the default placement, "
                         f"{mirrored_step / planned_step:.2f}x MirroredStrategy)")
    print("Plan, profile and timeline written to kerasflow_logs/ (open timeline.json in chrome://tracing).")


if __name__ == "__main__":
    main()
