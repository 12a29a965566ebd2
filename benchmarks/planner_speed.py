"""How long kerasflow.plan takes: random layered steps of 1k, 10k, 100k ops on 2, 4, 8 devices.

Targets on the 2-core dev machine: 10k ops on 8 devices in at most 3 s without splitting and
60 s with it; 100k ops without splitting in at most 60 s. (FastT reports minutes;
reinforcement-learning placers take hours.)

Usage:
    python benchmarks/planner_speed.py [--sizes 1000 10000 100000] [--devices 2 4 8]
        [--split-limit 10000]

Splitting is timed for graphs up to --split-limit ops (100k-op split searches take many
minutes and have no target); larger rows print "not run". The devices are V100s with NVLink
whose memory is set to 1 TiB: the 100k-op graph holds ~70 GB of weights and optimizer
slots, and this benchmark times the planner, not the memory limit.
"""

from __future__ import annotations

import argparse
import time

from _common import format_table, machine

from kerasflow.planner import Cluster, Device, plan, synthetic
from kerasflow.planner.cluster import NVLINK2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000, 100000])
    parser.add_argument("--devices", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--split-limit", type=int, default=10000)
    args = parser.parse_args()
    rows = []
    for size in args.sizes:
        graph = synthetic.random_layered(size, width=8, seed=0, kinds=["V100"])
        for count in args.devices:
            cluster = Cluster([Device(f"/GPU:{i}", "V100", 2**40) for i in range(count)], NVLINK2,
                              name=f"{count}xV100-nvlink-1TiB")
            started = time.perf_counter()
            plain = plan(graph, cluster, split=False)
            plain_time = time.perf_counter() - started
            split_cells = ["not run", "", ""]
            if size <= args.split_limit:
                started = time.perf_counter()
                with_split = plan(graph, cluster, split=True)
                split_cells = [f"{time.perf_counter() - started:.2f}", with_split.algorithm,
                               f"{with_split.predicted_step_time * 1e3:.3f}"]
            rows.append([f"{len(graph):,}", str(count), f"{plain_time:.2f}", plain.algorithm,
                         f"{plain.predicted_step_time * 1e3:.3f}"] + split_cells)
            print(" | ".join(rows[-1]), flush=True)
    print()
    print(f"Planner speed (random layered graphs, V100 costs, NVLink; {machine()})")
    print(format_table(["ops", "devices", "plan s", "best", "step ms", "plan s (split)", "best (split)",
                        "step ms (split)"], rows))


if __name__ == "__main__":
    main()
