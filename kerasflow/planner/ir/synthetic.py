"""Synthetic training-step graphs: chain MLP, Inception-like, Transformer-like, random DAG.

Each builder emits the ops a Keras training step has: the input, per layer its variable
(weights and two Adam slots, persistent), the weight read, the forward compute and
activation, the backward ops (activation gradient, input gradient, weight gradient,
gradient sums where a tensor fans out) and the optimizer update colocated with the
variable. Costs come from FLOPs and bytes through the roofline in ``costmodel`` for every
device kind of ``hardware.DEVICE_SPECS``, so the graphs plan on any preset cluster.
"""

from __future__ import annotations

import random
from typing import Sequence

from .costmodel import roofline
from .graph import Affine, Edge, Op, OpGraph
from .hardware import DEVICE_SPECS

__all__ = ["chain_mlp", "inception_like", "transformer_like", "random_layered", "FAMILIES", "build"]

_F32 = 4
_ADAM_COPIES = 3  # weights + Adam's two moment slots


class _StepBuilder:
    """Collects layers of a forward DAG, then emits forward, backward and update ops."""

    def __init__(self, name: str, batch_size: int, kinds: Sequence[str] | None):
        self.name = name
        self.batch_size = batch_size
        self.specs = [DEVICE_SPECS[k] for k in (kinds or DEVICE_SPECS)]
        self.ops: list[Op] = []
        self.edges: list[Edge] = []
        # layer name -> (forward output op, per-sample output bytes)
        self.outputs: dict[str, tuple[str, float]] = {}
        self.layers: list[dict] = []

    def _op(self, name, type_, layer, phase, flops: Affine, accessed: Affine, outputs=(),
            persistent=0, colocation=None, batch_axis=0, temp=Affine(0.0)) -> str:
        cost = {spec.kind: roofline(flops, accessed, spec) for spec in self.specs}
        self.ops.append(Op(name, type_, layer, phase, cost, tuple(outputs), temp, persistent,
                           colocation, batch_axis, flops, accessed))
        return name

    def input(self, name: str, per_sample_bytes: float) -> str:
        self._op(f"{name}/IteratorGetNext", "IteratorGetNext", None, "other", Affine(0.0),
                 Affine(0.0, per_sample_bytes), [Affine(0.0, per_sample_bytes)], batch_axis=None)
        self.outputs[name] = (f"{name}/IteratorGetNext", per_sample_bytes)
        return name

    def layer(self, name: str, type_: str, inputs: Sequence[str], flops: float, out_bytes: float,
              params: int = 0, activation: str | None = "Relu") -> str:
        """A layer computing ``flops`` per sample into ``out_bytes`` per sample."""
        in_bytes = sum(self.outputs[i][1] for i in inputs)
        weight_bytes = params * _F32
        reads = []
        if params:
            var = self._op(f"{name}/kernel", "VarHandleOp", name, "other", Affine(0.0), Affine(0.0),
                           [], persistent=weight_bytes * _ADAM_COPIES,
                           colocation=f"{name}/kernel", batch_axis=None)
            read = self._op(f"{name}/ReadVariableOp", "ReadVariableOp", name, "forward", Affine(0.0),
                            Affine(weight_bytes), [Affine(weight_bytes)], colocation=f"{name}/kernel",
                            batch_axis=None)
            self.edges.append(Edge(var, read, None))
            reads.append(read)
        compute = self._op(f"{name}/{type_}", type_, name, "forward", Affine(0.0, flops),
                           Affine(weight_bytes, in_bytes + out_bytes), [Affine(0.0, out_bytes)],
                           temp=Affine(0.0, out_bytes / 2 if type_.startswith("Conv") else 0.0))
        for i in inputs:
            self.edges.append(Edge(self.outputs[i][0], compute, 0))
        for read in reads:
            self.edges.append(Edge(read, compute, 0))
        out = compute
        if activation:
            out = self._op(f"{name}/{activation}", activation, name, "forward", Affine(0.0, out_bytes / _F32),
                           Affine(0.0, 2 * out_bytes), [Affine(0.0, out_bytes)])
            self.edges.append(Edge(compute, out, 0))
        self.outputs[name] = (out, out_bytes)
        self.layers.append({"name": name, "type": type_, "inputs": list(inputs), "flops": flops,
                            "in_bytes": in_bytes, "out_bytes": out_bytes, "params": params,
                            "compute": compute, "activation": activation, "out": out, "read": reads})
        return name

    def merge(self, name: str, type_: str, inputs: Sequence[str]) -> str:
        """A parameter-free join (``Concat`` sums sizes, ``Add`` keeps them)."""
        sizes = [self.outputs[i][1] for i in inputs]
        out = sum(sizes) if type_ == "ConcatV2" else max(sizes)
        return self.layer(name, type_, inputs, flops=out / _F32, out_bytes=out, activation=None)

    def finish(self, loss_inputs: str) -> OpGraph:
        """Adds the loss, the backward pass and the updates; returns the graph."""
        head, head_bytes = self.outputs[loss_inputs]
        loss = self._op("loss/SoftmaxCrossEntropy", "SoftmaxCrossEntropyWithLogits", "loss", "forward",
                        Affine(0.0, 5 * head_bytes / _F32), Affine(0.0, 2 * head_bytes),
                        [Affine(_F32), Affine(0.0, head_bytes)])
        self.edges.append(Edge(head, loss, 0))
        # gradient producers of each layer's output: layer -> [(op, output index)]
        grads: dict[str, list[tuple[str, int]]] = {loss_inputs: [(loss, 1)]}
        for layer in reversed(self.layers):
            name = layer["name"]
            parts = grads.get(name)
            if not parts:
                continue
            out_bytes, in_bytes = layer["out_bytes"], layer["in_bytes"]
            upstream = self._sum(f"gradient_tape/{name}/AddN", name, parts, out_bytes)
            if layer["activation"]:
                act = self._op(f"gradient_tape/{name}/{layer['activation']}Grad", layer["activation"] + "Grad",
                               name, "backward", Affine(0.0, out_bytes / _F32), Affine(0.0, 3 * out_bytes),
                               [Affine(0.0, out_bytes)])
                self.edges += [Edge(upstream[0], act, upstream[1]), Edge(layer["out"], act, 0)]
                upstream = (act, 0)
            weight_bytes = layer["params"] * _F32
            inputs = layer["inputs"]
            feeds = [i for i in inputs if not self.outputs[i][0].endswith("IteratorGetNext")]
            if feeds:
                dx = self._op(f"gradient_tape/{name}/{layer['type']}_grad_input", layer["type"] + "BackpropInput",
                              name, "backward", Affine(0.0, layer["flops"]),
                              Affine(weight_bytes, in_bytes + out_bytes),
                              [Affine(0.0, self.outputs[i][1]) for i in feeds])
                self.edges.append(Edge(upstream[0], dx, upstream[1]))
                for read in layer["read"]:
                    self.edges.append(Edge(read, dx, 0))
                for index, i in enumerate(feeds):
                    grads.setdefault(i, []).append((dx, index))
            if layer["params"]:
                dw = self._op(f"gradient_tape/{name}/{layer['type']}_grad_weight", layer["type"] + "BackpropFilter",
                              name, "backward", Affine(0.0, layer["flops"]),
                              Affine(weight_bytes, in_bytes + out_bytes), [Affine(weight_bytes)])
                self.edges.append(Edge(upstream[0], dw, upstream[1]))
                for i in inputs:
                    self.edges.append(Edge(self.outputs[i][0], dw, 0))
                apply = self._op(f"{name}/ResourceApplyAdam", "ResourceApplyAdam", name, "update",
                                 Affine(10.0 * layer["params"]), Affine(5.0 * weight_bytes), [],
                                 colocation=f"{name}/kernel", batch_axis=None)
                self.edges += [Edge(dw, apply, 0), Edge(f"{name}/kernel", apply, None)]
        return OpGraph(self.ops, self.edges, batch_size=self.batch_size, name=self.name,
                       metadata={"source": "kerasflow.planner.synthetic", "costs": "roofline"})

    def _sum(self, name: str, layer: str, parts, nbytes: float) -> tuple[str, int]:
        if len(parts) == 1:
            return parts[0]
        addn = self._op(name, "AddN", layer, "backward", Affine(0.0, len(parts) * nbytes / _F32),
                        Affine(0.0, (len(parts) + 1) * nbytes), [Affine(0.0, nbytes)])
        for op, index in parts:
            self.edges.append(Edge(op, addn, index))
        return addn, 0


def chain_mlp(layers: int = 8, width: int = 1024, input_dim: int = 784, classes: int = 10,
              batch_size: int = 64, kinds: Sequence[str] | None = None) -> OpGraph:
    """A multilayer perceptron: ``layers`` Dense+ReLU layers in a chain.

    Example:
        >>> graph = chain_mlp(layers=2)
        >>> [op.name for op in graph.ops][:4]
        ['input/IteratorGetNext', 'dense_0/kernel', 'dense_0/ReadVariableOp', 'dense_0/MatMul']
    """
    b = _StepBuilder(f"chain_mlp_{layers}x{width}", batch_size, kinds)
    prev, prev_dim = b.input("input", input_dim * _F32), input_dim
    for i in range(layers):
        units = classes if i == layers - 1 else width
        prev = b.layer(f"dense_{i}", "MatMul", [prev], 2.0 * prev_dim * units, units * _F32,
                       params=prev_dim * units + units, activation=None if i == layers - 1 else "Relu")
        prev_dim = units
    return b.finish(prev)


def _conv(b: _StepBuilder, name, inputs, hw: int, c_in: int, c_out: int, k: int) -> str:
    return b.layer(name, "Conv2D", inputs, 2.0 * hw * hw * c_in * c_out * k * k, hw * hw * c_out * _F32,
                   params=c_in * c_out * k * k + c_out)


def inception_like(blocks: int = 4, branches: int = 4, image: int = 35, channels: int = 192,
                   batch_size: int = 32, classes: int = 1000, kinds: Sequence[str] | None = None) -> OpGraph:
    """An Inception-style CNN: blocks of parallel conv branches joined by a concat.

    Branch ``j`` is a 1x1 conv followed by ``j`` 3x3 convs (branch 0 is a lone 1x1), the
    fork-join shape that gives placement room for model parallelism.

    Example:
        >>> len(inception_like(blocks=1, branches=2).layers())
        8
    """
    b = _StepBuilder(f"inception_like_{blocks}x{branches}", batch_size, kinds)
    prev = b.input("input", image * image * 3 * _F32)
    prev = _conv(b, "stem", [prev], image, 3, channels, 3)
    width = channels // branches
    for i in range(blocks):
        ends = []
        for j in range(branches):
            x = _conv(b, f"block{i}/branch{j}/conv1x1", [prev], image, channels, width, 1)
            for depth in range(j):
                x = _conv(b, f"block{i}/branch{j}/conv3x3_{depth}", [x], image, width, width, 3)
            ends.append(x)
        prev = b.merge(f"block{i}/concat", "ConcatV2", ends)
    pooled = b.layer("avg_pool", "Mean", [prev], image * image * channels, channels * _F32, activation=None)
    logits = b.layer("logits", "MatMul", [pooled], 2.0 * channels * classes, classes * _F32,
                     params=channels * classes + classes, activation=None)
    return b.finish(logits)


def transformer_like(blocks: int = 4, d_model: int = 512, heads: int = 8, seq_len: int = 128,
                     ffn: int = 2048, batch_size: int = 32, vocab: int = 8000,
                     kinds: Sequence[str] | None = None) -> OpGraph:
    """A Transformer encoder: embedding, then blocks of attention and feed-forward.

    Each block: Q, K and V projections in parallel, attention scores, softmax, the
    weighted sum, the output projection, a residual add, and a two-layer feed-forward
    with its residual add.

    Example:
        >>> "block0/attention_scores" in transformer_like(blocks=1).layers()
        True
    """
    b = _StepBuilder(f"transformer_like_{blocks}x{d_model}", batch_size, kinds)
    tokens = seq_len * d_model
    prev = b.input("input", seq_len * _F32)
    prev = b.layer("embedding", "GatherV2", [prev], tokens, tokens * _F32, params=vocab * d_model, activation=None)
    for i in range(blocks):
        p = f"block{i}"
        qkv = [b.layer(f"{p}/{n}", "MatMul", [prev], 2.0 * tokens * d_model, tokens * _F32,
                       params=d_model * d_model + d_model, activation=None) for n in ("query", "key", "value")]
        scores_bytes = heads * seq_len * seq_len * _F32
        scores = b.layer(f"{p}/attention_scores", "BatchMatMulV2", qkv[:2], 2.0 * seq_len * tokens,
                         scores_bytes, activation="Softmax")
        mixed = b.layer(f"{p}/attention_mix", "BatchMatMulV2", [scores, qkv[2]], 2.0 * seq_len * tokens,
                        tokens * _F32, activation=None)
        proj = b.layer(f"{p}/attention_output", "MatMul", [mixed], 2.0 * tokens * d_model, tokens * _F32,
                       params=d_model * d_model + d_model, activation=None)
        res = b.merge(f"{p}/residual_attention", "AddV2", [prev, proj])
        up = b.layer(f"{p}/ffn_in", "MatMul", [res], 2.0 * tokens * ffn, seq_len * ffn * _F32,
                     params=d_model * ffn + ffn, activation="Relu")
        down = b.layer(f"{p}/ffn_out", "MatMul", [up], 2.0 * tokens * ffn, tokens * _F32,
                       params=d_model * ffn + d_model, activation=None)
        prev = b.merge(f"{p}/residual_ffn", "AddV2", [res, down])
    logits = b.layer("lm_head", "MatMul", [prev], 2.0 * tokens * vocab / seq_len, vocab * _F32,
                     params=d_model * vocab, activation=None)
    return b.finish(logits)


def random_layered(num_ops: int = 1000, width: int = 8, seed: int = 0, batch_size: int = 32,
                   kinds: Sequence[str] | None = None) -> OpGraph:
    """A seeded random layered DAG of Dense-like layers, about ``num_ops`` ops in all.

    Layers sit in levels of up to ``width``; each takes one to three inputs from the
    previous two levels, with random sizes. Deterministic for a seed.

    Example:
        >>> g1, g2 = random_layered(300, seed=1), random_layered(300, seed=1)
        >>> g1.fingerprint() == g2.fingerprint() and 250 < len(g1) < 400
        True
    """
    rng = random.Random(seed)
    b = _StepBuilder(f"random_layered_{num_ops}_s{seed}", batch_size, kinds)
    dims = {b.input("input", 256 * _F32): 256}
    levels = [["input"]]
    count = 0
    # A layer emits ~8 ops (variable, read, compute, activation, 4 backward/update ops).
    target_layers = max(2, round((num_ops - 3) / 8.3))
    while count < target_layers:
        level = []
        for _ in range(rng.randint(1, width)):
            if count >= target_layers:
                break
            pool = levels[-1] + (levels[-2] if len(levels) > 1 else [])
            inputs = sorted(set(rng.sample(pool, min(len(pool), rng.randint(1, 3)))))
            in_dim = sum(dims[i] for i in inputs)
            units = rng.choice((128, 256, 512, 1024))
            name = b.layer(f"layer{count}", "MatMul", inputs, 2.0 * in_dim * units, units * _F32,
                           params=in_dim * units + units)
            dims[name] = units
            level.append(name)
            count += 1
        levels.append(level)
    # Every layer must reach the loss (a training step has no dead layers): join the sinks.
    used = {i for layer in b.layers for i in layer["inputs"]}
    sinks = [layer["name"] for layer in b.layers if layer["name"] not in used]
    final = b.merge("join", "AddV2", sinks) if len(sinks) > 1 else sinks[0]
    return b.finish(final)


FAMILIES = {
    "mlp": chain_mlp,
    "inception": inception_like,
    "transformer": transformer_like,
    "random": random_layered,
}


def build(family: str, **kwargs) -> OpGraph:
    """Builds a synthetic graph by family name (``mlp``, ``inception``, ``transformer``, ``random``).

    Raises:
        InvalidGraphError: an unknown family.
    """
    from ..errors import InvalidGraphError

    if family not in FAMILIES:
        raise InvalidGraphError(f"Unknown synthetic family {family!r}; choose one of {sorted(FAMILIES)}.")
    return FAMILIES[family](**kwargs)
