"""Writes docs/benchmarks.md: kerasflow against the published workloads, regenerated end to end.

For every workload of the model zoo (``benchmarks/zoo.py``; its cached graphs, so TensorFlow
is not needed for these parts) and every cluster preset:

- planner speed: wall time of ``candidate_plans`` without splitting and waves, and with both;
- predicted step time (simulated) of single device, data-parallel, layer-wise model-parallel,
  HEFT, CPOP, FastT (list scheduling + critical-path splitting), Tick-Tock (the faster of
  its data- and model-parallel forms), FastT with waves (FastT's placement run as two waves)
  and the lower bound; the speedup of FastT over data parallelism and its ratio to the bound;
- under a binding memory budget: the largest batch and samples/s per strategy (Wavelet's
  comparison);
- the CPU testbed's real runs (``benchmarks/cpu_testbed.py``, in subprocesses): measured
  step times and the simulator's error;
- the published figures of FastT, Wavelet, Baechi and the RL placers, beside ours.

Usage:
    python benchmarks/report.py                      # everything (about an hour on 2 cores)
    python benchmarks/report.py --testbed-rounds 0   # skip the CPU testbed's real runs
    python benchmarks/report.py --workloads vgg16 gnmt --presets 4xV100-pcie --out /tmp/b.md
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import math
import os
import platform
import re
import subprocess
import sys
import time
import warnings

from _common import format_table, machine

import zoo
from kerasflow.planner import Cluster, InsufficientMemoryError, lower_bound, step_time_bound
from kerasflow.planner.search.planning import candidate_plans, plan
from kerasflow.planner.search.maxbatch import STRATEGIES, max_batch
from kerasflow.planner.parallel.ticktock import batch_coupled_ops, with_waves

HERE = os.path.dirname(os.path.abspath(__file__))
PRESETS = ["4xV100-pcie", "4xV100-nvlink", "8xH100-nvlink"]
SCHEDULERS = ("heft", "heft-layers", "cpop", "cpop-layers")
MEMORY_STRATEGIES = ["data_parallel", "layerwise_model_parallel", "gpipe-2", "tick_tock_data_parallel",
                     "tick_tock_model_parallel", "fastt", "fastt+waves"]
LABELS = {"data_parallel": "data-parallel", "layerwise_model_parallel": "layer-wise MP", "gpipe-2": "GPipe, 2 micro",
          "tick_tock_data_parallel": "Tick-Tock DP", "tick_tock_model_parallel": "Tick-Tock MP", "fastt": "FastT",
          "fastt+waves": "FastT + waves"}


def ms(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds * 1e3:.2f}"


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def without_waves(plans: dict) -> dict:
    """Predicted seconds of the plans that run the batch at once: no Tick-Tock, no ``+waves``, and
    no data parallelism on one copy of the weights (a wave per device), which ``plan()`` tries only
    where it tries waves (models without BatchNormalization)."""
    return {name: p.predicted_step_time for name, p in plans.items() if p.waves is None}


def predicted(graph, preset: str) -> dict:
    """Every strategy's predicted step time for one (workload, preset), and the planner's times."""
    cluster = Cluster.preset(preset)
    started = time.perf_counter()
    candidate_plans(graph, cluster, split=False, tick_tock="off", verbose=0)
    no_split = time.perf_counter() - started
    started = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # waves on BatchNormalization models: reported, not hidden (see text)
        full, _ = candidate_plans(graph, cluster, split=True, tick_tock="on", verbose=0)
    with_split = time.perf_counter() - started
    seconds = {name: p.predicted_step_time for name, p in full.items()}
    placed = without_waves(full)
    fastt_name = min(placed, key=placed.get)
    # plan() (tick_tock="auto") uses waves only without BatchNormalization; plan(replicated=False)
    # (what FastTStrategy plans inside fit for a model with its own train_step or with
    # BatchNormalization) leaves out the data-parallel candidates.
    allowed = seconds if not batch_coupled_ops(graph) else placed
    one_replica = {n: t for n, t in allowed.items() if not n.startswith(("data_parallel", "tick_tock_data"))}
    tick_tock = {n: seconds[n] for n in ("tick_tock_data_parallel", "tick_tock_model_parallel") if n in seconds}
    fastt_plan = full[fastt_name]
    if fastt_plan.data_parallel is None:
        waved = with_waves(fastt_plan, graph, cluster) if f"{fastt_name}+waves" not in full else full[f"{fastt_name}+waves"]
        fastt_waves = waved.predicted_step_time
    else:  # FastT chose data parallelism: its wave form is Tick-Tock DP
        fastt_waves = seconds.get("tick_tock_data_parallel")
    baselines = {n: seconds[n] for n in ("single_device", "data_parallel", "layerwise_model_parallel") if n in seconds}
    bound = step_time_bound(graph, cluster)
    return {
        "seconds": seconds, "fastt": placed[fastt_name], "fastt_name": fastt_name, "plan": min(allowed.values()),
        "plan_name": min(allowed, key=allowed.get), "one_replica": min(one_replica.values()),
        "tick_tock": min(tick_tock.values()) if tick_tock else None,
        "tick_tock_name": min(tick_tock, key=tick_tock.get) if tick_tock else "",
        "fastt_waves": fastt_waves, "bound": lower_bound(graph, cluster).seconds,
        "family_bound": bound.seconds, "one_replica_bound": min(bound.one_pass, bound.micro_batched)
        if not batch_coupled_ops(graph) else bound.one_pass,
        "best_baseline": min(baselines.values()), "no_split_s": no_split, "with_split_s": with_split,
    }


def fastt_for_memory(tick_tock: str):
    def make(graph, cluster, batch, memory_limit, memory_headroom):
        return plan(graph, cluster, batch_size=batch, split=False, tick_tock=tick_tock, memory_limit=memory_limit,
                    memory_headroom=memory_headroom, verbose=0)
    return make


def memory_bound(graph, preset: str, memory_limit: float | None) -> dict:
    strategies = dict(STRATEGIES, fastt=fastt_for_memory("off"), **{"fastt+waves": fastt_for_memory("auto")})
    found = {}
    for name in MEMORY_STRATEGIES:
        try:
            found[name] = max_batch(graph, preset, strategies[name], memory_limit=memory_limit)
        except InsufficientMemoryError:
            found[name] = None
    return found


HAND_WRITTEN = "This section is written by hand: `benchmarks/report.py` does not regenerate it."


def hand_written_sections(path: str) -> list[str]:
    """The sections of the existing report that end in ``HAND_WRITTEN``, kept as they are."""
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as handle:
        sections = re.split(r"(?m)^(?=## )", handle.read())
    return [section.rstrip() + "\n" for section in sections if section.rstrip().endswith(HAND_WRITTEN)]


def run_testbed(rounds: int, steps: int) -> str:
    """The CPU testbed's table, as printed by benchmarks/cpu_testbed.py."""
    out = subprocess.run([sys.executable, os.path.join(HERE, "cpu_testbed.py"), "--rounds", str(rounds),
                          "--steps", str(steps)], capture_output=True, text=True, cwd=HERE)
    if out.returncode != 0:
        return f"(cpu_testbed.py failed: {out.stderr.strip().splitlines()[-1] if out.stderr.strip() else out.returncode})"
    lines = out.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("CPU testbed:"))
    return "\n".join(lines[start:])


def version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


PUBLISHED = """\
## Published figures, beside ours

The papers ran real training on their own testbeds (TensorFlow 1.x, 2017-2021 GPUs); the
figures below are as published, checked against the sources named. Where a source could not be
retrieved while writing this report, the cell says so rather than quoting from memory.

| work | venue | workloads | what it reports | measured or simulated |
|---|---|---|---|---|
| FastT (Yi et al.) | Middleware 2020 | DNN training graphs | placement, execution order and critical-path op splitting found "within minutes using the same computing node as for training", against "several hours" for RL placers; speedups over data parallelism: not retrieved here | measured (testbed runs) |
| Wavelet (Wang et al.) | MLSys 2021 | several DNN models | "up to 6.7x faster than commonly used parallelism techniques" with Tick-Tock waves filling each other's memory valleys; the per-model baseline not retrieved here | measured |
| Baechi (Jeon et al.) | SoCC 2020 | Inception-V3, GNMT (4 layers, batch 128, 40 steps, vocabulary 30k in its repository's example), NMT | placement 654x to 206,000x faster than learning-based placers; step times at most 6.2 % above expert placement | measured |
| RL device placement (Mirhoseini et al.) | ICML 2017 | Inception-V3, RNNLM, NMT | placements that beat hand-crafted and algorithmic ones; hours of RL search per graph (per Baechi and FastT) | measured (reward = measured step time) |
| Hierarchical placer (Mirhoseini et al.) | ICLR 2018 | vision and NMT graphs of up to 80,000+ ops | up to 60.6 % lower step time on NMT than human experts | measured |
| Placeto (Addanki et al.) | NeurIPS 2019 | graph families incl. Inception-V3, NMT | placements as good as prior RL with up to 6.1x fewer training steps; generalises to unseen graphs | simulator and real runs |
| GDP (Zhou et al.) | arXiv 2019 | Inception-V3, Transformer-XL, GNMT (8 layers, 50k+ ops), WaveNet | 16 % better than human experts and 9.2 % better than prior art on average | not retrieved here |

Sources: FastT's ACM abstract (doi:10.1145/3423211.3425675); Wavelet's MLSys 2021 proceedings
page; Baechi's SoCC abstract and its repository (github.com/beomyeol/baechi, README); the PMLR
page of Mirhoseini et al. 2017; Google Research's page for the hierarchical planner; arXiv
1906.08879 (Placeto); arXiv 1910.01578 (GDP).

How ours compare, and how they do not:

- **Ours above are simulated** (every step time, speedup, bound and largest batch for the V100
  and H100 presets): kerasflow's simulator over the zoo's traced graphs with roofline costs from
  datasheet figures. No GPU was available to this project when the report was written, so none
  of the GPU figures is a measurement, and the simulator has not been checked against a GPU.
  Ours are **measured** only for the planner's own run time and the CPU testbed.
- On the CPU testbed the simulator's error is shown; it is large (logical CPUs share two cores
  and their memory bandwidth), which is reason to read the GPU figures as the planner's view,
  not as promised speedups.
- Planning time is comparable in kind with FastT's and Baechi's claims: kerasflow plans each
  zoo workload in seconds on a 2-core machine (table above), where RL placers report hours.
- The papers' speedups are over their own baselines on their own hardware and TensorFlow 1.x
  graphs; our graphs are Keras 3 training steps (every op of forward, backward and the Adam
  update), so op counts and baselines differ. Compare directions and orders of magnitude, not
  digits.
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", default=list(zoo.WORKLOADS), choices=list(zoo.WORKLOADS))
    parser.add_argument("--presets", nargs="+", default=PRESETS)
    parser.add_argument("--memory-preset", default="4xV100-nvlink")
    parser.add_argument("--memory-limit", type=float, default=None,
                        help="bytes per device for the memory-bound section (default: the devices' own memory)")
    parser.add_argument("--testbed-rounds", type=int, default=3, help="0 skips the CPU testbed's real runs")
    parser.add_argument("--testbed-steps", type=int, default=60)
    parser.add_argument("--out", default=os.path.join(HERE, "..", "docs", "benchmarks.md"))
    args = parser.parse_args()
    started = time.perf_counter()
    command = "python benchmarks/report.py " + " ".join(sys.argv[1:])

    graphs = {}
    zoo_rows = []
    for name in args.workloads:
        graph = zoo.graph(name)
        graphs[name] = graph
        flops = sum(op.flops.at(graph.batch_size) for op in graph.ops)
        zoo_rows.append([name, f"{graph.metadata['parameters'] / 1e6:.1f}M", str(graph.batch_size),
                         f"{len(graph.ops):,}", f"{len(graph.edges):,}", f"{flops / 1e12:.2f}",
                         zoo.WORKLOADS[name].description])
        print(f"loaded {name}: {len(graph.ops):,} ops", flush=True)

    results = {}
    for name, graph in graphs.items():
        for preset in args.presets:
            results[(name, preset)] = r = predicted(graph, preset)
            print(f"{name} on {preset}: FastT {ms(r['fastt'])} ms ({r['fastt_name']}), data-parallel "
                  f"{ms(r['seconds'].get('data_parallel'))} ms; planned in {r['no_split_s']:.1f} s / "
                  f"{r['with_split_s']:.1f} s", flush=True)

    memory = {}
    for name, graph in graphs.items():
        memory[name] = memory_bound(graph, args.memory_preset, args.memory_limit)
        print(f"{name}: largest batches " + ", ".join(
            f"{k} {v.batch if v else '-'}" for k, v in memory[name].items()), flush=True)

    testbed = run_testbed(args.testbed_rounds, args.testbed_steps) if args.testbed_rounds > 0 else None

    # ---------------------------------------------------------------- the document
    out = []
    today = datetime.date.today().isoformat()
    out.append("# Benchmarks: kerasflow on the model zoo\n")
    out.append(f"Generated by `{command.strip()}` on {today}, in {(time.perf_counter() - started) / 60:.0f} min, on "
               f"{machine()} ({platform.platform()}); kerasflow {version('kerasflow')}, numpy {version('numpy')}, "
               f"TensorFlow {version('tensorflow')}, Keras {version('keras')}. Regenerate with the same command; "
               "the figures of the components (simulator speed on 100k-op graphs, synthetic families, profiling "
               "coverage) are in [benchmarks-components.md](benchmarks-components.md).\n")
    out.append("**Simulated** below: every step time, speedup, bound and largest batch on the V100/H100 presets "
               "(kerasflow's simulator, roofline costs from datasheet figures over the traced graphs). **Measured**: "
               "the planner's wall time and the CPU testbed's step times.\n")

    headline = []
    for name in args.workloads:
        row = [name]
        for preset in args.presets:
            r = results[(name, preset)]
            dp = r["seconds"].get("data_parallel")
            row.append(f"{dp / r['fastt']:.2f}x" if dp else "n/a")
        worst = max(results[(name, p)]["fastt"] / results[(name, p)]["best_baseline"] for p in args.presets)
        row.append("yes" if worst <= 1 + 1e-9 else f"no ({worst:.2f}x)")
        row.append(f"{max(results[(name, p)]['no_split_s'] for p in args.presets):.1f}")
        headline.append(row)
    out.append("## Headline\n")
    out.append("FastT's predicted speedup over data parallelism per cluster (simulated), whether FastT is never "
               "worse than the best baseline (single device, data-parallel, layer-wise model-parallel) on any "
               "cluster, and the planner's longest wall time without splitting (measured, seconds):\n")
    out.append("```\n" + format_table(["workload"] + [f"vs DP, {p}" for p in args.presets]
                                      + ["never worse", "plan s (no split)"], headline) + "\n```\n")

    out.append("## The workloads\n")
    out.append("Training steps traced by `python benchmarks/zoo.py` (Keras 3 on TensorFlow; forward, backward and "
               "Adam update; LSTMs unrolled), cached in `benchmarks/graphs/`. TFLOP counts the traced "
               "matrix products and convolutions at the batch shown.\n")
    out.append("```\n" + format_table(["workload", "params", "batch", "ops", "edges", "TFLOP/step", "model"],
                                      zoo_rows) + "\n```\n")

    out.append("## Planner speed (measured)\n")
    out.append("Wall time of `candidate_plans` on this machine: every base strategy without splitting or waves, "
               "and the full search (critical-path splitting with its default budget of 48 evaluations, plus the "
               "Tick-Tock candidates). Target: under 10 s per workload without splitting.\n")
    rows = []
    for name in args.workloads:
        for preset in args.presets:
            r = results[(name, preset)]
            rows.append([name, preset, f"{len(graphs[name].ops):,}", f"{r['no_split_s']:.1f}",
                         f"{r['with_split_s']:.1f}", r["fastt_name"]])
    out.append("```\n" + format_table(["workload", "cluster", "ops", "plan s (no split)", "plan s (split + waves)",
                                       "FastT's choice"], rows) + "\n```\n")

    out.append("## Predicted step time per strategy (simulated, ms)\n")
    out.append("FastT is the best list schedule (HEFT/CPOP, op or layer affinity) with critical-path splitting, or "
               "a baseline when none of those beats it; Tick-Tock is the faster of Tick-Tock data- and "
               "model-parallel; FastT + waves runs FastT's placement as two waves offset by the forward pass. "
               "`plan()` is what `kerasflow.plan` returns (waves only for models without BatchNormalization: for "
               "Inception-V3, ResNet-50 and MobileNetV2 waves change the statistics, and `tick_tock=\"auto\"` does "
               "not use them; Tick-Tock and FastT + waves are shown for comparison); `1 replica` is "
               "`plan(replicated=False)`, what FastTStrategy plans inside fit for models with their own "
               "`train_step` or BatchNormalization (with `replicated=\"auto\"`).\n")
    out.append("Two bounds: `any schedule` is `lower_bound` (transfers ignored, every batch op's per-sample work "
               "shared by all devices); `families` is `step_time_bound`, the smallest of what each family of plans "
               "kerasflow builds must pay: the fastest data-parallel plan (exact), one replica running the batch "
               "once (unsplittable ops whole on the path, weight gradients of split layers sent over a link), and "
               "one replica in micro-batches (a fixed cost per micro-batch; counted only where `plan()` may use "
               "waves). `1-replica bound` leaves out the data-parallel family. The micro-batched family's figure "
               "can be below `any schedule` (it lets one micro-batch's path carry half the work), which is why "
               "both are shown.\n")
    ratios_dp, ratios_plan, ratios_one_replica, ratios_old = [], [], [], []
    for preset in args.presets:
        rows = []
        for name in args.workloads:
            r = results[(name, preset)]
            s = r["seconds"]
            dp = s.get("data_parallel")
            if dp:
                ratios_dp.append(dp / r["fastt"])
            ratios_old.append(r["plan"] / r["bound"])
            ratios_plan.append(r["plan"] / r["family_bound"])
            ratios_one_replica.append(r["one_replica"] / r["one_replica_bound"])
            rows.append([name, ms(s.get("single_device")), ms(dp), ms(s.get("layerwise_model_parallel")),
                         ms(min((s[k] for k in ("heft", "heft-layers") if k in s), default=None)),
                         ms(min((s[k] for k in ("cpop", "cpop-layers") if k in s), default=None)),
                         ms(r["fastt"]), ms(r["tick_tock"]), ms(r["fastt_waves"]), ms(r["plan"]),
                         ms(r["one_replica"]), ms(r["bound"]), ms(r["family_bound"]), ms(r["one_replica_bound"]),
                         f"{dp / r['fastt']:.2f}x" if dp else "n/a", f"{r['plan'] / r['family_bound']:.2f}",
                         f"{r['one_replica'] / r['one_replica_bound']:.2f}"])
        out.append(f"### {preset}\n")
        out.append("```\n" + format_table(["workload", "single", "data-par", "layer-MP", "HEFT", "CPOP", "FastT",
                                           "Tick-Tock", "FastT+waves", "plan()", "1 replica", "bound: any schedule",
                                           "bound: families", "1-replica bound", "FastT vs DP", "plan() / bound",
                                           "1 replica / bound"],
                                          rows) + "\n```\n")
    out.append(f"Geometric means over all rows: FastT's speedup over data parallelism {geomean(ratios_dp):.2f}x; "
               f"`plan()` / families bound {geomean(ratios_plan):.2f} (/ any-schedule bound "
               f"{geomean(ratios_old):.2f}); `plan(replicated=False)` / 1-replica bound "
               f"{geomean(ratios_one_replica):.2f}.\n")

    limit = (f"{args.memory_limit / 2**30:.1f} GiB per device" if args.memory_limit
             else "each device's own memory")
    out.append(f"## Under a binding memory budget (simulated): {args.memory_preset}, {limit}, 10 % headroom\n")
    out.append("The largest batch each strategy fits and its samples/s there (the Wavelet comparison). FastT and "
               "FastT + waves run `kerasflow.plan` without splitting at every batch tried (`tick_tock=\"off\"` and "
               "`\"auto\"`).\n")
    rows, tt_checks = [], []
    for name in args.workloads:
        found = memory[name]
        row = [name]
        for key in MEMORY_STRATEGIES:
            f = found[key]
            row.append("-" if f is None else f"{f.batch} / {f.samples_per_second:,.0f}")
        rows.append(row)
        tt, naive = found["tick_tock_model_parallel"], found["layerwise_model_parallel"]
        if tt and naive:
            tt_checks.append(f"{name} {tt.samples_per_second / naive.samples_per_second:.2f}x")
    out.append("```\n" + format_table(["workload"] + [f"{LABELS[k]} (batch / samples/s)" for k in MEMORY_STRATEGIES],
                                      rows) + "\n```\n")
    out.append("Tick-Tock model-parallel over naive layer-wise model-parallel, samples/s at each one's largest "
               "batch: " + ", ".join(tt_checks) + ".\n")

    out.append("## CPU testbed (measured)\n")
    if testbed is None:
        out.append("Not run this time (`--testbed-rounds 0`); `python benchmarks/cpu_testbed.py` prints it.\n")
    else:
        out.append("Real training on this machine (`python benchmarks/cpu_testbed.py`): FastTStrategy's plan on 2 "
                   "logical CPUs against TensorFlow's default threading and MirroredStrategy, and the planner's "
                   "predicted step time against the measured one (the simulator's error).\n")
        out.append("```\n" + testbed + "\n```\n")
    out += hand_written_sections(args.out)
    out.append(PUBLISHED)
    text = "\n".join(out)
    with open(args.out, "w", encoding="utf-8") as handle:
        handle.write(text)
    print(text)
    print(f"wrote {os.path.normpath(args.out)} in {(time.perf_counter() - started) / 60:.1f} min")


if __name__ == "__main__":
    main()
