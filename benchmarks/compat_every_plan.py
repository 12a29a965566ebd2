"""Runs the compatibility suite's check of each tutorial-style model under each of its best-ranked plans.

Which plan a door picks depends on the profile, so on the machine's noise: the suite sees one
plan per pattern and door, CI may see another. This runs the suite's own check
(``test_pattern_trains_on_its_plan_like_plain_keras``: the plan applied and still in force, no
fallback warning, losses equal to plain Keras' to 1e-5, then a second fit, evaluate, predict,
save and load) once per plan, putting the k-th ranked candidate first for run k. On 4 logical
CPUs.

    python benchmarks/compat_every_plan.py                       # every pattern, both doors, 6 plans each (about 45 minutes on 2 cores)
    python benchmarks/compat_every_plan.py --patterns mnist_convnet --doors callback
"""

import argparse
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import kerasflow  # noqa: E402

kerasflow.devices.virtual_cpus(4)

import tensorflow as tf  # noqa: E402

from kerasflow.strategies import driver as driver_module  # noqa: E402
from tests.compat.test_tutorial_models import ROUTES, test_pattern_trains_on_its_plan_like_plain_keras  # noqa: E402

tf.config.set_soft_device_placement(False)  # as the suite runs: an unknown device fails loudly


def with_plan_first(rank: int):
    """``ranked_plans`` with its ``rank``-th plan (0: the best) moved to the front, and the list
    to which it appends ``(that plan's name, how many candidates there were)``; with fewer
    candidates than ``rank + 1``, the ranking is left as it is and the name is None."""
    ranked_plans, first = driver_module.ranked_plans, []

    def rotated(*args, **kwargs):
        ranked = ranked_plans(*args, **kwargs)
        if rank >= len(ranked):
            first.append((None, len(ranked)))
            return ranked
        first.append((ranked[rank].algorithm, len(ranked)))
        return ranked[rank:] + ranked[:rank]

    return rotated, first


def check(pattern, door: str, rank: int) -> tuple[str | None, int, str]:
    """(the plan put first, how many candidates there were, "ok" or why the suite's check
    failed) for one run."""
    ranked_plans = driver_module.ranked_plans
    rotated, first = with_plan_first(rank)
    driver_module.ranked_plans = rotated
    try:
        test_pattern_trains_on_its_plan_like_plain_keras(pattern, door, Path(tempfile.mkdtemp()))
        outcome = "ok"
    except AssertionError as error:
        outcome = "FAILED: " + " ".join(str(error).split())[:160]
    finally:
        driver_module.ranked_plans = ranked_plans
    plan, candidates = first[0] if first else ("(none planned)", 0)
    return plan, candidates, outcome


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--patterns", nargs="+", help="pattern names (default: all)")
    parser.add_argument("--doors", nargs="+", choices=("strategy", "callback"), default=("strategy", "callback"))
    parser.add_argument("--plans", type=int, default=6, help="how many of the best-ranked plans to put first")
    args = parser.parse_args(argv)
    routes = [(p, door) for p, door in ROUTES if door in args.doors and (not args.patterns or p.name in args.patterns)]
    if not routes:
        parser.error(f"no pattern of the suite is named {args.patterns} with a route through {args.doors}")
    print(f"{'pattern':28s} {'door':9s} {'rank':>4s}  {'plan':28s} result", flush=True)
    runs = failed = 0
    for pattern, door in routes:
        for rank in range(args.plans):
            plan, candidates, outcome = check(pattern, door, rank)
            if plan is None:
                print(f"{pattern.name:28s} {door:9s} {'':4s}  only {candidates} candidates", flush=True)
                break
            runs, failed = runs + 1, failed + (outcome != "ok")
            print(f"{pattern.name:28s} {door:9s} {rank:4d}  {plan:28s} {outcome}", flush=True)
    print(f"{runs - failed} of {runs} runs passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
