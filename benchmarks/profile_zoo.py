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

from kerasflow.testing.testbed_models import NAMES, build  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=NAMES,
                        default=["mlp", "cnn", "lstm", "transformer", "inception_v3"])
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
