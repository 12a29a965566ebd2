"""What vocabulary sharding could gain at most: the zoo's language models replanned with their vocabulary
layers' weights 1/k as large.

Vocabulary sharding would split an embedding table and the logits layer along the vocabulary over
k devices, each device holding 1/k of their weights. Its saving is what those weights cost on the
links (read on their home, sent to every shard of a batch split, their gradients summed back).
This replans each model with every weight-sized tensor of those layers (the ones that do not grow
with the batch: reads, gradients, updates) made 1/k as large, and changes nothing else. A real
vocabulary split also sends its input to every shard and sums the input's gradient from every
shard; those are left out, so the figures are optimistic for the split. The planner's search is
greedy, so a cheaper graph can plan slower: such rows show a negative gain.

Usage:
    python benchmarks/vocabulary_bound.py [--workloads rnnlm gnmt bert] [--presets 4xV100-pcie ...]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import zoo  # noqa: E402
from _common import format_table  # noqa: E402
from kerasflow.planner import Cluster, OpGraph, plan  # noqa: E402
from kerasflow.planner.ir.graph import Affine  # noqa: E402

# The embedding and logits layers of the zoo's language models (their names in zoo.py).
VOCABULARY_LAYERS = {
    "rnnlm": ("embedding", "softmax"),
    "gnmt": ("source_embedding", "target_embedding", "softmax"),
    "bert": ("token_embedding", "masked_lm"),
}
PRESETS = ["4xV100-pcie", "4xV100-nvlink", "8xH100-nvlink"]


def sharded_weights(graph: OpGraph, layers: tuple[str, ...], shards: int) -> OpGraph:
    """``graph`` with every weight-sized output of ``layers``' ops ``shards`` times smaller."""
    ops = []
    for op in graph.ops:
        if op.layer in layers:
            sizes = [Affine(size.fixed / shards) if not size.scales_with_batch else size for size in op.output_bytes]
            op = dataclasses.replace(op, output_bytes=sizes)
        ops.append(op)
    return OpGraph(ops, graph.edges, batch_size=graph.batch_size, name=graph.name, metadata=graph.metadata)


def step_ms(graph: OpGraph, preset: str, replicated: bool) -> float:
    return plan(graph, preset, replicated=replicated, verbose=0).predicted_step_time * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", default=list(VOCABULARY_LAYERS), choices=list(VOCABULARY_LAYERS))
    parser.add_argument("--presets", nargs="+", default=PRESETS)
    args = parser.parse_args()
    rows = []
    for name in args.workloads:
        graph = zoo.graph(name)
        for preset in args.presets:
            cheaper = sharded_weights(graph, VOCABULARY_LAYERS[name], len(Cluster.preset(preset)))
            row = [name, preset]
            for replicated in (True, False):
                now, bound = step_ms(graph, preset, replicated), step_ms(cheaper, preset, replicated)
                row += [f"{now:.2f}", f"{bound:.2f}", f"{(1 - bound / now) * 100:+.1f} %"]
            rows.append(row)
            print(" ".join(row), file=sys.stderr, flush=True)
    print(format_table(["workload", "cluster", "plan() ms", "1/k weights", "gain", "1 replica ms", "1/k weights",
                        "gain"], rows))


if __name__ == "__main__":
    main()
