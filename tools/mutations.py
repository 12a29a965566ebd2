"""Applies hand-written mutations of the planner's core behaviour, one at a time, and reports which
ones the planner's tests do not notice (the survivors). None may survive.

Each mutation changes one line of kerasflow/planner in a temporary copy of the checkout; the
planner tests and doctests run on that copy (stopping at the first failure). The working tree is
never touched.

Usage:
    python tools/mutations.py            # every mutation (a few minutes on 2 cores)
    python tools/mutations.py --list     # what each one changes
    python tools/mutations.py barrier    # only those whose name contains "barrier"
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from typing import NamedTuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Mutation(NamedTuple):
    name: str
    path: str  # relative to the checkout
    before: str  # must occur exactly once
    after: str


MUTATIONS = [
    Mutation("tick-tock forward barrier removed", "kerasflow/planner/taskgraph.py",
             "            self._barriers(len(replicas))", "            pass"),
    Mutation("gpipe-4 builds 2 micro-batches", "kerasflow/planner/maxbatch.py",
             "pipeline(g, c, 4, batch=b)", "pipeline(g, c, 2, batch=b)"),
    Mutation("CPOP ignores its critical-path device", "kerasflow/planner/cpop.py",
             "preferred = {t: path_device for t in path if fixed[t] < 0}", "preferred = {}"),
    Mutation("list scheduler forgets received inputs in a device's memory need", "kerasflow/planner/listschedule.py",
             "                        received += nbytes", "                        received += 0.0"),
    Mutation("fusion buffer of 25 KiB instead of 25 MiB", "kerasflow/planner/ring.py",
             "FUSION_BUFFER_BYTES = 25 * 2**20", "FUSION_BUFFER_BYTES = 25 * 2**10"),
    Mutation("ring reduce-scatter sends the wrong chunk", "kerasflow/planner/ring.py",
             "RingSend(step, i, (i + 1) % parts, (i - step) % parts, True)",
             "RingSend(step, i, (i + 1) % parts, (i + step) % parts, True)"),
    Mutation("simulated transfers ignore the link latency", "kerasflow/planner/simulator.py",
             "arrival = begin + latency[src][dst] + nbytes * inverse_bw[src][dst]",
             "arrival = begin + nbytes * inverse_bw[src][dst]"),
    Mutation("memory headroom ignored", "kerasflow/planner/listschedule.py",
             "budgets.append(memory * (1.0 - headroom))", "budgets.append(memory)"),
    Mutation("an unordered plan is never kept", "kerasflow/planner/planning.py",
             "    faster = unordered.predicted_step_time < candidate.predicted_step_time * (1 - 1e-9)",
             "    faster = False"),
    Mutation("wave gradients concatenated instead of summed", "kerasflow/planner/taskgraph.py",
             'role = "concat" if out.scales_with_batch else "sum"', 'role = "concat"'),
    Mutation("ring all-reduce with D-1 steps instead of 2(D-1)", "kerasflow/planner/taskgraph.py",
             "seconds = 0.0 if link is None else 2 * (replicas - 1) * (",
             "seconds = 0.0 if link is None else (replicas - 1) * ("),
    Mutation("the step-time bound sends weight gradients for free", "kerasflow/planner/bounds.py",
             "        transfer = self.lowest_latency + nbytes / self.fastest_bandwidth", "        transfer = 0.0"),
    Mutation("split ops in the bound counted whole", "kerasflow/planner/bounds.py",
             "        return self.fixed[i] + self.per_batch[i] / micro_batches / (self.count if self.splits[i] else 1)",
             "        return self.fixed[i] + self.per_batch[i] / micro_batches"),
    Mutation("a remote copy of a loop that reads its weights gets none", "kerasflow/planner/taskgraph.py",
             "                out, sent = Affine(float(ops[p].persistent_bytes), 0.0), float(ops[p].persistent_bytes)",
             "                pass"),
    Mutation("a loop that reads its weights runs once", "kerasflow/planner/graphtables.py",
             "            and (op.colocation not in anchored or op.type in WEIGHT_READING_LOOPS)",
             "            and op.colocation not in anchored"),
    Mutation("a folded chain sends its inner values", "kerasflow/planner/graphtables.py",
             "    folded = folded_ops(graph)", "    folded = [False] * n"),
    Mutation("the tie margin ignores the profile's noise", "kerasflow/planner/planning.py",
             "    return round(min(MAX_TIE_MARGIN, max(TIE_MARGIN, NOISE_TIES * spread)), 6)",
             "    return TIE_MARGIN"),
    Mutation("the tie margin is not capped", "kerasflow/planner/planning.py",
             "    return round(min(MAX_TIE_MARGIN, max(TIE_MARGIN, NOISE_TIES * spread)), 6)",
             "    return round(max(TIE_MARGIN, NOISE_TIES * spread), 6)"),
]


def survives(mutation: Mutation, timeout: float) -> bool:
    """True when the planner's tests pass with ``mutation`` applied (in a temporary copy)."""
    with tempfile.TemporaryDirectory(prefix="kerasflow_mutation_") as copy:
        for part in ("kerasflow", "tests", "setup.cfg", "benchmarks"):
            source = os.path.join(ROOT, part)
            (shutil.copytree if os.path.isdir(source) else shutil.copy)(source, os.path.join(copy, part))
        target = os.path.join(copy, mutation.path)
        with open(target, encoding="utf-8") as handle:
            text = handle.read()
        if text.count(mutation.before) != 1:
            raise SystemExit(f"mutation {mutation.name!r}: its line occurs {text.count(mutation.before)} times in "
                             f"{mutation.path}; update tools/mutations.py")
        with open(target, "w", encoding="utf-8") as handle:
            handle.write(text.replace(mutation.before, mutation.after))
        command = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "tests/planner",
                   "kerasflow/planner"]
        env = dict(os.environ, PYTHONPATH=copy)
        result = subprocess.run(command, cwd=copy, env=env, capture_output=True, text=True, timeout=timeout)
        return result.returncode == 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("only", nargs="*", help="run the mutations whose name contains one of these words")
    parser.add_argument("--list", action="store_true", help="print the mutations and exit")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per mutation")
    args = parser.parse_args()
    chosen = [m for m in MUTATIONS if not args.only or any(word in m.name for word in args.only)]
    if args.list:
        for m in chosen:
            print(f"{m.name}: {m.path}: {m.before.strip()!r} -> {m.after.strip()!r}")
        return 0
    survivors = []
    for m in chosen:
        alive = survives(m, args.timeout)
        survivors += [m.name] if alive else []
        print(f"{'SURVIVED' if alive else 'killed  '}  {m.name}", flush=True)
    print(f"{len(chosen) - len(survivors)} of {len(chosen)} mutations killed; survivors: {survivors or 'none'}")
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
