"""Profiling figures for a small model zoo on this machine's CPU.

For an MLP, an Inception-like CNN, an LSTM model, a small Transformer and
``keras.applications.InceptionV3(weights=None)``: op and edge counts of the profiled training
step, coverage (profiled kernel time that landed on ops of the graph), profiling wall time,
and the overhead of profiled steps over plain steps (target: at most 10 %; median step
times, same batch).

Usage:
    python benchmarks/profile_zoo.py [--models mlp cnn lstm transformer inception_v3]
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from _common import format_table, machine  # noqa: E402


def build(name, keras):
    import numpy as np

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
    elif name == "inception_v3":
        model = keras.applications.InceptionV3(weights=None, input_shape=(299, 299, 3), classes=10)
        data = (rng.random((8, 299, 299, 3), dtype=np.float32), rng.integers(0, 10, 8))
    else:
        raise SystemExit(f"unknown model {name!r}")
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=name != "inception_v3"))
    return model, data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["mlp", "cnn", "lstm", "transformer", "inception_v3"])
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    import keras

    from kerasflow.profiling import profile_model

    rows = []
    for name in args.models:
        model, data = build(name, keras)
        graph = profile_model(model, data, batch_size=len(data[1]), steps=args.steps)
        meta = graph.metadata
        overhead = meta["profiled_step_seconds"] / meta["plain_step_seconds"] - 1
        rows.append([name, str(len(data[1])), f"{len(graph):,}", f"{len(graph.edges):,}", f"{meta['coverage'] * 100:.1f}%",
                     f"{meta['profile_seconds']:.1f}", f"{meta['plain_step_seconds'] * 1e3:.2f}",
                     f"{meta['profiled_step_seconds'] * 1e3:.2f}", f"{overhead * 100:+.1f}%"])
        print(" | ".join(rows[-1]), flush=True)
    print()
    print(f"Profiling the training step on /CPU:0 (medians of {args.steps} steps; {machine()})")
    print(format_table(["model", "batch", "ops", "edges", "coverage", "profile s", "plain step ms",
                        "profiled step ms", "overhead"], rows))


if __name__ == "__main__":
    main()
