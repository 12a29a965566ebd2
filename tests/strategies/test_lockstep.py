"""Replica threads in lockstep: one builds at a time, in turn, and each exchange gives every
replica its share of what the last one to arrive combined."""

import pytest

from kerasflow import KerasflowError
from kerasflow.strategies.lockstep import Lockstep


def test_replicas_take_turns_between_exchanges_and_get_their_share():
    lockstep = Lockstep(3, on_turn=lambda replica: events.append(("turn", replica)))
    events = []

    def replica():
        r = lockstep.replica()
        events.append(("before", r))
        total = lockstep.exchange(r + 1, lambda values: [sum(values) * (i + 1) for i in range(3)])
        events.append(("after", r))
        return total

    assert lockstep.run([replica, replica, replica]) == [6, 12, 18]
    # Worked out: 0 runs to the exchange, hands over to 1, then 2, which combines 1 + 2 + 3;
    # the turn goes round again and each leaves with its share.
    assert events == [("turn", 0), ("before", 0), ("turn", 1), ("before", 1), ("turn", 2), ("before", 2),
                      ("turn", 0), ("after", 0), ("turn", 1), ("after", 1), ("turn", 2), ("after", 2)]


def test_the_combine_of_each_round_sees_that_rounds_values():
    lockstep = Lockstep(2)

    def replica():
        r = lockstep.replica()
        first = lockstep.exchange([r], lambda values: [values] * 2)
        second = lockstep.exchange([10 + r], lambda values: [values] * 2)
        return first, second

    assert lockstep.run([replica, replica]) == [([[0], [1]], [[10], [11]])] * 2


def test_replicas_that_meet_different_exchanges_fail_with_the_reason():
    lockstep = Lockstep(2)

    def replica():
        r = lockstep.replica()
        if r == 0:
            lockstep.exchange(1, lambda values: values)
        return r

    with pytest.raises(KerasflowError, match=r"met different exchanges: replicas \[1\] never reached exchange 0"):
        lockstep.run([replica, replica])


def test_an_error_in_one_replica_reaches_the_caller_and_stops_the_others():
    lockstep = Lockstep(2)

    def replica():
        r = lockstep.replica()
        if r == 1:
            raise ValueError("replica 1 broke")
        return lockstep.exchange(1, lambda values: values)

    with pytest.raises(ValueError, match="replica 1 broke"):
        lockstep.run([replica, replica])


def test_run_takes_one_function_per_replica():
    with pytest.raises(KerasflowError, match=r"one function per replica. Received: 1 functions for 2 replicas"):
        Lockstep(2).run([lambda: None])
