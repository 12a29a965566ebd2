"""How long kerasflow.plan takes: random layered steps of 1k, 10k, 100k ops on 2, 4, 8 devices.

Targets on the 2-core dev machine: 10k ops on 8 devices in at most 2 s without splitting and
30 s with it; 100k ops without splitting in at most 10 s. (FastT reports minutes;
reinforcement-learning placers take hours.)

Usage:
    python benchmarks/planner_speed.py [--sizes 1000 10000 100000] [--devices 2 4 8]
        [--split-limit 10000]
    python benchmarks/planner_speed.py --against /path/to/older/checkout [--rounds 3] ...

Splitting is timed for graphs up to --split-limit ops (100k-op split searches take many
minutes and have no target); larger rows print "not run". The devices are V100s with NVLink
whose memory is set to 1 TiB: the 100k-op graph holds ~70 GB of weights and optimizer
slots, and this benchmark times the planner, not the memory limit.

With ``--against``, every cell is timed in fresh processes, this checkout and the other one in
turn (``--rounds`` pairs, alternating which goes first), and the table gives each one's median
and the median of the pairs' ratios (this / that): pairing keeps the ratio meaningful while the
machine's speed drifts. Each process builds the graph, then times ``plan`` alone.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def timed_plan(size: int, count: int, split: bool) -> dict:
    """Plans the benchmark's graph of ``size`` ops on ``count`` devices; seconds, plan, step."""
    from kerasflow.planner import Cluster, Device, plan, synthetic
    from kerasflow.planner.ir.cluster import NVLINK2

    graph = synthetic.random_layered(size, width=8, seed=0, kinds=["V100"])
    cluster = Cluster([Device(f"/GPU:{i}", "V100", 2**40) for i in range(count)], NVLINK2,
                      name=f"{count}xV100-nvlink-1TiB")
    started = time.perf_counter()
    best = plan(graph, cluster, split=split, verbose=0)
    return {"seconds": time.perf_counter() - started, "ops": len(graph), "algorithm": best.algorithm,
            "step_ms": best.predicted_step_time * 1e3}


def in_process(checkout: str, size: int, count: int, split: bool) -> dict:
    """``timed_plan`` in a fresh Python that imports kerasflow from ``checkout``."""
    code = (f"import json, sys; sys.path.insert(0, {checkout!r}); sys.path.insert(1, {HERE!r}); "
            f"import planner_speed; print(json.dumps(planner_speed.timed_plan({size}, {count}, {split})))")
    env = {**os.environ, "PYTHONPATH": checkout}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000, 100000])
    parser.add_argument("--devices", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--split-limit", type=int, default=10000)
    parser.add_argument("--against", help="another checkout of kerasflow to time in alternating pairs")
    parser.add_argument("--rounds", type=int, default=3, help="pairs per cell with --against")
    args = parser.parse_args()
    sys.path.insert(0, os.path.join(HERE, ".."))
    from _common import format_table, machine

    if args.against:
        compare(args, format_table, machine)
        return
    rows = []
    for size in args.sizes:
        for count in args.devices:
            plain = timed_plan(size, count, split=False)
            split_cells = ["not run", "", ""]
            if size <= args.split_limit:
                with_split = timed_plan(size, count, split=True)
                split_cells = [f"{with_split['seconds']:.2f}", with_split["algorithm"], f"{with_split['step_ms']:.3f}"]
            rows.append([f"{plain['ops']:,}", str(count), f"{plain['seconds']:.2f}", plain["algorithm"],
                         f"{plain['step_ms']:.3f}"] + split_cells)
            print(" | ".join(rows[-1]), flush=True)
    print()
    print(f"Planner speed (random layered graphs, V100 costs, NVLink; {machine()})")
    print(format_table(["ops", "devices", "plan s", "best", "step ms", "plan s (split)", "best (split)",
                        "step ms (split)"], rows))


def compare(args, format_table, machine) -> None:
    """The table of ``--against``: per cell, medians of both checkouts and of their pair ratios."""
    here = os.path.join(HERE, "..")
    rows = []
    for size in args.sizes:
        for count in args.devices:
            for split in (False, True) if size <= args.split_limit else (False,):
                ours, theirs = [], []
                for round_ in range(args.rounds):
                    order = [(ours, here), (theirs, args.against)]
                    for times, checkout in order if round_ % 2 == 0 else order[::-1]:
                        times.append(in_process(checkout, size, count, split))
                ratios = [a["seconds"] / b["seconds"] for a, b in zip(ours, theirs)]
                same = all(a["algorithm"] == b["algorithm"] and a["step_ms"] == b["step_ms"]
                           for a, b in zip(ours, theirs))
                rows.append([f"{ours[0]['ops']:,}", str(count), "yes" if split else "no",
                             f"{statistics.median(r['seconds'] for r in ours):.2f}",
                             f"{statistics.median(r['seconds'] for r in theirs):.2f}",
                             f"{statistics.median(ratios):.2f}", ours[0]["algorithm"],
                             "same" if same else f"differs ({theirs[0]['algorithm']})"])
                print(" | ".join(rows[-1]), flush=True)
    print()
    print(f"Planner speed, this checkout against {args.against} ({args.rounds} alternating pairs per row; "
          f"{machine()})")
    print(format_table(["ops", "devices", "split", "plan s", "plan s (other)", "ratio", "best",
                        "plan (other)"], rows))


if __name__ == "__main__":
    main()
