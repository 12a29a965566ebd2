"""Runs the compatibility suite's check of each tutorial-style model under each of its best-ranked plans.

Which plan a door picks depends on the profile, so on the machine's noise: the suite sees one
plan per pattern and door, CI may see another. This trains each pattern once per plan, putting
the k-th ranked candidate first for run k (a planner passed in as ``Collaborators``) and keeping
it (a stopwatch that reports it faster than the default placement), and checks what the suite
checks: the plan in force at the end, no kerasflow warning, and the losses, validation metrics
and predictions equal to plain Keras' to 1e-5. On 4 logical CPUs.

    python benchmarks/compat_every_plan.py                       # every pattern, both doors, 6 plans each (about 45 minutes on 2 cores)
    python benchmarks/compat_every_plan.py --patterns mnist_convnet --doors callback
    python benchmarks/compat_every_plan.py --patterns gru_padded --doors strategy --plans 12 --epochs 3
"""

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import kerasflow  # noqa: E402

kerasflow.devices.virtual_cpus(4)

import tensorflow as tf  # noqa: E402

from kerasflow.planner import ranked_plans  # noqa: E402
from kerasflow.strategies import Collaborators  # noqa: E402
from kerasflow.testing import ScriptedStopwatch  # noqa: E402
from kerasflow.testing.tutorial_models import PATTERNS  # noqa: E402
from kerasflow.testing.tutorial_runs import (assert_like_plain_keras, kerasflow_warnings, plain_keras,  # noqa: E402
                                             train)

ROUTES = [(p, "strategy") for p in PATTERNS] + [(p, "callback") for p in PATTERNS if p.callback_route]

tf.config.set_soft_device_placement(False)  # as the suite runs: an unknown device fails loudly


def with_plan_first(rank: int):
    """``ranked_plans`` with its ``rank``-th plan (0: the best) moved to the front, and the list
    to which it appends ``(that plan's name, how many candidates there were)``; with fewer
    candidates than ``rank + 1``, the ranking is left as it is and the name is None."""
    first = []

    def rotated(request):
        ranked = ranked_plans(request)
        if rank >= len(ranked):
            first.append((None, len(ranked)))
            return ranked
        first.append((ranked[rank].algorithm, len(ranked)))
        return ranked[rank:] + ranked[:rank]

    return rotated, first


class PlannedFaster(ScriptedStopwatch):
    """Every planned step reports 1 ms, every default step 1 s: the plan is kept."""

    def __call__(self, step, plan):
        return step(), 1.0 if plan is None else 1e-3


def check(pattern, door: str, rank: int, epochs: int = 1) -> tuple[str | None, int, str]:
    """(the plan put first, how many candidates there were, "ok" or why the check failed) for one
    run of ``epochs`` epochs."""
    import warnings

    rotated, first = with_plan_first(rank)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            _, history, predictions, used = train(pattern, door, epochs, collaborators=Collaborators(
                planner=rotated, stopwatch=PlannedFaster({})))
        said = kerasflow_warnings(caught)
        assert not said, said
        assert used.plan_in_force, used.placement_report().fallback
        assert_like_plain_keras(history, predictions, plain_keras(pattern.name, epochs))
        outcome = "ok"
    except AssertionError as error:
        outcome = "FAILED: " + " ".join(str(error).split())[:160]
    plan, candidates = first[0] if first else ("(none planned)", 0)
    return plan, candidates, outcome


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--patterns", nargs="+", help="pattern names (default: all)")
    parser.add_argument("--doors", nargs="+", choices=("strategy", "callback"), default=("strategy", "callback"))
    parser.add_argument("--plans", type=int, default=6, help="how many of the best-ranked plans to put first")
    parser.add_argument("--epochs", type=int, default=1, help="epochs of each run (the suite's forced route trains "
                                                              "up to 3: rounding a plan changes grows with them)")
    args = parser.parse_args(argv)
    routes = [(p, door) for p, door in ROUTES if door in args.doors and (not args.patterns or p.name in args.patterns)]
    if not routes:
        parser.error(f"no pattern of the suite is named {args.patterns} with a route through {args.doors}")
    print(f"{'pattern':28s} {'door':9s} {'rank':>4s}  {'plan':28s} result", flush=True)
    runs = failed = 0
    for pattern, door in routes:
        for rank in range(args.plans):
            plan, candidates, outcome = check(pattern, door, rank, args.epochs)
            if plan is None:
                print(f"{pattern.name:28s} {door:9s} {'':4s}  only {candidates} candidates", flush=True)
                break
            runs, failed = runs + 1, failed + (outcome != "ok")
            print(f"{pattern.name:28s} {door:9s} {rank:4d}  {plan:28s} {outcome}", flush=True)
    print(f"{runs - failed} of {runs} runs passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
