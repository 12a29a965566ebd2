"""Plan offline for hardware you do not have: profile here, plan for 8 H100s, save, load into the strategy.

1. Profile the model's training step on this machine (`kerasflow.profiling.profile_model`).
2. Add roofline costs for H100s (`estimate_costs`) and plan for the `8xH100-nvlink` preset.
3. Save the plan and profile as JSON (what you would copy to the GPU server).
4. Load the plan back: here, on this machine's devices, a plan for this machine's cluster is
   made the same way and given to `FastTStrategy(plan=...)` — no profiling inside `fit`.

    python examples/offline_planning.py
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import kerasflow  # noqa: E402
import tensorflow as tf  # noqa: E402

if not tf.config.list_physical_devices("GPU"):
    kerasflow.devices.virtual_cpus(4)

import keras  # noqa: E402
import numpy as np  # noqa: E402


def build() -> keras.Model:
    inputs = keras.Input((32, 32, 3))
    x = keras.layers.Conv2D(32, 3, padding="same", activation="relu", name="stem")(inputs)
    a = keras.layers.Conv2D(32, 1, padding="same", activation="relu", name="branch_1x1")(x)
    b = keras.layers.Conv2D(32, 3, padding="same", activation="relu", name="branch_3x3")(x)
    x = keras.layers.Concatenate(name="join")([a, b])
    x = keras.layers.GlobalAveragePooling2D(name="gap")(x)
    model = keras.Model(inputs, keras.layers.Dense(10, name="logits")(x), name="cnn")
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def main() -> None:
    rng = np.random.default_rng(0)
    x = rng.random((1024, 32, 32, 3), dtype=np.float32)
    y = rng.integers(0, 10, 1024)

    # 1-3: profile here, plan for 8 H100s, save.
    strategy = kerasflow.FastTStrategy()
    with strategy.scope():
        model = build()
    profile = kerasflow.profiling.profile_model(model, (x, y), batch_size=128)
    on_h100 = kerasflow.profiling.estimate_costs(profile, "H100")
    gpu_plan = kerasflow.plan(on_h100, "8xH100-nvlink", max_split_evaluations=8)
    profile.save("profile.json")
    gpu_plan.save("plan_8xH100.json")
    print("Plan for 8xH100-nvlink (from a CPU profile and H100 datasheet figures):")
    gpu_plan.summary(on_h100, kerasflow.Cluster.preset("8xH100-nvlink"))

    # 4: a plan for this machine's devices, saved and loaded into the strategy.
    # Any kind of plan runs: one replica spread over the devices, or data parallelism.
    local = kerasflow.plan(profile, f"cpu-testbed:{len(strategy.devices)}", max_split_evaluations=8)
    local.save("plan_local.json")
    strategy.use_plan("plan_local.json")
    model.fit(x, y, batch_size=128, epochs=1, verbose=2)
    report = strategy.placement_report()
    if report is None or not report.in_force:
        print(f"Loaded plan {strategy.plan.algorithm!r} is not in force: "
              f"{report.fallback if report is not None else 'it was never applied'}")
        return
    print(f"Loaded plan {strategy.plan.algorithm!r} applied; ops placed where planned: "
          f"{'all' if not report else f'all but {len(report)}'}")


if __name__ == "__main__":
    main()
