"""How fast the step simulator runs: random layered training steps of 1k, 10k and 100k ops on 8 devices.

The simulator is the inner loop of the planner's split search, so its speed bounds the
planner's. Target: a 100k-op graph simulated in at most 1 s on the 2-core dev machine.

Usage:
    python benchmarks/simulator_speed.py [--sizes 1000 10000 100000] [--repeats 5]

"cold" is the first simulation of a graph (it builds the graph's cached tables: costs per
device kind, output sizes, memory tables); "warm" is the median of the following runs,
which is what the planner sees when it simulates many plans of one graph.
"""

from __future__ import annotations

import argparse
import statistics
import time

from _common import format_table, machine

from kerasflow.planner import Cluster, baselines, simulate, synthetic


def measure(num_ops: int, repeats: int, cluster: Cluster) -> list[str]:
    graph = synthetic.random_layered(num_ops, width=8, seed=0, kinds=["V100"])
    plan = baselines.layerwise_model_parallel(graph, cluster)
    # with_prediction inside the baseline already simulated once: start from a fresh graph copy.
    graph = synthetic.random_layered(num_ops, width=8, seed=0, kinds=["V100"])
    started = time.perf_counter()
    result = simulate(graph, cluster, plan)
    cold = time.perf_counter() - started
    warm_runs, time_only = [], []
    for _ in range(repeats):
        started = time.perf_counter()
        simulate(graph, cluster, plan)
        warm_runs.append(time.perf_counter() - started)
        started = time.perf_counter()
        simulate(graph, cluster, plan, memory=False)
        time_only.append(time.perf_counter() - started)
    warm = statistics.median(warm_runs)
    return [f"{len(graph):,}", f"{len(graph.edges):,}", f"{len(result.transfers):,}", f"{cold:.3f}",
            f"{warm:.3f}", f"{statistics.median(time_only):.3f}", f"{len(graph) / warm:,.0f}"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000, 100000])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    cluster = Cluster.preset("8xV100-nvlink")
    rows = [measure(n, args.repeats, cluster) for n in args.sizes]
    print(f"Simulator speed: layer-wise model-parallel plan on {cluster.name}, memory tracked "
          f"(median of {args.repeats} warm runs; {machine()})")
    print(format_table(["ops", "edges", "transfers", "cold (s)", "warm (s)", "warm, no memory (s)",
                        "ops/s (warm)"], rows))


if __name__ == "__main__":
    main()
