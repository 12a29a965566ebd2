"""Replicas traced in lockstep: one thread per replica, taking turns, meeting at each exchange.

A data-parallel step whose layers need the whole batch's statistics (BatchNormalization in
training) cannot trace its replicas one after another: replica 0's normalization needs every
replica's partial sums before replica 1 has made them. ``Lockstep.run`` traces each replica
in a thread of its own, but only one thread builds ops at a time (a TensorFlow graph is not
built concurrently): a thread runs until it reaches an ``exchange``, leaves its value there and
hands the turn to the next replica. The last replica to arrive combines everyone's values
(``combine`` builds the ops that do it, e.g. a collective all-reduce) and the turn goes round again,
each thread leaving with its own replica's share of the result. Every replica meets the same
exchanges in the same order, as they run the same layers; one that does not is an error.

Each thread enters the tracing state that TensorFlow keeps per thread as the caller had it
(the graph, its name scope, device functions, control dependencies, distribution strategy
and variable creators), as ``tf.distribute.MirroredStrategy`` does for its replica threads.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable

import tensorflow as tf

from kerasflow.planner.errors import KerasflowError

__all__ = ["Lockstep"]

# Per-thread fields of a TensorFlow graph a replica thread takes over from the caller.
_THREAD_STATE = ("_device_function_stack", "_control_dependencies_stack", "_distribution_strategy_stack",
                 "_variable_creator_stack", "_colocation_stack")


class Lockstep:
    """Runs one function per replica in lockstep (see the module docstring).

    Args:
        count: the number of replicas.
        on_turn: called with a replica's index each time its thread takes the turn (before it
            builds ops again), e.g. to point shared state such as the model's variables at
            that replica's.

    Example:
        >>> lockstep = Lockstep(2)
        >>> def replica():
        ...     return lockstep.exchange(lockstep.replica() + 1, lambda values: [sum(values)] * 2)
        >>> lockstep.run([replica, replica])
        [3, 3]
    """

    def __init__(self, count: int, on_turn: Callable[[int], None] | None = None):
        self.count = count
        self._on_turn = on_turn or (lambda replica: None)
        self._local = threading.local()
        self._condition = threading.Condition()
        self._turn = 0
        self._done = [False] * count
        self._rounds: list[int] = [0] * count
        self._deposits: dict[int, list] = {}
        self._results: dict[int, list] = {}
        self._error: BaseException | None = None

    def run(self, functions: list[Callable[[], Any]]) -> list:
        """Calls ``functions[r]`` in replica ``r``'s thread, in lockstep; returns their results.

        A lockstep runs once, then lets go of ``on_turn`` and the values exchanged: the gradient
        functions traced inside it keep it, and TensorFlow's gradient registry keeps those for
        the life of the process (``on_turn`` would keep the model).

        Raises:
            The first exception any replica raised (the others stop at their next turn).
        """
        if len(functions) != self.count:
            raise KerasflowError(f"Lockstep runs one function per replica. Received: {len(functions)} functions "
                                 f"for {self.count} replicas.")
        if self._on_turn is None:
            raise KerasflowError("A Lockstep runs once. Make a new one for each trace.")
        try:
            return self._run(functions)
        finally:
            self._on_turn, self._deposits, self._results = None, {}, {}

    def _run(self, functions: list[Callable[[], Any]]) -> list:
        graph = tf.compat.v1.get_default_graph()
        state = {field: getattr(graph, field) for field in _THREAD_STATE}
        scope = graph.get_name_scope()
        results: list = [None] * self.count
        threads = [threading.Thread(target=self._replica, args=(r, f, graph, state, scope, results),
                                    name=f"kerasflow-replica{r}", daemon=True) for r, f in enumerate(functions)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if self._error is not None:
            raise self._error
        return results

    def replica(self) -> int:
        """The replica whose thread calls this."""
        return self._local.replica

    def exchange(self, value, combine: Callable[[list], list]):
        """The calling replica's share of ``combine(every replica's value)``.

        ``combine`` gets the values in replica order and returns one result per replica; it runs
        once, in the last replica's thread.
        """
        replica = self.replica()
        with self._condition:
            round_ = self._rounds[replica]
            self._rounds[replica] += 1
            values = self._deposits.setdefault(round_, [None] * self.count)
            values[replica] = value
            if replica == self.count - 1:
                try:
                    if any(v is None for v in values):
                        raise _diverged(round_, [r for r, v in enumerate(values) if v is None])
                    self._results[round_] = combine(values)
                except BaseException as error:  # noqa: BLE001 - handed to the caller of run
                    self._error = error
            self._pass_turn(replica)
            self._wait_for_turn(replica)
            if round_ not in self._results:
                raise _diverged(round_, [r for r, v in enumerate(values) if v is None])
            return self._results[round_][replica]

    def _replica(self, replica, function, graph, state, scope, results) -> None:
        self._local.replica = replica
        try:
            with self._condition:
                self._wait_for_turn(replica)
            with graph.as_default(), _entered(graph, state, scope):
                results[replica] = function()
        except BaseException as error:  # noqa: BLE001 - re-raised by run in the caller's thread
            with self._condition:
                if self._error is None:
                    self._error = error
        finally:
            with self._condition:
                self._done[replica] = True
                self._pass_turn(replica)

    def _pass_turn(self, replica: int) -> None:
        """The turn to the next replica still running (the caller holds the condition)."""
        for step in range(1, self.count + 1):
            following = (replica + step) % self.count
            if not self._done[following]:
                self._turn = following
                break
        self._condition.notify_all()

    def _wait_for_turn(self, replica: int) -> None:
        """Blocks until it is ``replica``'s turn (the caller holds the condition); raises when
        another replica failed or every other one finished without meeting this one."""
        while self._turn != replica and self._error is None:
            self._condition.wait()
        if self._error is not None:
            raise _Stopped()
        self._on_turn(replica)


def _diverged(round_: int, missing: list[int]) -> KerasflowError:
    return KerasflowError(f"The replicas met different exchanges: replicas {missing} never reached exchange {round_}, "
                          "which the others did (a layer that runs only on some replicas' shares). Plan this "
                          "model with replicated='off'.")


class _Stopped(Exception):
    """Raised in a replica's thread when another replica failed (never reaches the caller)."""


@contextlib.contextmanager
def _entered(graph, state: dict, scope: str):
    """The caller's per-thread tracing state, entered in a replica's thread."""
    for field, value in state.items():
        setattr(graph, field, value.copy())  # each thread pushes and pops its own
    with tf.name_scope(scope + "/") if scope else contextlib.nullcontext():
        yield
