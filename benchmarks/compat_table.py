"""Prints "what kerasflow plans": every tutorial-style model of the compatibility suite, through both doors.

For each pattern of ``kerasflow/testing/tutorial_models.py`` and each door (``FastTStrategy``,
the ``FastT`` callback): whether the plan was applied and is still in force at the end (else
why not), the algorithm, the split layers, how many ops the read-back found off the plan,
and the largest relative loss difference to plain Keras. On 4 logical CPUs, trained as the
compatibility suite trains them.

    python benchmarks/compat_table.py            # the markdown table (about 10 minutes on 2 cores)
    python benchmarks/compat_table.py --patterns mnist_convnet --doors callback
"""

import argparse
import os
import sys
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import kerasflow  # noqa: E402

kerasflow.devices.virtual_cpus(4)

import numpy as np  # noqa: E402

from kerasflow.testing.tutorial_models import PATTERNS  # noqa: E402
from kerasflow.testing.tutorial_runs import kerasflow_warnings, plain_keras, train  # noqa: E402

DOORS = ("strategy", "callback")


def loss_difference(history: dict, plain_history: dict) -> float:
    """The largest relative difference of an epoch's loss from plain Keras' (of the first metric,
    by name, for a model that reports no ``loss``: the GAN's ``d_loss``)."""
    key = "loss" if "loss" in plain_history else sorted(plain_history)[0]
    wanted = np.asarray(plain_history[key])
    return float(np.max(np.abs(np.asarray(history[key]) - wanted) / np.abs(wanted)))


def row(pattern, door) -> str:
    plain_history, _ = plain_keras(pattern.name)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, history, _, handle = train(pattern, door)
    report = handle.placement_report()
    plan = handle.plan
    if report is not None and report.default_kept:
        result = "default placement kept by the planner"
    elif plan is None or report is None or not report.in_force:
        result = "default: " + (report.fallback if report is not None and report.fallback
                                else "; ".join(kerasflow_warnings(caught)))
    elif report:
        result = f"in force, {len(report)} ops ran off the plan"
    else:
        result = "in force, every op where planned"
    splits = ", ".join(sorted(plan.splits)) if plan is not None and plan.splits else "-"
    algorithm = plan.algorithm if plan is not None else "-"
    return (f"| {pattern.name} | {door} | {result} | {algorithm} | {splits} | "
            f"{loss_difference(history, plain_history):.1e} |")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--patterns", nargs="+", choices=[p.name for p in PATTERNS], metavar="NAME",
                        help="pattern names (default: all)")
    parser.add_argument("--doors", nargs="+", choices=DOORS, default=DOORS)
    args = parser.parse_args(argv)
    print("| pattern | door | result | plan | split layers | max rel. loss difference |")
    print("| --- | --- | --- | --- | --- | --- |")
    for pattern in PATTERNS:
        if args.patterns and pattern.name not in args.patterns:
            continue
        for door in args.doors:
            print(row(pattern, door), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
