"""Tiny Keras models for the TF tests (synthetic data only)."""

import numpy as np


def mlp(keras, units=(32, 16), classes=4, features=8, dropout=True):
    inputs = keras.Input((features,), name="x")
    x = inputs
    for i, n in enumerate(units):
        x = keras.layers.Dense(n, activation="relu", name=f"dense_{i}")(x)
    if dropout:
        x = keras.layers.Dropout(0.1, name="dropout")(x)
    outputs = keras.layers.Dense(classes, name="logits")(x)
    model = keras.Model(inputs, outputs, name="mlp")
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def mlp_data(samples=64, features=8, classes=4, seed=0):
    rng = np.random.default_rng(seed)
    return rng.random((samples, features), dtype=np.float32), rng.integers(0, classes, samples)


def inception_cnn(keras, batch_norm=False):
    inputs = keras.Input((16, 16, 3), name="image")
    x = keras.layers.Conv2D(8, 3, padding="same", activation="relu", name="stem")(inputs)
    if batch_norm:
        x = keras.layers.BatchNormalization(name="bn")(x)
    a = keras.layers.Conv2D(4, 1, padding="same", activation="relu", name="branch_a")(x)
    b = keras.layers.Conv2D(4, 3, padding="same", activation="relu", name="branch_b")(x)
    c = keras.layers.MaxPooling2D(3, strides=1, padding="same", name="branch_pool")(x)
    x = keras.layers.Concatenate(name="join")([a, b, c])
    x = keras.layers.GlobalAveragePooling2D(name="gap")(x)
    outputs = keras.layers.Dense(5, name="logits")(x)
    model = keras.Model(inputs, outputs, name="inception_cnn")
    model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def image_data(samples=32, seed=0):
    rng = np.random.default_rng(seed)
    return rng.random((samples, 16, 16, 3), dtype=np.float32), rng.integers(0, 5, samples)


def lstm_model(keras):
    inputs = keras.Input((6,), dtype="int32", name="tokens")
    x = keras.layers.Embedding(50, 8, name="embed")(inputs)
    x = keras.layers.LSTM(8, name="lstm")(x)
    outputs = keras.layers.Dense(3, name="logits")(x)
    model = keras.Model(inputs, outputs, name="lstm_model")
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def token_data(samples=32, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 50, (samples, 6)).astype("int32"), rng.integers(0, 3, samples)


def transformer_block(keras):
    inputs = keras.Input((6, 8), name="sequence")
    attended = keras.layers.MultiHeadAttention(2, 4, name="attention")(inputs, inputs)
    x = keras.layers.Add(name="residual")([inputs, attended])
    x = keras.layers.LayerNormalization(name="norm")(x)
    x = keras.layers.Dense(16, activation="relu", name="ffn")(x)
    x = keras.layers.GlobalAveragePooling1D(name="pool")(x)
    outputs = keras.layers.Dense(3, name="logits")(x)
    model = keras.Model(inputs, outputs, name="transformer_block")
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def sequence_data(samples=32, seed=0):
    rng = np.random.default_rng(seed)
    return rng.random((samples, 6, 8), dtype=np.float32), rng.integers(0, 3, samples)
