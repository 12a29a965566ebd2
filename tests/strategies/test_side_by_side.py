"""The side-by-side timing's schedule and verdict, worked out by hand."""

import pytest

from kerasflow.strategies.side_by_side import SideBySide


def run(trial, seconds):
    """Records ``seconds`` step by step; returns what each step ran ("d" default, "p" plan)."""
    ran = []
    for value in seconds:
        ran.append("d" if trial.runs_default else "p")
        trial.record(value)
    return "".join(ran)


def test_one_untimed_default_step_then_rounds_of_one_planned_and_one_default_step():
    trial = SideBySide(rounds=3)
    # Steps:   default (traces)  plan  default  plan  default  plan  default
    ran = run(trial, [50.0, 2.0, 1.0, 4.0, 2.0, 3.0, 6.0])
    assert ran == "dpdpdpd" and trial.done and not trial.runs_default
    # The untimed 50 s is left out: planned 2, 4, 3 (median 3); default 1, 2, 6 (median 2).
    assert trial.planned_seconds == 3.0 and trial.default_seconds == 2.0
    # Rounds' ratios 2/1, 4/2, 3/6 = 2, 2, 0.5: the median is 2, not 3 / 2 (the medians' ratio).
    assert trial.ratio == 2.0


def test_without_the_default_placement_only_planned_steps_are_timed():
    trial = SideBySide(rounds=3, against_default=False)
    assert run(trial, [5.0, 1.0, 3.0]) == "ppp" and trial.done
    assert trial.planned_seconds == 3.0 and trial.default_seconds is None and trial.ratio is None


def test_a_load_that_moves_between_rounds_weighs_on_both_sides_alike():
    # The machine doubles its load after round 1: each round's plan is 10 % slower than its
    # default step, which the ratio sees whatever the load.
    trial = SideBySide(rounds=3)
    run(trial, [9.0, 1.1, 1.0, 2.2, 2.0, 2.2, 2.0])
    assert trial.ratio == pytest.approx(1.1)


def test_no_round_or_a_step_past_the_schedule_is_a_clear_error():
    with pytest.raises(ValueError, match=r"at least one round. Received: rounds=0"):
        SideBySide(rounds=0)
    trial = SideBySide(rounds=1, against_default=False)
    trial.record(1.0)
    with pytest.raises(ValueError, match=r"recorded already. Received: seconds=2.0"):
        trial.record(2.0)
