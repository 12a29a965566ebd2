"""``Budget``: a benchmark's wall-clock budget, which no process it starts outlives.

The benchmark scripts run each setup in a process of its own (TensorFlow fixes its devices when
it starts) that prints one line ``RESULT <json>``. On a machine lent for minutes, a setup that
hangs (a collective waiting for a peer, a driver stuck in a kernel) must not take the run with
it: ``Budget.run`` gives each process at most what is left of the budget (and at most its own
limit), kills it and everything it started when that runs out, and says what happened, so the
script goes on to its next setup and still prints its table.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import time
from typing import Callable, Sequence

__all__ = ["Budget", "Outcome", "RESULT"]

RESULT = "RESULT "  # the line a setup's process prints its figures on, as JSON


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What one process of a benchmark came to.

    Attributes:
        status: ``"ok"`` (it printed its ``RESULT`` line), ``"failed"`` (it ended without one),
            ``"hung"`` (killed at its time limit) or ``"skipped"`` (the budget was spent before it
            started).
        result: the figures of its ``RESULT`` line (None unless ``"ok"``).
        detail: what it printed last on its error stream, or why it was killed or skipped.
        seconds: how long it ran.
    """

    status: str
    result: dict | None = None
    detail: str = ""
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """Whether the process printed its figures."""
        return self.status == "ok"


class Budget:
    """A wall-clock budget that every process run through it keeps to.

    Args:
        seconds: the budget, from when the object is made (None: no limit).
        clock: seconds since some fixed time (``time.monotonic``; a test passes its own).

    Example:
        >>> import sys
        >>> budget = Budget(30.0)
        >>> budget.run([sys.executable, "-c", "print('RESULT {\\"step\\": 0.5}')"]).result
        {'step': 0.5}
        >>> budget.run([sys.executable, "-c", "import time; time.sleep(60)"], limit=0.5).status
        'hung'
    """

    def __init__(self, seconds: float | None, clock: Callable[[], float] = time.monotonic):
        self.seconds, self._clock = seconds, clock
        self._started = clock()

    def left(self) -> float:
        """Seconds left (infinite without a limit; never below 0)."""
        if self.seconds is None:
            return float("inf")
        return max(self.seconds - (self._clock() - self._started), 0.0)

    def spent(self) -> bool:
        """Whether nothing is left."""
        return self.left() <= 0.0

    def run(self, command: Sequence[str], *, cwd: str | None = None, env: dict | None = None,
            limit: float | None = None) -> Outcome:
        """Runs ``command`` (in ``cwd``, with the environment ``env``: default this process's) for at
        most what is left (and at most ``limit`` seconds), killing it and every process it started
        when that runs out; its ``RESULT`` line is its figures."""
        timeout = min(self.left(), float("inf") if limit is None else limit)
        if timeout <= 0.0:
            return Outcome("skipped", detail="the budget was spent before it started")
        started = time.monotonic()
        # A session of its own: a kill reaches the processes it started too (a testbed's workers),
        # which would otherwise hold its output open and keep this waiting.
        process = subprocess.Popen(list(command), cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   start_new_session=True)
        try:
            out, err = process.communicate(timeout=None if timeout == float("inf") else timeout)
        except subprocess.TimeoutExpired:
            _kill_group(process.pid)
            process.communicate()
            return Outcome("hung", detail=f"killed after {timeout:.0f} s", seconds=time.monotonic() - started)
        finally:
            _kill_group(process.pid)  # whatever it left running when it ended
        seconds = time.monotonic() - started
        line = next((line for line in out.splitlines() if line.startswith(RESULT)), None)
        if line is None:
            return Outcome("failed", detail=err[-3000:] or f"exit status {process.returncode}", seconds=seconds)
        return Outcome("ok", result=json.loads(line[len(RESULT):]), seconds=seconds)


def _kill_group(group: int) -> None:
    try:
        os.killpg(group, signal.SIGKILL)
    except ProcessLookupError:  # nothing of it is left
        pass
