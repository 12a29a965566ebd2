"""Throughput at the memory limit (the Wavelet comparison) for every strategy.

For each synthetic family on two cluster presets with a memory budget that binds (a
``--memory-limit`` per device, default 1 GiB), the largest batch each strategy fits, its
samples/s there (simulated) and the peak memory per device: data-parallel, naive layer-wise
model-parallel, GPipe-style pipelines of 2 and 4 micro-batches, Tick-Tock data-parallel,
Tick-Tock model-parallel, FastT, and FastT with waves (``kerasflow.plan`` with
``tick_tock="off"`` and ``"auto"``, without op splitting to keep the search short).

Usage:
    python benchmarks/ticktock.py [--presets 4xV100-nvlink 8xA100-nvlink] [--memory-limit BYTES]
"""

from __future__ import annotations

import argparse

from _common import format_table, machine

from kerasflow.cli import label
from kerasflow.planner import Cluster, InsufficientMemoryError, plan, synthetic
from kerasflow.planner.search.maxbatch import STRATEGIES, max_batch

STRATEGY_ORDER = ["data_parallel", "layerwise_model_parallel", "gpipe-2", "gpipe-4", "tick_tock_data_parallel",
                  "tick_tock_model_parallel", "fastt", "fastt+waves"]


def fastt_auto(graph, cluster, batch, memory_limit, memory_headroom):
    return plan(graph, cluster, batch_size=batch, split=False, tick_tock="auto", memory_limit=memory_limit,
                memory_headroom=memory_headroom)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", nargs="+", default=["4xV100-nvlink", "8xA100-nvlink"])
    parser.add_argument("--families", nargs="+", default=sorted(synthetic.FAMILIES))
    parser.add_argument("--memory-limit", type=float, default=2**30)
    args = parser.parse_args()
    strategies = dict(STRATEGIES, **{"fastt+waves": fastt_auto})
    rows = []
    checks = []
    for family in args.families:
        graph = synthetic.build(family)
        for preset in args.presets:
            cluster = Cluster.preset(preset)
            found = {}
            for name in STRATEGY_ORDER:
                try:
                    found[name] = max_batch(graph, cluster, strategies[name], memory_limit=args.memory_limit)
                except InsufficientMemoryError:
                    rows.append([family, preset, label(name), "does not fit", "", ""])
                    continue
                f = found[name]
                peaks = " ".join(f"{f.peak_memory.get(d, 0.0) / 2**20:.0f}" for d in cluster.device_names)
                chosen = f.plan.algorithm if name.startswith("fastt") else ""
                rows.append([family, preset, label(name) + (f" [{label(chosen)}]" if chosen else ""),
                             str(f.batch), f"{f.samples_per_second:,.0f}", peaks])
                print(" | ".join(rows[-1]), flush=True)
            if "tick_tock_model_parallel" in found and "layerwise_model_parallel" in found:
                ratio = (found["tick_tock_model_parallel"].samples_per_second
                         / found["layerwise_model_parallel"].samples_per_second)
                checks.append(f"{family} on {preset}: Tick-Tock MP / naive MP = {ratio:.2f}x")
            if "fastt" in found and "fastt+waves" in found:
                ratio = found["fastt+waves"].samples_per_second / found["fastt"].samples_per_second
                checks.append(f"{family} on {preset}: FastT auto waves / FastT off = {ratio:.2f}x")
    print()
    print(f"Throughput at the memory limit ({args.memory_limit / 2**20:,.0f} MiB per device, 10% headroom; "
          f"simulated; {machine()})")
    print(format_table(["family", "cluster", "strategy", "largest batch", "samples/s", "peak MiB per device"], rows))
    print()
    print("\n".join(checks))


if __name__ == "__main__":
    main()
