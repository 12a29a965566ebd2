"""The ``kerasflow`` command: plan, compare, simulate and show plans; profile saved models.

Only ``kerasflow profile`` imports TensorFlow; the others work on JSON files.
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import Sequence

from kerasflow.planner import (Cluster, KerasflowError, OpGraph, Plan, baselines, lower_bound, simulate, step_time_bound,
                               synthetic)
from kerasflow.planner._jsonio import MAX_MAGNITUDE, check_writable
from kerasflow.planner.search.candidates import label
from kerasflow.planner.search.planning import candidate_plans, plan as make_plan
from kerasflow.planner.search.request import TICK_TOCK_MODES, PlanRequest
from kerasflow.planner.sim.report import format_bytes, format_table
from kerasflow.planner.ir.hardware import DEVICE_SPECS

__all__ = ["main", "comparison_rows", "label", "with_estimates"]


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:  # not a whole number, or one of more than 4300 digits
        value = 0
    if not 1 <= value <= MAX_MAGNITUDE:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, at most {MAX_MAGNITUDE:g}. "
                                         f"Received: {text!r:.80}")
    return value


def _positive_bytes(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value <= MAX_MAGNITUDE:
        raise argparse.ArgumentTypeError(f"must be a positive, finite number of bytes, at most {MAX_MAGNITUDE:g}. "
                                         f"Received: {text!r:.80}")
    return value


def _check_outputs(args, *names: str) -> None:
    """Before any work: every output path named in ``names`` can be written and is no input."""
    inputs = tuple(getattr(args, name, None) for name in ("profile", "plan", "model") if getattr(args, name, None))
    for name in names:
        path = getattr(args, name, None)
        if path:
            check_writable(path, what="trace" if name == "trace" else "output", inputs=inputs)
    paths = [getattr(args, name) for name in names if getattr(args, name, None)]
    if len(set(paths)) < len(paths):
        raise KerasflowError(f"The outputs must be different files. Received: {paths}")


def _graph(args) -> OpGraph:
    if args.synthetic:
        return synthetic.build(args.synthetic)
    if not args.profile:
        raise KerasflowError("Give a PROFILE.json, or --synthetic FAMILY to use a built-in graph.")
    return OpGraph.load(args.profile)


def _graph_and_cluster(args) -> tuple[OpGraph, Cluster]:
    """The graph and cluster of a command; device kinds the profile has no costs for get roofline
    estimates from its FLOPs and bytes (a CPU profile planned for GPUs), and the output says so."""
    graph = _graph(args)
    cluster = Cluster.resolve(args.cluster)
    return with_estimates(graph, cluster), cluster


def with_estimates(graph: OpGraph, cluster: Cluster) -> OpGraph:
    """``graph`` with roofline costs added for the cluster's device kinds it has no costs for.

    Prints one line naming the estimated kinds; kinds without datasheet figures are left
    alone (the planner's error then names them).

    Example:
        >>> graph = with_estimates(synthetic.chain_mlp(layers=2), Cluster.preset("4xV100-nvlink"))
        >>> "V100" in graph.device_kinds()
        True
    """
    from kerasflow.planner.ir.costmodel import estimate_costs

    missing = sorted(k for k in cluster.kinds() if k not in graph.device_kinds() and k in DEVICE_SPECS)
    if not missing:
        return graph
    print(f"Costs for {', '.join(missing)} are estimated from the profile's FLOPs and bytes (roofline, datasheet "
          "figures): the profile has no measured costs for them.")
    return estimate_costs(graph, missing)


def comparison_rows(graph: OpGraph, cluster: Cluster, batch: int | None = None, *, split: bool = True,
                    memory_limit: float | None = None) -> list[dict]:
    """Predicted figures of every strategy kerasflow tries, its plan, and the two bounds.

    Returns:
        One dict per strategy, named by its registry label (``label``): ``name``, ``step_time``
        (s), ``peak_memory`` (bytes on the fullest device; None for a bound), ``plan`` (None for a
        bound); a strategy left out has ``fits`` False and None for the others. The row named
        ``"kerasflow plan"`` is the one ``kerasflow.plan`` returns.

    Example:
        >>> rows = comparison_rows(synthetic.chain_mlp(layers=2), Cluster.preset("2xK80-pcie"), split=False)
        >>> [row["name"] for row in rows][:3]
        ['default placement', 'single device', 'data-parallel']
    """
    batch = batch or graph.batch_size
    plans, misfits = candidate_plans(PlanRequest(graph, cluster, batch_size=batch, split=split,
                                                 memory_limit=memory_limit))
    rows = []
    for name, candidate in plans.items():
        rows.append({"name": label(name), "step_time": candidate.predicted_step_time,
                     "peak_memory": max(candidate.predicted_peak_memory.values()), "plan": candidate})
    best = min(rows, key=lambda r: r["step_time"])
    rows.append({**best, "name": f"kerasflow plan ({best['name']})"})
    bound = lower_bound(graph, cluster, batch)
    rows.append({"name": "lower bound", "step_time": bound.seconds, "peak_memory": None, "plan": None})
    rows.append({"name": "bound over kerasflow's plans", "step_time": step_time_bound(graph, cluster, batch).seconds,
                 "peak_memory": None, "plan": None})
    for misfit in misfits:
        rows.append({"name": label(misfit.name), "step_time": None, "peak_memory": None, "plan": None, "fits": False})
    return rows


def _compare(args) -> int:
    _check_outputs(args, "trace")
    graph, cluster = _graph_and_cluster(args)
    batch = args.batch_size or graph.batch_size
    rows = comparison_rows(graph, cluster, batch)
    single = next((r["step_time"] for r in rows if r["name"] == "single device"), None)
    largest = _largest_batches(graph, cluster) if args.max_batch else {}
    table = []
    for row in rows:
        time, memory = row["step_time"], row["peak_memory"]
        if time is None:
            table.append([row["name"], "", "", "", "", "NO" if row.get("fits") is False else "", ""])
            continue
        speedup = f"{single / time:.2f}x" if single else ""
        peaks = "" if row["plan"] is None else " ".join(
            f"{row['plan'].predicted_peak_memory.get(d, 0.0) / 2**20:.0f}" for d in cluster.device_names)
        table.append([row["name"], f"{time * 1e3:.3f}", speedup, f"{batch / time:,.1f}", peaks,
                      "" if memory is None else "yes", largest.get(row["name"], "")])
    print(f"Graph {graph.name or args.profile!r}: {len(graph)} ops, {len(graph.edges)} edges, batch {batch}; "
          f"cluster {cluster.name!r}: {len(cluster)} x {'/'.join(cluster.kinds())}")
    headers = ["strategy", "step (ms)", "speedup", "samples/s", "peak MiB per device", "fits"]
    if largest:
        headers.append("largest batch")
    print(format_table(headers, [r[:len(headers)] for r in table]))
    if args.trace:
        best = next(r for r in rows if r["name"].startswith("kerasflow plan"))
        simulate(graph, cluster, best["plan"], batch=batch).save_chrome_trace(args.trace)
        print(f"Timeline of the kerasflow plan written to {args.trace}.")
    return 0


def _largest_batches(graph: OpGraph, cluster: Cluster) -> dict[str, str]:
    """Largest batch that fits, per baseline row label (the memory-bound comparison)."""
    from kerasflow.planner.search.maxbatch import max_batch

    found = {}
    for strategy in ("data_parallel", "layerwise_model_parallel", "tick_tock_data_parallel",
                     "tick_tock_model_parallel"):
        try:
            batch = max_batch(graph, cluster, strategy, largest=1 << 20).batch
            found[label(strategy)] = f">= {batch}" if batch >= 1 << 20 else str(batch)
        except KerasflowError:
            found[label(strategy)] = "none"
    return found


def _simulate(args) -> int:
    _check_outputs(args, "trace")
    graph, cluster = _graph_and_cluster(args)
    plan = Plan.load(args.plan)
    result = simulate(graph, cluster, plan, batch=args.batch_size)
    print(f"Predicted step time: {result.makespan * 1e3:.3f} ms")
    rows = [[d, f"{result.busy[d] * 1e3:.3f}", f"{result.utilization[d] * 100:.1f}%", format_bytes(result.peak_memory[d])]
            for d in cluster.device_names]
    print(format_table(["device", "busy (ms)", "utilisation", "peak memory"], rows))
    if args.trace:
        result.save_chrome_trace(args.trace)
        print(f"Timeline written to {args.trace} (open in chrome://tracing or Perfetto).")
    return 0


def _plan(args) -> int:
    _check_outputs(args, "output", "trace")
    graph, cluster = _graph_and_cluster(args)
    best = make_plan(PlanRequest(graph, cluster, batch_size=args.batch_size, split=not args.no_split,
                                 tick_tock=args.tick_tock, memory_limit=args.memory_limit))
    best.save(args.output)
    best.summary(graph, cluster)
    print(f"Plan written to {args.output}.")
    if args.trace:
        simulate(graph, cluster, best).save_chrome_trace(args.trace)
        print(f"Timeline written to {args.trace} (open in chrome://tracing or Perfetto).")
    return 0


def _show(args) -> int:
    plan = Plan.load(args.plan)
    graph = OpGraph.load(args.profile) if args.profile else None
    cluster = Cluster.resolve(args.cluster) if args.cluster else None
    if (graph is None) != (cluster is None):
        raise KerasflowError("Give both --profile and --cluster to show busy shares, or neither.")
    if graph is not None:
        graph = with_estimates(graph, cluster)
        plan.validate(graph, cluster)
    plan.summary(graph, cluster)
    if graph is None:
        print("Checked: the file itself. Not checked without --profile and --cluster: that its ops, layers and "
              "devices exist and that its order follows the data flow.")
    return 0


def _profile(args) -> int:
    _check_outputs(args, "output")
    from kerasflow.profiling.saved import profile_saved_model

    graph = profile_saved_model(args.model, batch_size=args.batch_size, input_shapes=args.input_shape,
                                steps=args.steps)
    graph.save(args.output)
    meta = graph.metadata
    print(f"Profiled {args.model!r} at batch {args.batch_size}: {len(graph)} ops, coverage "
          f"{meta.get('coverage', 0) * 100:.1f}%, {meta.get('profile_seconds', 0):.1f} s. Written to {args.output}.")
    return 0


def _clusters(args) -> int:
    rows = []
    for name in Cluster.presets():
        cluster = Cluster.preset(name.replace(":N", ":4"))
        device = cluster.devices[0]
        link = cluster.slowest_link()
        host = cluster.host and f"{cluster.host.name} at {cluster.host_link.bandwidth / 1e9:g} GB/s"
        rows.append([name, str(len(cluster)) if ":N" not in name else "N", device.kind, format_bytes(device.memory),
                     f"{link.bandwidth / 1e9:g} GB/s", f"{link.latency * 1e6:g} us", host or "(its devices)"])
    print(format_table(["preset", "devices", "kind", "memory each", "slowest link", "latency",
                        "host (string ops, lookups)"], rows))
    print()
    specs = [[s.kind, f"{s.peak_flops / 1e12:g}", f"{s.memory_bandwidth / 1e9:g}", format_bytes(s.memory)]
             for s in DEVICE_SPECS.values()]
    print(format_table(["kind", "FP32 TFLOP/s", "memory GB/s", "memory"], specs))
    return 0


def _synthetic(args) -> int:
    _check_outputs(args, "output")
    graph = synthetic.build(args.family)
    graph.save(args.output)
    print(f"Wrote {graph.name!r} ({len(graph)} ops) to {args.output}.")
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse with kerasflow's error form: exit status 2 and one line (``--help`` shows usage)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="kerasflow", description="Plan and simulate multi-device Keras training steps.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)

    def graph_arguments(sub):
        sub.add_argument("profile", nargs="?", help="a profile (OpGraph) JSON file")
        sub.add_argument("--synthetic", choices=sorted(synthetic.FAMILIES),
                         help="use a built-in synthetic graph instead of a profile")
        sub.add_argument("--cluster", required=True, help="a preset name (see `kerasflow clusters`) or a cluster file (.json or .json.gz)")
        sub.add_argument("--batch-size", type=_positive_int, default=None,
                         help="the batch to predict (default: the profile's)")
        sub.add_argument("--trace", help="write a Chrome-trace timeline to this file")

    compare = commands.add_parser("compare", help="predicted step time of each strategy on a cluster")
    graph_arguments(compare)
    compare.add_argument("--max-batch", action="store_true",
                         help="also find the largest batch each baseline fits in memory (slower)")
    compare.set_defaults(run=_compare)
    sim = commands.add_parser("simulate", help="simulate a saved plan")
    graph_arguments(sim)
    sim.add_argument("--plan", required=True, help="a plan JSON file")
    sim.set_defaults(run=_simulate)
    planner = commands.add_parser("plan", help="compute the best plan for a profile on a cluster")
    graph_arguments(planner)
    planner.add_argument("--tick-tock", choices=TICK_TOCK_MODES, default="auto", help="Tick-Tock waves (default auto)")
    planner.add_argument("--no-split", action="store_true", help="do not split layers across devices")
    planner.add_argument("--memory-limit", type=_positive_bytes, default=None,
                         help="bytes of memory per device at most")
    planner.add_argument("-o", "--output", required=True, help="where to write the plan JSON")
    planner.set_defaults(run=_plan)
    show = commands.add_parser("show", help="summarise a plan: devices, layers, busy shares, splits, waves")
    show.add_argument("plan", help="a plan JSON file")
    show.add_argument("--profile", help="the profile it was made for (to name layers and simulate busy shares)")
    show.add_argument("--cluster", help="the cluster (preset or JSON), with --profile")
    show.set_defaults(run=_show)
    profile = commands.add_parser("profile", help="profile a saved Keras model on synthetic data")
    profile.add_argument("model", help="a saved model (.keras)")
    profile.add_argument("--batch-size", type=_positive_int, required=True, help="the batch to profile")
    profile.add_argument("--input-shape", action="append", default=None,
                         help="an input's shape without the batch, e.g. 32,32,3 (repeat per input; default: the model's)")
    profile.add_argument("--steps", type=_positive_int, default=3, help="profiled steps (default 3)")
    profile.add_argument("-o", "--output", required=True, help="where to write the profile JSON")
    profile.set_defaults(run=_profile)
    clusters = commands.add_parser("clusters", help="the cluster presets and device figures")
    clusters.set_defaults(run=_clusters)
    synth = commands.add_parser("synthetic", help="write a built-in synthetic graph as a profile JSON")
    synth.add_argument("family", choices=sorted(synthetic.FAMILIES))
    synth.add_argument("-o", "--output", required=True, help="where to write the profile")
    synth.set_defaults(run=_synthetic)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the ``kerasflow`` command; returns 0 on success, 2 on bad input.

    Example:
        >>> main(["clusters"])  # doctest: +ELLIPSIS
        preset ...
        0
    """
    try:
        args = _parser().parse_args(argv)
    except SystemExit as stop:  # --help (0) or a bad argument (2, its one line already printed)
        return stop.code if isinstance(stop.code, int) else 2
    try:
        return args.run(args)
    except KerasflowError as error:
        print(f"kerasflow {args.command}: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
