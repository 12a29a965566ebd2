"""``PlanningJob``: the planner run in a Python process of its own, beside training, with a time limit.

The planner is pure Python over plain data (``kerasflow.planner`` never imports TensorFlow), so
it runs in a fresh interpreter (``python -m kerasflow.planning_job``): started without the
training process' TensorFlow threads and without re-running the user's script (as
``multiprocessing``'s spawn would, importing ``__main__``). The request and the planner go to it
in a file, pickled; its plans, or the exception it raised, come back in another, written whole
before it exits. The job never outlives its owner: ``cancel`` ends it (the driver cancels at the
end of every ``fit``), a job past its time limit is killed when polled, the process ends itself
when the process that started it is gone, and one left at interpreter exit is killed then.

This module imports neither TensorFlow nor the planner: the planner function travels pickled
(by reference: it must be importable, a module-level function), and the child imports only what
that function's module imports.
"""

from __future__ import annotations

import atexit
import os
import pickle
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from typing import Any, Callable

from kerasflow.planner.errors import KerasflowError

__all__ = ["PlanningJob", "can_run_apart"]

# Seconds between the child's checks that the process that started it is still there.
_PARENT_CHECK_S = 0.5
_RUNNING: "weakref.WeakSet[PlanningJob]" = weakref.WeakSet()


def can_run_apart(planner: Callable) -> bool:
    """Whether ``planner`` can run in a process of its own: a function the child can import by
    name (pickled by reference), not a lambda, a closure or a function of ``__main__``.

    Example:
        >>> from kerasflow.planner import ranked_plans
        >>> can_run_apart(ranked_plans), can_run_apart(lambda request: [])
        (True, False)
    """
    if getattr(planner, "__module__", None) in (None, "__main__"):
        return False
    try:
        pickle.dumps(planner)
    except Exception:  # noqa: BLE001 - whatever pickle refuses (closures, locals, bound objects)
        return False
    return True


class PlanningJob:
    """``planner(request)`` running in a process of its own (see the module docstring).

    Args:
        planner: a function the child can import (``can_run_apart``).
        request: its one argument, picklable (a ``kerasflow.planner.PlanRequest``).
        time_limit: seconds the job may take before ``poll`` kills it and raises.
        clock: the stopwatch (``time.monotonic``; tests pass a scripted one).

    Example:
        >>> from kerasflow.planner import PlanRequest, ranked_plans, synthetic
        >>> job = PlanningJob(ranked_plans, PlanRequest(synthetic.chain_mlp(layers=2), "2xK80-pcie",
        ...                                             split=False, verbose=0), time_limit=120)
        >>> plans = job.wait()
        >>> plans[0].predicted_step_time > 0, job.running
        (True, False)
    """

    def __init__(self, planner: Callable, request: Any, *, time_limit: float,
                 clock: Callable[[], float] = time.monotonic):
        self.time_limit, self._clock = time_limit, clock
        self.folder = tempfile.mkdtemp(prefix="kerasflow-planning-")
        self._request_path = os.path.join(self.folder, "request.pickle")
        self._result_path = os.path.join(self.folder, "result.pickle")
        with open(self._request_path, "wb") as handle:
            pickle.dump({"planner": planner, "request": request}, handle, protocol=pickle.HIGHEST_PROTOCOL)
        self._log = open(os.path.join(self.folder, "output.txt"), "wb")
        # The child finds kerasflow and the planner's module where this process does.
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(entry for entry in sys.path if entry)}
        self.started = clock()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "kerasflow.planning_job", self._request_path, self._result_path, str(os.getpid())],
            stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT, close_fds=True, env=env)
        self.seconds: float | None = None  # how long it took, once done
        # ``folder``: where the request, the result and the process' output are, removed once done.
        _RUNNING.add(self)

    @property
    def running(self) -> bool:
        """True until the job's process has ended (or was ended)."""
        return self.process.poll() is None

    def poll(self) -> list | None:
        """The planner's result once the job is done, else None (still planning).

        Raises:
            KerasflowError: the job ran past its time limit (then killed), or its process ended
                without a result (killed, crashed: the message names its exit code and its
                last output).
            Exception: the exception the planner raised, as it raised it.
        """
        code = self.process.poll()
        if code is None:
            if self._clock() - self.started <= self.time_limit:
                return None
            self.cancel()
            raise KerasflowError(f"planning took longer than its time limit of {self.time_limit:g} s and was "
                                 "stopped. Raise planning_time_limit, or plan offline with kerasflow.plan and "
                                 "pass plan=.")
        self.seconds = self._clock() - self.started
        try:
            outcome = self._read_result(code)
        finally:
            self._clean_up()
        if "error" in outcome:
            raise outcome["error"]
        return outcome["plans"]

    def wait(self, interval: float = 0.05) -> list:
        """Blocks until the job is done (or past its time limit): the planner's result."""
        while True:
            plans = self.poll()
            if plans is not None:
                return plans
            time.sleep(interval)

    def cancel(self) -> None:
        """Ends the job's process, if still running, and removes its files. Safe to call twice."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        self._clean_up()

    def _read_result(self, code: int) -> dict:
        try:
            with open(self._result_path, "rb") as handle:
                return pickle.load(handle)
        except (OSError, EOFError, pickle.UnpicklingError, AttributeError, ImportError):
            self._log.flush()
            with open(self._log.name, "rb") as handle:
                tail = handle.read()[-600:].decode("utf-8", "replace").strip()
            return {"error": KerasflowError(
                f"the planning process ended with exit code {code} and no plan"
                + (f"; its last output: {tail}" if tail else "") + ". Plan offline with kerasflow.plan and pass "
                "plan=, or set background_planning=False to plan inside fit.")}

    def _clean_up(self) -> None:
        _RUNNING.discard(self)
        if not self._log.closed:
            self._log.close()
        for name in (self._request_path, self._result_path, self._log.name, self._result_path + ".part"):
            if os.path.exists(name):
                os.remove(name)
        if os.path.isdir(self.folder):
            os.rmdir(self.folder)


@atexit.register
def _cancel_left_over() -> None:
    for job in list(_RUNNING):
        job.cancel()


def _end_with(parent: int) -> None:
    """Ends this process once ``parent`` is gone (a training process killed without cleaning up)."""
    def watch():
        while os.getppid() == parent:
            time.sleep(_PARENT_CHECK_S)
        os._exit(1)
    threading.Thread(target=watch, daemon=True).start()


def _serve(request_path: str, result_path: str, parent: int) -> int:
    _end_with(parent)
    with open(request_path, "rb") as handle:
        payload = pickle.load(handle)
    try:
        outcome = {"plans": payload["planner"](payload["request"])}
    except Exception as error:  # noqa: BLE001 - every failure goes back to the training process
        outcome = {"error": error}
    try:
        data = pickle.dumps(outcome, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as error:  # noqa: BLE001 - an exception that does not pickle: its text does
        data = pickle.dumps({"error": KerasflowError(f"planning failed: {type(error).__name__}: {error}")})
    with open(result_path + ".part", "wb") as handle:
        handle.write(data)
    os.replace(result_path + ".part", result_path)  # whole or absent: never half a result
    return 0


if __name__ == "__main__":
    sys.exit(_serve(sys.argv[1], sys.argv[2], int(sys.argv[3])))
