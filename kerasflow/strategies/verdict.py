"""The verdict on a plan timed beside the default placement inside ``fit``: keep it, try the runner-up, or drop it (pure Python).

The trial's numbers are stated here, once: a plan predicted faster than the default placement by
more than the trusted gain of the devices it runs on needs no trial (``needs_confirmation``; per
device kind, from a calibration run on that kind, ``trusted_gains``; on a kind never calibrated,
every plan is timed); otherwise a plan more than
``SLOWER_MARGIN`` slower than the default placement (the median of ``TIMED_ROUNDS`` alternating
rounds) gives way; the best other
candidate by ``planner.search.rerank`` is tried in its place when it is expected more than
``RUNNER_UP_GAIN`` faster than the default placement (a switch costs a retrace and another
timing), else the plan is dropped. A ``fit`` that ends before the timing does is judged on the
rounds it completed, with no runner-up; with none, the plan is dropped: a plan never stays
unless it measured at least as fast as the default placement.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from typing import Iterable, Sequence

from kerasflow.planner.parallel.baselines import DEFAULT_PLACEMENT
from kerasflow.planner.ir.plan import Plan
from kerasflow.planner.search.rerank import rerank, same_kind

__all__ = ["Verdict", "judge", "needs_confirmation", "trusted_gains", "SLOWER_MARGIN", "RUNNER_UP_GAIN",
           "TIMED_ROUNDS", "TRUSTED_GAINS_FILE"]

# The median ratio of alternating rounds still varies by a few percent on a shared machine.
SLOWER_MARGIN = 0.03
RUNNER_UP_GAIN = 0.05
TIMED_ROUNDS = 3
# A plan predicted faster than the default placement by more than the simulator's worst measured
# error on its devices' kind is put in force untimed against it. The figures are measured, one
# per kind, by ``benchmarks/calibration.py --write-trusted-gain`` on that kind: its worst
# measured / predicted step of a plan, less one; the file says when and where each was measured.
# A kind absent from the file has never been calibrated: the simulator's error there is unknown,
# and every plan is timed.
TRUSTED_GAINS_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "trusted_gains.json")


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What happens to a timed plan.

    Attributes:
        keep: the plan stays in force.
        runner_up: the plan to try in its place (None: keep it, or drop it).
        why: why it gives way ("" when kept).
    """

    keep: bool
    runner_up: Plan | None = None
    why: str = ""


@functools.lru_cache(maxsize=None)
def trusted_gains(path: str = TRUSTED_GAINS_FILE) -> dict[str, float]:
    """Device kind -> the predicted gain over the default placement beyond which a plan on that kind
    needs no trial, from the calibrations run (``path``: the JSON ``calibration.py`` writes).

    Example:
        >>> trusted_gains()["CPU"]
        1.76
    """
    with open(path, encoding="utf-8") as handle:
        return {kind: float(entry["trusted_gain"]) for kind, entry in json.load(handle).items()}


def needs_confirmation(plan: Plan, kinds: Iterable[str], gains: dict[str, float] | None = None) -> bool:
    """Whether ``plan`` is timed beside the default placement: unless its predicted gain over the
    default placement's predicted step (its ``candidates["default_placement"]``) exceeds the
    trusted gain of every device kind it runs on (``kinds``; ``gains``: default
    ``trusted_gains()``). A kind never calibrated has none: the plan is timed.

    Example:
        >>> plan = Plan(predicted_step_time=0.010, candidates={"default_placement": 0.030})
        >>> needs_confirmation(plan, ["CPU"]), needs_confirmation(plan, ["H100"], {"CPU": 1.48})
        (False, True)
    """
    gains = trusted_gains() if gains is None else gains
    kinds = set(kinds)
    default = plan.candidates.get(DEFAULT_PLACEMENT)
    if not default or not plan.predicted_step_time or not kinds or not kinds <= set(gains):
        return True
    return default / plan.predicted_step_time - 1 <= min(gains[kind] for kind in kinds)


def judge(plan: Plan, measured: float | None, default: float | None, ratio: float | None, rounds: int,
          runners_up: Sequence[Plan] = (), default_name: str = "the default placement") -> Verdict:
    """The verdict on ``plan`` from its timing (see the module docstring).

    Args:
        plan: the plan timed.
        measured: its median step, seconds (None: no planned step was timed).
        default: the default placement's median step beside it, seconds (None: none was timed).
        ratio: the median over rounds of planned / default step time (None: no round completed).
        rounds: the rounds completed.
        runners_up: the other candidates, best first (empty: none may be tried).
        default_name: what the default placement ran, as the reason names it.

    Example:
        >>> heft = Plan(placement={}, predicted_step_time=0.010, algorithm="heft")
        >>> judge(heft, 0.0102, 0.010, 1.02, 6).keep
        True
        >>> print(judge(heft, 0.012, 0.010, 1.2, 6).why)
        the plan measured 12.00 ms a step, slower than the default placement's 10.00 ms in alternating steps (1.20x its step, the median of 6 rounds)
    """
    if ratio is None:
        return Verdict(keep=False, why="fit ended before the plan was timed beside the default placement")
    if ratio <= 1 + SLOWER_MARGIN:
        return Verdict(keep=True)
    slower = (f"the plan measured {measured * 1e3:.2f} ms a step, slower than {default_name}'s "
              f"{default * 1e3:.2f} ms in alternating steps ({ratio:.2f}x its step, the median of {rounds} "
              f"round{'s' if rounds != 1 else ''})")
    if not runners_up:
        return Verdict(keep=False, why=slower)
    ranked = rerank(runners_up, plan, measured) if plan.predicted_step_time else []
    if not ranked:
        return Verdict(keep=False, why=f"{slower}; no other plan is left to try")
    best, expected = ranked[0]
    if expected < default * (1 - RUNNER_UP_GAIN):
        return Verdict(keep=False, runner_up=best, why=slower)
    scaled = "" if not same_kind(best, plan) else (
        f" (predicted {best.predicted_step_time * 1e3:.2f} ms, a plan of the same kind, scaled by this plan's "
        f"measured / predicted {expected / best.predicted_step_time:.2f}x)")
    return Verdict(keep=False, why=f"{slower}; no other plan is tried: the best of them, {best.algorithm}, is "
                                   f"expected at {expected * 1e3:.2f} ms{scaled}, not "
                                   f"{RUNNER_UP_GAIN * 100:.0f} % faster than {default_name}")
