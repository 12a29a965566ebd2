"""Many fits in one process through both doors, then one long planned fit: what kerasflow leaves behind.

Two processes, each with a fresh TensorFlow on 4 logical CPUs, run the same soak loop
(``kerasflow.testing.soak``: ``--fits`` consecutive fits of an MLP, a BatchNormalization CNN and a
GRU in turn, then ``--epochs`` epochs of one MLP): one is plain Keras; in the other the fits
alternate kerasflow's two doors, some with their verdict forced (a plan dropped, a planner that
fails, the long fit's plan kept in force).

The table gives resident memory after warm-up (``--warmup`` fits: each model through each door),
after the last fit, after the long fit's fifth epoch and after its last, and the growth of each
phase; then what is left: threads started during the loop and still running, models not freed,
whether a profiler session can still start, and what is left in the loop's own temporary
directory. It exits 1 when kerasflow's growth over either phase exceeds plain Keras' by more
than ``--margin`` percentage points or anything is left behind.

    python benchmarks/soak.py                          # 30 fits and 50 epochs (about 4 minutes on 2 cores)
    python benchmarks/soak.py --fits 12 --epochs 10
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kerasflow.testing.soak import Leftovers, soak  # noqa: E402

LONG_FIT_FIRST_EPOCHS = 5  # the long fit's own warm-up: its growth is measured from here


def growth(before: float, after: float) -> float:
    """Percent growth from ``before`` to ``after``."""
    return 100.0 * (after - before) / before


def phases(result: Leftovers, warmup: int) -> dict:
    """Resident memory at the four points of the table, and the growth of each phase."""
    fits, epochs = result.rss_mb[:result.fits], result.rss_mb[result.fits:]
    points = {"after warm-up": fits[warmup - 1], "after the last fit": fits[-1],
              f"after epoch {LONG_FIT_FIRST_EPOCHS}": epochs[LONG_FIT_FIRST_EPOCHS - 1], "after the last epoch": epochs[-1]}
    values = list(points.values())
    return {"points": points, "fits growth": growth(values[0], values[1]), "epochs growth": growth(values[2], values[3])}


def _child(arguments) -> None:
    import kerasflow

    kerasflow.devices.virtual_cpus(4)
    result = soak(arguments.fits, arguments.epochs, arguments.child == "kerasflow")
    print(json.dumps(dataclasses.asdict(result)))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fits", type=int, default=30)
    parser.add_argument("--epochs", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=6, help="fits before memory is measured")
    parser.add_argument("--margin", type=float, default=5.0, help="percentage points over plain Keras' growth")
    parser.add_argument("--child", choices=("plain", "kerasflow"), help=argparse.SUPPRESS)
    arguments = parser.parse_args(argv)
    if arguments.epochs < LONG_FIT_FIRST_EPOCHS + 1 or not 0 < arguments.warmup < arguments.fits:
        parser.error(f"need --epochs > {LONG_FIT_FIRST_EPOCHS} and 0 < --warmup < --fits. Received: "
                     f"epochs={arguments.epochs}, warmup={arguments.warmup}, fits={arguments.fits}")
    if arguments.child:
        _child(arguments)
        return 0
    results = {}
    for loop in ("plain", "kerasflow"):
        run = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", loop, "--fits", str(arguments.fits),
                              "--epochs", str(arguments.epochs)], capture_output=True, text=True)
        if run.returncode != 0:
            print(run.stderr[-4000:], file=sys.stderr)
            print(f"soak: the {loop} loop failed (exit {run.returncode}).", file=sys.stderr)
            return 1
        results[loop] = Leftovers(**json.loads(run.stdout.strip().splitlines()[-1]))
    measured = {loop: phases(result, arguments.warmup) for loop, result in results.items()}
    print(f"Soak: {arguments.fits} fits, then {arguments.epochs} epochs of one model, one process each "
          f"(resident MiB; growth after warm-up: {arguments.warmup} fits, {LONG_FIT_FIRST_EPOCHS} epochs)")
    points = list(measured["plain"]["points"])
    print(f"{'loop':<10}" + "".join(f"{p:>22}" for p in points) + f"{'fits growth':>14}{'epochs growth':>15}")
    for loop, m in measured.items():
        print(f"{loop:<10}" + "".join(f"{v:>22.0f}" for v in m["points"].values())
              + f"{m['fits growth']:>13.1f}%{m['epochs growth']:>14.1f}%")
    kf = results["kerasflow"]
    print(f"left behind by kerasflow: threads {kf.threads_left or 'none'}, models alive {kf.models_alive or 'none'} "
          f"(plain Keras: {results['plain'].models_alive or 'none'}), profiler {kf.profiler}, temporary files "
          f"{kf.temp_left or 'none'}")
    print(f"kerasflow warned {len(kf.warned)} times: " + "; ".join(sorted(set(kf.warned)))[:600])
    problems = [f"{phase} exceeds plain Keras' by {measured['kerasflow'][phase] - measured['plain'][phase]:.1f} "
                f"percentage points (more than {arguments.margin})"
                for phase in ("fits growth", "epochs growth")
                if measured["kerasflow"][phase] - measured["plain"][phase] > arguments.margin]
    problems += [f"threads left running: {kf.threads_left}"] * bool(kf.threads_left)
    problems += [f"models not freed: {kf.models_alive}"] * (len(kf.models_alive) > len(results["plain"].models_alive))
    problems += [f"profiler: {kf.profiler}"] * (kf.profiler != "free")
    problems += [f"temporary files left: {kf.temp_left}"] * bool(kf.temp_left)
    for problem in problems:
        print(f"soak: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
