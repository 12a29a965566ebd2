"""Predicted step time of every strategy per synthetic family and cluster preset.

For each (family, preset): single device, data-parallel, layer-wise model-parallel, HEFT,
CPOP, kerasflow's final plan and the lower bound, in milliseconds per step (simulated), then
the geometric means of plan / lower bound and of best baseline / plan. The final plan must
never be worse than the best baseline; the "ok" column checks it.

Usage:
    python benchmarks/plan_quality.py [--presets 4xV100-pcie 4xV100-nvlink ...]
"""

from __future__ import annotations

import argparse
import math

from _common import format_table, machine

from kerasflow.planner import Cluster, lower_bound, plan, synthetic

PRESETS = ["2xK80-pcie", "4xV100-pcie", "4xV100-nvlink", "8xA100-nvlink", "8xH100-nvlink", "2x8xV100"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", nargs="+", default=PRESETS)
    parser.add_argument("--families", nargs="+", default=sorted(synthetic.FAMILIES))
    args = parser.parse_args()
    rows, over_bound, over_plan = [], [], []
    for family in args.families:
        graph = synthetic.build(family)
        for preset in args.presets:
            cluster = Cluster.preset(preset)
            best = plan(graph, cluster)
            c = best.candidates
            baseline = min(c[k] for k in ("single_device", "data_parallel", "layerwise_model_parallel") if k in c)
            bound = lower_bound(graph, cluster).seconds
            over_bound.append(best.predicted_step_time / bound)
            over_plan.append(baseline / best.predicted_step_time)
            ms = lambda key: f"{c[key] * 1e3:.3f}" if key in c else "n/a"  # noqa: E731
            rows.append([family, preset, ms("single_device"), ms("data_parallel"), ms("layerwise_model_parallel"),
                         ms("heft"), ms("cpop"), f"{best.predicted_step_time * 1e3:.3f}", best.algorithm,
                         f"{bound * 1e3:.3f}", f"{baseline / best.predicted_step_time:.2f}x",
                         "ok" if best.predicted_step_time <= baseline else "WORSE"])
            print(" | ".join(rows[-1]), flush=True)
    geo = lambda xs: math.exp(sum(math.log(x) for x in xs) / len(xs))  # noqa: E731
    print()
    print(f"Plan quality: predicted step time in ms (simulated; {machine()})")
    print(format_table(["family", "cluster", "single", "data-par", "layer-MP", "HEFT", "CPOP", "plan",
                        "plan algorithm", "bound", "vs best baseline", "ok"], rows))
    print(f"geometric mean of plan / lower bound: {geo(over_bound):.2f}")
    print(f"geometric mean of best baseline / plan: {geo(over_plan):.2f}")


if __name__ == "__main__":
    main()
