"""How kerasflow plans inside ``fit``: one ``Options`` object, from arguments, then ``KERASFLOW_*`` variables.

Every value is checked here, where it enters, so a bad one is an error when the strategy
or callback is made, never a failure at step 4.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any

from kerasflow.planner import Cluster, Plan
from kerasflow.planner.errors import KerasflowError

__all__ = ["Options", "parse_bool"]

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
_TICK_TOCK = ("auto", "on", "off")
_REPLICATED = ("auto", "on", "off")


def parse_bool(name: str, raw: Any) -> bool:
    """A boolean setting from an argument or an environment variable's text.

    Args:
        name: the setting, for the error message.
        raw: a bool, or one of 1/0, true/false, yes/no, on/off (any case).

    Raises:
        KerasflowError: anything else.

    Example:
        >>> parse_bool("KERASFLOW_SPLIT", "no"), parse_bool("split", True)
        (False, True)
    """
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise KerasflowError(f"{name} must be a boolean (1/0, true/false, yes/no, on/off). Received: {name}={raw!r}")


def _parse_int(name: str, raw: Any, minimum: int) -> int:
    try:
        value = int(str(raw).strip()) if not isinstance(raw, int) or isinstance(raw, bool) else raw
    except ValueError:
        value = None
    if value is None or isinstance(raw, bool) or value < minimum:
        raise KerasflowError(f"{name} must be an integer >= {minimum}. Received: {name}={raw!r}")
    return value


def _parse_memory(name: str, raw: Any) -> float | None:
    if raw is None:
        return None
    try:
        value = float(raw)
    except (TypeError, ValueError):
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise KerasflowError(f"{name} must be a positive number of bytes. Received: {name}={raw!r}")
    return value


def _parse_verbose(name: str, raw: Any) -> Any:
    if raw in ("auto", None):
        return "auto"
    text = str(raw).strip().lower()
    if text in ("auto",):
        return "auto"
    if text in _FALSE:
        return 0
    if text in _TRUE:
        return 1
    if text == "2":
        return 2
    raise KerasflowError(f"{name} must be 'auto', 0, 1 or 2 (as Keras' verbose). Received: {name}={raw!r}")


def _parse_tick_tock(name: str, raw: Any) -> str:
    text = str(raw).strip().lower()
    if text not in _TICK_TOCK:
        raise KerasflowError(f"{name} must be one of {list(_TICK_TOCK)}. Received: {name}={raw!r}")
    return text


def _parse_replicated(name: str, raw: Any) -> str:
    text = str(raw).strip().lower()
    if text in _REPLICATED:
        return text
    try:
        return "on" if parse_bool(name, raw) else "off"
    except KerasflowError:
        raise KerasflowError(f"{name} must be 'auto', 'on' or 'off' (or a boolean). Received: {name}={raw!r}") from None


@dataclasses.dataclass
class Options:
    """How kerasflow plans inside ``fit``; arguments first, then ``KERASFLOW_*`` variables.

    Environment: ``KERASFLOW_WARMUP_STEPS``, ``KERASFLOW_PROFILE_STEPS``, ``KERASFLOW_SPLIT``,
    ``KERASFLOW_TICK_TOCK``, ``KERASFLOW_REPLICATED``, ``KERASFLOW_MEMORY_LIMIT``,
    ``KERASFLOW_LOG_DIR``, ``KERASFLOW_VERBOSE``, ``KERASFLOW_DROP_SLOWER_PLAN`` — used for
    any argument left at None.
    Booleans take 1/0, true/false, yes/no or on/off.

    Example:
        >>> Options.build(["/CPU:0", "/CPU:1"], split="off", tick_tock="on").split
        False
    """

    devices: list[str]
    cluster: Cluster | None = None
    plan: Plan | None = None
    warmup_steps: int = 2
    profile_steps: int = 3
    # Off inside fit by default: on the CPU testbed split plans beat the unsplit plan on three
    # models of five and lost on two (docs/benchmarks.md).
    split: bool = False
    tick_tock: str = "auto"
    replicated: str = "auto"
    memory_limit: float | None = None
    log_dir: str | None = None
    verbose: Any = "auto"
    on_mismatch: str = "error"
    drop_slower_plan: bool = True
    max_split_evaluations: int = 16

    @classmethod
    def build(cls, devices, **kwargs) -> "Options":
        """Options from keyword arguments (None: the environment, then the default).

        Raises:
            KerasflowError: a value of the wrong kind or out of range, naming the setting.
        """
        env = os.environ

        def pick(name, parse, default):
            value = kwargs.get(name)
            label = name
            if value is None:
                label = f"KERASFLOW_{name.upper()}"
                value = env.get(label)
                if value in (None, ""):
                    return default
            return parse(label, value)

        on_mismatch = kwargs.get("on_mismatch") or "error"
        if on_mismatch not in ("error", "replan"):
            raise KerasflowError(f"on_mismatch must be 'error' or 'replan'. Received: on_mismatch={on_mismatch!r}")
        return cls(
            devices=list(devices), cluster=kwargs.get("cluster"), plan=kwargs.get("plan"),
            # Steps 0-1 trace and optimise the graph, so profiling starts at step 2 or later.
            warmup_steps=pick("warmup_steps", lambda n, v: _parse_int(n, v, 2), 2),
            profile_steps=pick("profile_steps", lambda n, v: _parse_int(n, v, 1), 3),
            split=pick("split", parse_bool, False),
            tick_tock=pick("tick_tock", _parse_tick_tock, "auto"),
            replicated=pick("replicated", _parse_replicated, "auto"),
            memory_limit=pick("memory_limit", _parse_memory, None),
            log_dir=pick("log_dir", lambda n, v: str(v), None),
            verbose=pick("verbose", _parse_verbose, "auto"),
            on_mismatch=on_mismatch,
            drop_slower_plan=pick("drop_slower_plan", parse_bool, True))

    def copy(self) -> "Options":
        """An independent copy (each model gets its own driver and options)."""
        return dataclasses.replace(self, devices=list(self.devices))
