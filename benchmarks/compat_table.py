"""Prints "what kerasflow plans": every tutorial-style model of the compatibility suite, through both doors.

For each pattern of ``tests/compat/tutorial_models.py`` and each door (``FastTStrategy``,
the ``FastT`` callback): whether the plan was applied and is still in force at the end (else
why not), the algorithm, the split layers, how many ops the read-back found off the plan,
and the largest relative loss difference to plain Keras. On 4 logical CPUs, trained as the
compatibility suite trains them.

    python benchmarks/compat_table.py            # the markdown table (about 10 minutes on 2 cores)
"""

import os
import sys
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import kerasflow  # noqa: E402

kerasflow.devices.virtual_cpus(4)

import numpy as np  # noqa: E402

from tests.compat.test_tutorial_models import loss_key, plain_keras, train  # noqa: E402
from tests.compat.tutorial_models import PATTERNS  # noqa: E402


def row(pattern, route) -> str:
    expected = plain_keras(pattern.name)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, history, door = train(pattern, route)
    fallbacks = [str(w.message) for w in caught if str(w.message).startswith("kerasflow:")]
    report = door.placement_report()
    plan = door.plan
    key = loss_key(expected)
    difference = float(np.max(np.abs(np.array(history[key]) - expected[key]) / np.abs(expected[key])))
    if plan is None or report is None or not report.in_force:
        result = "default: " + (report.fallback if report is not None and report.fallback else "; ".join(fallbacks))
    elif report:
        result = f"in force, {len(report)} ops ran off the plan"
    else:
        result = "in force, every op where planned"
    splits = ", ".join(sorted(plan.splits)) if plan is not None and plan.splits else "-"
    algorithm = plan.algorithm if plan is not None else "-"
    return f"| {pattern.name} | {route} | {result} | {algorithm} | {splits} | {difference:.1e} |"


def main() -> None:
    print("| pattern | door | result | plan | split layers | max rel. loss difference |")
    print("| --- | --- | --- | --- | --- | --- |")
    for pattern in PATTERNS:
        for route in ("strategy", "callback"):
            print(row(pattern, route), flush=True)


if __name__ == "__main__":
    main()
