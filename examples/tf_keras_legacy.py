"""kerasflow with tf-keras (Keras 2): the same FastTStrategy.

    pip install -e ".[legacy]" && python examples/tf_keras_legacy.py
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import kerasflow  # noqa: E402
import tensorflow as tf  # noqa: E402

if not tf.config.list_physical_devices("GPU"):
    kerasflow.devices.virtual_cpus(4)

import numpy as np  # noqa: E402
import tf_keras  # noqa: E402


def main() -> None:
    rng = np.random.default_rng(0)
    x = rng.random((1024, 32), dtype=np.float32)
    y = rng.integers(0, 5, 1024)
    # 16 steps end before a plan made beside training would arrive: fit waits for the planner.
    strategy = kerasflow.FastTStrategy(background_planning=False)
    with strategy.scope():
        inputs = tf_keras.Input((32,))
        h = tf_keras.layers.Dense(128, activation="relu", name="hidden")(inputs)
        model = tf_keras.Model(inputs, tf_keras.layers.Dense(5, name="logits")(h))
        model.compile(optimizer="adam", loss=tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(x, y, batch_size=64, epochs=1, verbose=2)
    if strategy.plan is not None:
        strategy.plan.summary()


if __name__ == "__main__":
    main()
