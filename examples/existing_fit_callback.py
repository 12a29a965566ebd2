"""Add kerasflow to an existing `fit` call: one callback, nothing else changes.

The model is built and compiled as usual (no strategy); `kerasflow.callbacks.FastT()` profiles
the first steps, plans, rebuilds the step and keeps training in the same `fit` call.

    python examples/existing_fit_callback.py
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import kerasflow  # noqa: E402
import tensorflow as tf  # noqa: E402

if not tf.config.list_physical_devices("GPU"):
    kerasflow.devices.virtual_cpus(4)

import keras  # noqa: E402
import numpy as np  # noqa: E402


def main() -> None:
    rng = np.random.default_rng(0)
    x = rng.random((2048, 64), dtype=np.float32)
    y = rng.integers(0, 10, 2048)
    inputs = keras.Input((64,))
    h = keras.layers.Dense(256, activation="relu", name="hidden_1")(inputs)
    h = keras.layers.Dense(256, activation="relu", name="hidden_2")(h)
    model = keras.Model(inputs, keras.layers.Dense(10, name="logits")(h), name="mlp")
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    # Two short epochs end before a plan made beside training would arrive: fit waits for the planner.
    fastt = kerasflow.callbacks.FastT(background_planning=False)
    model.fit(x, y, batch_size=64, epochs=2, verbose=2,
              callbacks=[fastt, keras.callbacks.EarlyStopping(monitor="loss", patience=3)])
    if fastt.plan is None:
        print("No plan was applied (see the warning above); training ran on the default placement.")
        return
    fastt.plan.summary()
    report = fastt.placement_report()
    print(report.summary() if report is not None else "No plan was applied.")


if __name__ == "__main__":
    main()
