"""Plain-text reports of plans: a Keras-style summary table (what ``Plan.summary()`` prints)."""

from __future__ import annotations

from typing import Sequence

__all__ = ["format_table", "format_bytes", "plan_summary"]


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A plain-text table with aligned columns, in the style of ``model.summary()``.

    Example:
        >>> print(format_table(["a", "b"], [["1", "22"]]))
        a  b
        ─────
        1  22
    """
    widths = [max(len(str(c)) for c in column) for column in zip(headers, *rows)]

    def line(cells):
        return "  ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip()

    rule = "─" * (sum(widths) + 2 * (len(widths) - 1))
    return "\n".join([line(headers), rule] + [line(r) for r in rows])


def format_bytes(value: float) -> str:
    """``1536`` -> ``"1.5 KiB"``.

    Example:
        >>> format_bytes(3 * 2**30)
        '3.0 GiB'
    """
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def _abbreviate(names: list[str], limit: int = 4) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f", … (+{len(names) - limit})" if len(names) > limit else "")


def plan_summary(plan, graph=None, cluster=None) -> str:
    """A summary of ``plan``: per device its layers, busy share and peak memory; splits; waves.

    With ``graph`` and ``cluster`` the busy shares come from simulating the plan; without,
    the table shows what the plan file holds.

    Example:
        >>> from kerasflow.planner import Cluster, baselines, synthetic
        >>> graph, cluster = synthetic.chain_mlp(layers=2), Cluster.preset("2xK80-pcie")
        >>> print(plan_summary(baselines.single_device(graph, cluster), graph, cluster))  # doctest: +ELLIPSIS
        Plan "single_device" ...
    """
    lines = []
    step = plan.predicted_step_time
    header = f'Plan "{plan.algorithm or "unnamed"}"'
    if plan.cluster:
        header += f" for {plan.cluster}"
    if plan.batch_size:
        header += f", batch {plan.batch_size}"
    if step:
        header += f": predicted step {step * 1e3:.3f} ms"
        if plan.batch_size:
            header += f" ({plan.batch_size / step:,.0f} samples/s)"
    lines.append(header)
    busy = {}
    if graph is not None and cluster is not None:
        from .simulator import simulate

        result = simulate(graph, cluster, plan)
        busy = result.utilization
    devices = plan.devices()
    layer_of = {op.name: op.layer for op in graph.ops} if graph is not None else {}
    rows = []
    for device in devices:
        if plan.data_parallel is not None:
            layers = "all (a replica)"
            count = "all"
        else:
            names = [n for n, d in plan.placement.items() if d == device]
            found = list(dict.fromkeys(layer_of[n] for n in names if layer_of.get(n)))
            layers = _abbreviate(found) if found else "-"
            count = str(len(names))
        peak = plan.predicted_peak_memory.get(device)
        rows.append([device, count, layers, f"{busy[device] * 100:.0f}%" if device in busy else "-",
                     format_bytes(peak) if peak is not None else "-"])
    lines.append(format_table(["device", "ops", "layers", "busy", "peak memory"], rows))
    if plan.splits:
        lines.append("Split layers:")
        for layer, shards in sorted(plan.splits.items()):
            parts = ", ".join(f"{s.device} {s.fraction:.0%}" for s in shards)
            lines.append(f"  {layer}: {parts}")
    if plan.waves is not None:
        waves = plan.waves
        text = f"Waves: {waves.count} ({'Tick-Tock, forward offset' if waves.offset == 'forward' else 'pipeline'})"
        for w, mapping in enumerate(waves.stage_maps):
            moved = {a: b for a, b in mapping.items() if a != b}
            if moved:
                text += f"; wave {w} runs " + ", ".join(f"{a}->{b}" for a, b in sorted(moved.items()))
        lines.append(text)
    if plan.data_parallel is not None:
        lines.append(f"Data parallel over {len(plan.data_parallel.devices)} devices, collective all-reduce")
    if plan.candidates:
        ranked = sorted(plan.candidates.items(), key=lambda item: item[1])
        lines.append("Candidates (predicted step): " + ", ".join(f"{n} {t * 1e3:.3f} ms" for n, t in ranked))
    return "\n".join(lines)
