"""The model zoo: the workloads placement papers compare on, as Keras models and training-step graphs.

Seven workloads (``WORKLOADS``): Inception-V3, ResNet-50, VGG-16 and MobileNetV2 from
``keras.applications`` (``weights=None``, 1000 classes), an RNNLM (2-layer LSTM language
model), a GNMT-like 4-layer LSTM encoder-decoder with attention (512 units, vocabulary 30k,
sequence length 40, batch 128) and a BERT-base-shaped Transformer encoder.

Their training-step ``OpGraph``: the structure (every op of forward, backward and Adam
update, layers, colocation groups, tensor sizes, FLOPs) is traced by kerasflow's profiler
at the workload's batch and at half of it, so sizes and FLOPs are affine in the batch;
costs are the roofline estimate (``estimate_costs``) for V100, A100 and H100. Nothing is
executed, so any machine can build them. The graphs are cached gzip-compressed under
``benchmarks/graphs/`` so the planner benchmarks run without TensorFlow; ``--regenerate``
rebuilds them (TensorFlow needed, about a minute per workload here).

The LSTMs are unrolled (``unroll=True``): a TensorFlow ``While`` loop is one op whose FLOPs
the tracer cannot see, and an unrolled step is what the published placers were given.

With ``--measure-cpu NAME``, the workload is also profiled on this machine's CPU at a
small batch (``profile_model``: measured op times), for the CPU testbed.

Usage:
    python benchmarks/zoo.py [--regenerate] [--workloads inception_v3 gnmt ...]
    python benchmarks/zoo.py --measure-cpu mobilenet_v2 --batch 8

    # from Python (no TensorFlow needed once cached):
    import zoo
    graph = zoo.graph("gnmt")
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time
from typing import NamedTuple

from _common import format_table, machine

from kerasflow.planner import OpGraph
from kerasflow.planner.ir.costmodel import estimate_costs

HERE = os.path.dirname(os.path.abspath(__file__))
GRAPHS = os.path.join(HERE, "graphs")
KINDS = ("V100", "A100", "H100")


class Workload(NamedTuple):
    """One zoo entry: its batch, what it is, and what it stands for in the papers."""

    batch: int
    description: str


WORKLOADS = {
    "inception_v3": Workload(64, "keras.applications.InceptionV3, 299x299x3, 1000 classes"),
    "resnet50": Workload(64, "keras.applications.ResNet50, 224x224x3, 1000 classes"),
    "vgg16": Workload(64, "keras.applications.VGG16, 224x224x3, 1000 classes"),
    "mobilenet_v2": Workload(64, "keras.applications.MobileNetV2, 224x224x3, 1000 classes"),
    "rnnlm": Workload(64, "2-layer LSTM LM, 1024 units, vocabulary 10k, 40 steps"),
    "gnmt": Workload(128, "4+4-layer LSTM encoder-decoder, attention, 512 units, vocabulary 30k, 40 steps"),
    "bert": Workload(32, "BERT-base-shaped encoder: 12 layers, 768 wide, 12 heads, FFN 3072, 128 tokens, "
                         "vocabulary 30,522, masked-LM head"),
}


def _lstm_lm(keras, vocabulary: int, units: int, steps: int):
    tokens = keras.Input((steps,), dtype="int32", name="tokens")
    x = keras.layers.Embedding(vocabulary, units, name="embedding")(tokens)
    for i in range(2):
        x = keras.layers.LSTM(units, return_sequences=True, unroll=True, name=f"lstm_{i}")(x)
    logits = keras.layers.Dense(vocabulary, name="softmax")(x)
    return keras.Model(tokens, logits, name="rnnlm")


def _gnmt(keras, vocabulary: int = 30000, units: int = 512, steps: int = 40, layers: int = 4):
    """GNMT's shape (Wu et al. 2016) at 4+4 layers: a bidirectional bottom encoder layer,
    residual connections from the third layer up, attention from the bottom decoder layer's
    output over the encoder's, fed to every higher decoder layer."""
    source = keras.Input((steps,), dtype="int32", name="source")
    target = keras.Input((steps,), dtype="int32", name="target")
    x = keras.layers.Embedding(vocabulary, units, name="source_embedding")(source)
    x = keras.layers.Bidirectional(keras.layers.LSTM(units // 2, return_sequences=True, unroll=True),
                                   name="encoder_0")(x)
    for i in range(1, layers):
        h = keras.layers.LSTM(units, return_sequences=True, unroll=True, name=f"encoder_{i}")(x)
        x = keras.layers.Add(name=f"encoder_residual_{i}")([x, h]) if i >= 2 else h
    encoded = x
    y = keras.layers.Embedding(vocabulary, units, name="target_embedding")(target)
    y = keras.layers.LSTM(units, return_sequences=True, unroll=True, name="decoder_0")(y)
    context = keras.layers.Attention(name="attention")([y, encoded])
    for i in range(1, layers):
        h = keras.layers.Concatenate(name=f"decoder_input_{i}")([y, context])
        h = keras.layers.LSTM(units, return_sequences=True, unroll=True, name=f"decoder_{i}")(h)
        y = keras.layers.Add(name=f"decoder_residual_{i}")([y, h]) if i >= 2 else h
    logits = keras.layers.Dense(vocabulary, name="softmax")(y)
    return keras.Model([source, target], logits, name="gnmt")


def _bert(keras, layers: int = 12, width: int = 768, heads: int = 12, ffn: int = 3072, tokens: int = 128,
          vocabulary: int = 30522):
    ids = keras.Input((tokens,), dtype="int32", name="token_ids")
    x = keras.layers.Embedding(vocabulary, width, name="token_embedding")(ids)
    positions = keras.layers.Embedding(tokens, width, name="position_embedding")(
        keras.ops.expand_dims(keras.ops.arange(tokens), 0))
    x = keras.layers.LayerNormalization(name="embedding_norm")(x + positions)
    for i in range(layers):
        attended = keras.layers.MultiHeadAttention(heads, width // heads, name=f"layer_{i}_attention")(x, x)
        x = keras.layers.LayerNormalization(name=f"layer_{i}_attention_norm")(
            keras.layers.Add(name=f"layer_{i}_attention_residual")([x, attended]))
        h = keras.layers.Dense(ffn, activation="gelu", name=f"layer_{i}_ffn_in")(x)
        h = keras.layers.Dense(width, name=f"layer_{i}_ffn_out")(h)
        x = keras.layers.LayerNormalization(name=f"layer_{i}_ffn_norm")(keras.layers.Add(name=f"layer_{i}_ffn_residual")([x, h]))
    logits = keras.layers.Dense(vocabulary, name="masked_lm")(x)
    return keras.Model(ids, logits, name="bert")


def build(name: str, batch: int | None = None, *, keras=None, bert_layers: int = 12):
    """A compiled Keras model of workload ``name`` and one synthetic batch for it.

    Returns:
        ``(model, (x, y))`` with numpy arrays of ``batch`` samples (default: the workload's).
    """
    import numpy as np

    if keras is None:
        import keras
    if name not in WORKLOADS:
        raise SystemExit(f"Unknown workload {name!r}; choose from {sorted(WORKLOADS)}.")
    batch = batch or WORKLOADS[name].batch
    rng = np.random.default_rng(0)
    applications = {"inception_v3": ("InceptionV3", 299), "resnet50": ("ResNet50", 224),
                    "vgg16": ("VGG16", 224), "mobilenet_v2": ("MobileNetV2", 224)}
    if name in applications:
        constructor, side = applications[name]
        model = getattr(keras.applications, constructor)(weights=None, input_shape=(side, side, 3), classes=1000)
        data = (rng.random((batch, side, side, 3), dtype=np.float32), rng.integers(0, 1000, batch))
        from_logits = False  # the applications end in a softmax
    elif name == "rnnlm":
        model = _lstm_lm(keras, 10000, 1024, 40)
        data = (rng.integers(0, 10000, (batch, 40)).astype("int32"), rng.integers(0, 10000, (batch, 40)))
        from_logits = True
    elif name == "gnmt":
        model = _gnmt(keras)
        data = ((rng.integers(0, 30000, (batch, 40)).astype("int32"), rng.integers(0, 30000, (batch, 40)).astype("int32")),
                rng.integers(0, 30000, (batch, 40)))
        from_logits = True
    else:
        model = _bert(keras, layers=bert_layers)
        data = (rng.integers(0, 30522, (batch, 128)).astype("int32"), rng.integers(0, 30522, (batch, 128)))
        from_logits = True
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=from_logits))
    return model, data


def path_of(name: str) -> str:
    """Where workload ``name``'s cached graph lives."""
    return os.path.join(GRAPHS, f"{name}.json.gz")


def trace(name: str) -> OpGraph:
    """Traces workload ``name``'s training step (no execution) and returns it with static costs."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import tensorflow as tf

    from kerasflow import _compat
    from kerasflow.profiling.capture import capture_step
    from kerasflow.profiling.profiler import build_graph, half_batch

    keras.utils.set_random_seed(0)
    started = time.perf_counter()
    model, data = build(name, keras=keras)
    batch = tuple(tf.nest.map_structure(tf.convert_to_tensor, data))
    with tf.device("/CPU:0"):
        big = capture_step(model, batch)
        small = capture_step(model, half_batch(batch))
    parameters = sum(int(v.numpy().size) for v in _compat.model_variables(model))
    metadata = {
        "source": "benchmarks/zoo.py (traced, not executed)",
        "description": WORKLOADS[name].description,
        "parameters": parameters,
        "versions": {"tensorflow": tf.__version__, "keras": keras.__version__},
        "trace_seconds": round(time.perf_counter() - started, 1),
    }
    # Costs come from the roofline below; the traced kind only carries zeros.
    traced = build_graph(big, small, {}, {}, "traced", name=name, metadata=metadata)
    ops = [dataclasses.replace(op, cost={}) for op in traced.ops]
    return estimate_costs(OpGraph(ops, traced.edges, batch_size=traced.batch_size, name=name,
                                  metadata=traced.metadata), KINDS)


def graph(name: str, *, regenerate: bool = False) -> OpGraph:
    """Workload ``name``'s training-step graph, from the cache (traced and cached when missing)."""
    path = path_of(name)
    if regenerate or not os.path.exists(path):
        os.makedirs(GRAPHS, exist_ok=True)
        traced = trace(name)
        traced.save(path)
    return OpGraph.load(path)


def measure_cpu(name: str, batch: int) -> OpGraph:
    """Profiles workload ``name`` on this machine's CPU at ``batch`` (measured op times)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras

    from kerasflow.profiling import profile_model

    keras.utils.set_random_seed(0)
    model, data = build(name, batch, keras=keras, bert_layers=2)
    return profile_model(model, data, batch_size=batch, verbose=0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    parser.add_argument("--regenerate", action="store_true", help="trace again even when cached")
    parser.add_argument("--measure-cpu", metavar="NAME", choices=list(WORKLOADS),
                        help="profile this workload on the CPU instead (measured costs)")
    parser.add_argument("--batch", type=int, default=8, help="batch for --measure-cpu")
    args = parser.parse_args()
    if args.measure_cpu:
        measured = measure_cpu(args.measure_cpu, args.batch)
        out = os.path.join(GRAPHS, f"{args.measure_cpu}-cpu-b{args.batch}.json.gz")
        measured.save(out)
        print(f"{args.measure_cpu}: {len(measured.ops):,} ops, coverage {measured.metadata['coverage']:.1%}, "
              f"profiled in {measured.metadata['profile_seconds']:.1f} s -> {out}")
        return
    rows = []
    for name in args.workloads:
        g = graph(name, regenerate=args.regenerate)
        flops = sum(op.flops.at(g.batch_size) for op in g.ops)
        rows.append([name, f"{g.metadata['parameters'] / 1e6:.1f}M", str(g.batch_size), f"{len(g.ops):,}",
                     f"{len(g.edges):,}", f"{flops / 1e12:.2f}", f"{os.path.getsize(path_of(name)) / 2**20:.1f}",
                     WORKLOADS[name].description])
        print(" | ".join(rows[-1]), flush=True)
    print()
    print(f"Model zoo: training-step graphs ({machine()})")
    print(format_table(["workload", "params", "batch", "ops", "edges", "TFLOP/step", "cache MiB", "model"], rows))


if __name__ == "__main__":
    main()
