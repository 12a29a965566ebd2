"""The testbed's small Keras models and InceptionV3, each with one batch of synthetic data.

An MLP, an Inception-like CNN, a ResNet-like CNN, an LSTM model, a small Transformer and a wide
model of two parallel towers, every layer named (a plan's layer names read the same in every run), and
``keras.applications.InceptionV3(weights=None)``; nothing is downloaded. The benchmarks that
profile, plan and time steps on this machine (``benchmarks/profile_zoo.py``, ``calibration.py``,
``cpu_testbed.py``, ``gpu_check.py`` among them) and the tests that compare a planned step with
plain Keras' (``tests/strategies/test_fusions.py``) build them here.
"""

from __future__ import annotations

import numpy as np

from kerasflow.planner.errors import KerasflowError

__all__ = ["build", "NAMES"]

NAMES = ("mlp", "cnn", "resnet", "lstm", "transformer", "towers", "inception_v3")


def build(name: str, keras):
    """A compiled testbed model and one batch of its synthetic data ``(x, y)``.

    Args:
        name: ``"mlp"``, ``"cnn"`` (Inception-like), ``"resnet"``, ``"lstm"``, ``"transformer"``,
            ``"towers"`` (two towers of three wide Dense layers side by side, joined before the
            logits: most of the step's work is in branches a placement can run apart) or
            ``"inception_v3"`` (``keras.applications``, untrained).
        keras: the Keras module to build with (``keras``, or ``tf_keras``).

    Example:
        >>> import keras
        >>> model, (x, y) = build("mlp", keras)
        >>> model.name, x.shape, y.shape
        ('mlp', (64, 784), (64,))
    """

    rng = np.random.default_rng(0)
    if name == "mlp":
        inputs = keras.Input((784,))
        x = inputs
        for i in range(4):
            x = keras.layers.Dense(512, activation="relu", name=f"dense_{i}")(x)
        model = keras.Model(inputs, keras.layers.Dense(10, name="logits")(x), name="mlp")
        data = (rng.random((64, 784), dtype=np.float32), rng.integers(0, 10, 64))
    elif name == "cnn":
        inputs = keras.Input((32, 32, 3))
        x = keras.layers.Conv2D(32, 3, padding="same", activation="relu", name="stem")(inputs)
        branches = [keras.layers.Conv2D(16, k, padding="same", activation="relu", name=f"branch_{k}")(x) for k in (1, 3, 5)]
        branches.append(keras.layers.MaxPooling2D(3, strides=1, padding="same", name="pool")(x))
        x = keras.layers.Concatenate(name="join")(branches)
        x = keras.layers.GlobalAveragePooling2D(name="gap")(x)
        model = keras.Model(inputs, keras.layers.Dense(10, name="logits")(x), name="inception_like_cnn")
        data = (rng.random((32, 32, 32, 3), dtype=np.float32), rng.integers(0, 10, 32))
    elif name == "resnet":
        inputs = keras.Input((32, 32, 3))
        x = keras.layers.Conv2D(32, 3, padding="same", use_bias=False, name="stem")(inputs)
        x = keras.layers.ReLU(name="stem_relu")(keras.layers.BatchNormalization(name="stem_bn")(x))
        for i in range(2):
            y = keras.layers.Conv2D(32, 3, padding="same", use_bias=False, name=f"block{i}_conv1")(x)
            y = keras.layers.ReLU(name=f"block{i}_relu")(keras.layers.BatchNormalization(name=f"block{i}_bn1")(y))
            y = keras.layers.Conv2D(32, 3, padding="same", use_bias=False, name=f"block{i}_conv2")(y)
            y = keras.layers.BatchNormalization(name=f"block{i}_bn2")(y)
            x = keras.layers.ReLU(name=f"block{i}_out")(keras.layers.Add(name=f"block{i}_add")([x, y]))
        x = keras.layers.GlobalAveragePooling2D(name="gap")(x)
        model = keras.Model(inputs, keras.layers.Dense(10, name="logits")(x), name="resnet_like_cnn")
        data = (rng.random((32, 32, 32, 3), dtype=np.float32), rng.integers(0, 10, 32))
    elif name == "lstm":
        inputs = keras.Input((20,), dtype="int32")
        x = keras.layers.Embedding(1000, 64, name="embed")(inputs)
        x = keras.layers.LSTM(128, return_sequences=True, name="lstm_1")(x)
        x = keras.layers.LSTM(128, name="lstm_2")(x)
        model = keras.Model(inputs, keras.layers.Dense(10, name="logits")(x), name="lstm_model")
        data = (rng.integers(0, 1000, (32, 20)).astype("int32"), rng.integers(0, 10, 32))
    elif name == "transformer":
        inputs = keras.Input((32, 64))
        x = inputs
        for i in range(2):
            attended = keras.layers.MultiHeadAttention(4, 16, name=f"attention_{i}")(x, x)
            x = keras.layers.LayerNormalization(name=f"norm_a{i}")(keras.layers.Add(name=f"res_a{i}")([x, attended]))
            h = keras.layers.Dense(128, activation="relu", name=f"ffn_in_{i}")(x)
            h = keras.layers.Dense(64, name=f"ffn_out_{i}")(h)
            x = keras.layers.LayerNormalization(name=f"norm_f{i}")(keras.layers.Add(name=f"res_f{i}")([x, h]))
        x = keras.layers.GlobalAveragePooling1D(name="pool")(x)
        model = keras.Model(inputs, keras.layers.Dense(10, name="logits")(x), name="small_transformer")
        data = (rng.random((32, 32, 64), dtype=np.float32), rng.integers(0, 10, 32))
    elif name == "towers":
        inputs = keras.Input((256,))
        towers = []
        for t in range(2):
            x = inputs
            for i, width in enumerate((2048, 2048, 256)):
                x = keras.layers.Dense(width, activation="relu", name=f"tower{t}_dense{i}")(x)
            towers.append(x)
        x = keras.layers.Concatenate(name="join")(towers)
        model = keras.Model(inputs, keras.layers.Dense(10, name="logits")(x), name="towers")
        data = (rng.random((64, 256), dtype=np.float32), rng.integers(0, 10, 64))
    elif name == "inception_v3":
        model = keras.applications.InceptionV3(weights=None, input_shape=(299, 299, 3), classes=10)
        data = (rng.random((8, 299, 299, 3), dtype=np.float32), rng.integers(0, 10, 8))
    else:
        raise KerasflowError(f"There is no testbed model of that name. Received: name={name!r}. "
                             f"Use one of: {', '.join(NAMES)}")
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=name != "inception_v3"))
    return model, data
