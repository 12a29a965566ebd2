"""How kerasflow plans inside ``fit``: one frozen ``Options``, from arguments, then ``KERASFLOW_*`` variables.

Both doors (the strategy and the callback) hand their arguments to ``Options.from_arguments``,
which parses each setting once and makes every check of devices, cluster and plan, so a bad value
is the same error through either door when it is made, never a failure at step 4. Knobs come in
two styles only: a yes/no setting is a boolean (``drop_slower_plan``), a setting with more
choices is one of its lowercase names (``split``, ``tick_tock``, ``replicated``, ``deterministic``:
``"auto"``, ``"on"`` or ``"off"``;
``on_mismatch``: ``"error"`` or ``"replan"``). ``split`` was a boolean before it had
``"auto"``, so it still takes one (or its words), as ``"on"`` or ``"off"``.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, Callable, Sequence

from kerasflow.devices import canonical_device, default_devices, device_type, host_cpu, known_devices
from kerasflow.planner import Cluster, Plan
from kerasflow.planner.errors import KerasflowError

__all__ = ["Options", "parse_bool"]

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
_THREE_WAY = ("auto", "on", "off")


def parse_bool(name: str, raw: Any) -> bool:
    """A boolean setting from an argument or an environment variable's text.

    Args:
        name: the setting, for the error message.
        raw: a bool, or one of 1/0, true/false, yes/no, on/off (any case).

    Raises:
        KerasflowError: anything else.

    Example:
        >>> parse_bool("KERASFLOW_DROP_SLOWER_PLAN", "no"), parse_bool("drop_slower_plan", True)
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


def _parse_int(minimum: int):
    def parse(name: str, raw: Any) -> int:
        try:
            value = raw if isinstance(raw, int) and not isinstance(raw, bool) else int(str(raw).strip())
        except ValueError:
            value = None
        if value is None or isinstance(raw, bool) or value < minimum:
            raise KerasflowError(f"{name} must be an integer >= {minimum}. Received: {name}={raw!r}")
        return value
    return parse


def _parse_positive(unit: str, *, optional: bool):
    """A parser of a positive finite number of ``unit`` (None passes through when ``optional``)."""
    def parse(name: str, raw: Any) -> float | None:
        if raw is None and optional:
            return None
        try:
            value = math.nan if isinstance(raw, bool) else float(raw)
        except (TypeError, ValueError, OverflowError):
            value = math.nan
        if not math.isfinite(value) or value <= 0:
            raise KerasflowError(f"{name} must be a positive number of {unit}. Received: {name}={raw!r}")
        return value
    return parse


def _parse_verbose(name: str, raw: Any) -> Any:
    text = "auto" if raw is None else str(raw).strip().lower()
    if text == "auto":
        return "auto"
    if text in _FALSE or text in _TRUE or text == "2":
        return 2 if text == "2" else int(text in _TRUE)
    raise KerasflowError(f"{name} must be 'auto', 0, 1 or 2 (as Keras' verbose). Received: {name}={raw!r}")


def _parse_choice(choices: tuple[str, ...]):
    def parse(name: str, raw: Any) -> str:
        text = raw.strip().lower() if isinstance(raw, str) else None
        if text not in choices:
            raise KerasflowError(f"{name} must be one of {list(choices)}. Received: {name}={raw!r}")
        return text
    return parse


def _parse_split(name: str, raw: Any) -> str:
    text = str(raw).strip().lower()
    if text in _THREE_WAY:
        return text
    if text in _TRUE or text in _FALSE:  # True, 1, "yes", ...: split was a boolean before "auto"
        return "on" if text in _TRUE else "off"
    raise KerasflowError(f"{name} must be one of {list(_THREE_WAY)}, or a boolean. Received: {name}={raw!r}")


def _parse_text(name: str, raw: Any) -> str | None:
    return None if raw is None else str(raw)


# Each setting's parser; None (an argument left out) takes KERASFLOW_<NAME>, then the default.
_PARSERS = {
    # Steps 0-1 trace and optimise the graph, so profiling starts at step 2 or later.
    "warmup_steps": _parse_int(2),
    "profile_steps": _parse_int(1),
    "split": _parse_split,
    "tick_tock": _parse_choice(_THREE_WAY),
    "replicated": _parse_choice(_THREE_WAY),
    "memory_limit": _parse_positive("bytes", optional=True),
    "log_dir": _parse_text,
    "verbose": _parse_verbose,
    "on_mismatch": _parse_choice(("error", "replan")),
    "drop_slower_plan": parse_bool,
    "deterministic": _parse_choice(_THREE_WAY),
    # A split search tries one plan at least; split="off" is how to try none.
    "max_split_evaluations": _parse_int(1),
    "background_planning": parse_bool,
    "planning_time_limit": _parse_positive("seconds", optional=False),
}


@dataclasses.dataclass(frozen=True)
class Options:
    """How kerasflow plans inside ``fit``, checked and frozen (see ``FastTStrategy`` for each).

    ``Options.from_arguments`` makes them from what a user types (both doors call it); the
    constructor, and ``dataclasses.replace``, take each setting already parsed (``split="on"``,
    not True) and refuse anything else.

    Attributes:
        devices: the devices planned over.
        cluster: the cluster planned for (None: the CPU testbed for logical CPUs, else measured).
        plan: a plan given up front (None: profile and plan inside ``fit``).
        warmup_steps: steps on the default placement before profiling (>= 2).
        profile_steps: profiled steps (>= 1).
        split: ``"auto"``, ``"on"`` or ``"off"``: whether the planner may split layers across
            devices (``"auto"``: where no two of them share compute; ``may_split`` decides).
        tick_tock: ``"auto"``, ``"on"`` or ``"off"``.
        replicated: ``"auto"``, ``"on"`` or ``"off"``.
        memory_limit: a cap in bytes for every device, or None.
        log_dir: where plan, profile and timeline files go, or None.
        verbose: ``"auto"``, 0, 1 or 2.
        on_mismatch: ``"error"`` or ``"replan"`` for a given plan made for another model.
        drop_slower_plan: whether a plan measured slower than the default placement gives way.
        deterministic: ``"auto"``, ``"on"`` or ``"off"``: whether only plans that compute bit for
            bit as the default placement may run (``"auto"``: when TensorFlow's op determinism is
            on; ``placement_only`` decides).
        max_split_evaluations: how many split candidates the planner simulates (>= 1).
        background_planning: whether the planner runs in a process of its own while training
            goes on on the default placement (True), or inside ``fit``, which waits for it (False).
        planning_time_limit: seconds the planner may take beside training before it is stopped
            and the default placement kept.

    Environment: ``KERASFLOW_WARMUP_STEPS``, ``KERASFLOW_PROFILE_STEPS``, ``KERASFLOW_SPLIT``,
    ``KERASFLOW_TICK_TOCK``, ``KERASFLOW_REPLICATED``, ``KERASFLOW_MEMORY_LIMIT``,
    ``KERASFLOW_LOG_DIR``, ``KERASFLOW_VERBOSE``, ``KERASFLOW_ON_MISMATCH``,
    ``KERASFLOW_DROP_SLOWER_PLAN``, ``KERASFLOW_DETERMINISTIC``, ``KERASFLOW_MAX_SPLIT_EVALUATIONS``,
    ``KERASFLOW_BACKGROUND_PLANNING``, ``KERASFLOW_PLANNING_TIME_LIMIT``, read by
    ``from_arguments`` for any setting left at None.

    Example:
        >>> Options.from_arguments(devices=["/CPU:0", "/CPU:1"], split=False, tick_tock="on").split
        'off'
        >>> Options(devices=("/CPU:0", "/CPU:1"), split="on").split
        'on'
    """

    devices: tuple[str, ...]
    cluster: Cluster | None = None
    plan: Plan | None = None
    warmup_steps: int = 2
    profile_steps: int = 3
    # "auto": on devices that share one pool of compute (logical CPUs) no split can shorten the
    # critical path, as its shards take cores from one another; elsewhere it is where FastT gains.
    split: str = "auto"
    tick_tock: str = "auto"
    replicated: str = "auto"
    memory_limit: float | None = None
    log_dir: str | None = None
    verbose: Any = "auto"
    on_mismatch: str = "error"
    drop_slower_plan: bool = True
    deterministic: str = "auto"
    max_split_evaluations: int = 16
    # Training goes on while the planner runs: the user's wait is the profiled steps alone.
    background_planning: bool = True
    planning_time_limit: float = 300.0

    def __post_init__(self):
        # Checked, never converted: from_arguments parsed each setting once, and a value given
        # here (or to dataclasses.replace) must already be what its parser makes of it.
        object.__setattr__(self, "devices", tuple(self.devices))
        for name, parse in _PARSERS.items():
            _check_parsed(name, parse, getattr(self, name))

    @classmethod
    def from_arguments(cls, *, door: str = "Options", options: "Options | None" = None,
                       join: Callable[[Any, Any], tuple[Any, Any]] | None = None,
                       devices: Sequence[str] | None = None, cluster: Cluster | str | None = None,
                       plan: Plan | str | os.PathLike | None = None, **settings) -> "Options":
        """The options of a door's arguments, every one checked: what both doors call.

        Args:
            door: who asks (``"FastTStrategy"``, ``"FastT"``), named in the errors.
            options: ``Options`` made beforehand, in place of every other argument but ``join``
                (their devices, cluster and plan checked as arguments are).
            join: the strategy's several machines: called once the settings are parsed, with the
                devices and cluster asked for, it connects and returns those to plan over
                (every task's devices, the two-level cluster).
            devices: the devices to plan over, in any spelling ``canonical_device`` reads
                (default: ``kerasflow.devices.default_devices()``).
            cluster: a ``Cluster``, a preset name or a cluster file (``Cluster.resolve``).
            plan: a ``Plan`` or a plan file's path (``with_plan``).
            **settings: the other attributes, as a user spells them (``split=True``,
                ``warmup_steps="4"``); one left at None takes ``KERASFLOW_<NAME>``, then the default.

        Raises:
            KerasflowError: an unknown setting; a value of the wrong kind or out of range,
                naming the setting (or the variable it came from); a device that does not exist;
                a cluster without the devices; a plan using other devices; ``options=`` with a
                keyword argument.

        Example:
            >>> options = Options.from_arguments(devices=["/cpu:0", "/CPU:1"], cluster="cpu-testbed:2",
            ...                                  warmup_steps="4")
            >>> options.devices, options.cluster.name, options.warmup_steps
            (('/CPU:0', '/CPU:1'), 'cpu-testbed:2', 4)
            >>> Options.from_arguments(options=options) == options
            True
        """
        _refuse_unknown(settings)
        if options is not None:
            _refuse_both(door, {"devices": devices, "cluster": cluster, "plan": plan, **settings})
            devices, cluster, plan = options.devices, options.cluster, options.plan
            settings = {name: getattr(options, name) for name in _PARSERS}
        else:
            settings = _parsed(settings)
        if join is not None:
            devices, cluster = join(devices, cluster)
        devices = tuple(canonical_device(d) for d in (devices or default_devices()))
        _refuse_missing(door, devices)
        cluster = None if cluster is None else Cluster.resolve(cluster)
        absent = [d for d in devices if cluster is not None and d not in cluster.device_names]
        if absent:
            raise KerasflowError(f"The cluster {cluster.name!r} has no device(s) {absent}; its devices are "
                                 f"{cluster.device_names}.")
        made = cls(devices=devices, cluster=cluster, **settings)
        return made if plan is None else made.with_plan(plan, door=door)

    def with_plan(self, plan: Plan | str | os.PathLike, *, door: str = "Options") -> "Options":
        """These options with ``plan``, which may use only their devices.

        Args:
            plan: a ``Plan`` or a plan file's path.
            door: who asks, named in the error.

        Raises:
            KerasflowError: the plan uses a device these options do not have.

        Example:
            >>> options = Options(devices=("/CPU:0", "/CPU:1"))
            >>> options.with_plan(Plan(placement={"dense": "/CPU:1"}, algorithm="given")).plan.devices()
            ['/CPU:1']
        """
        if isinstance(plan, (str, os.PathLike)):
            plan = Plan.load(plan)
        # A GPU's host CPU runs the ops no GPU can (string ops, lookup tables: ``Cluster.host``).
        hosts = {host_cpu(device) for device in self.devices if device_type(device) == "GPU"}
        unknown = sorted(set(plan.devices()) - set(self.devices) - hosts)
        if unknown:
            raise KerasflowError(f"The plan uses device(s) {unknown} that {door} does not have "
                                 f"({list(self.devices)}). Replan for these devices.")
        return dataclasses.replace(self, plan=plan)


def _check_parsed(name: str, parse: Callable[[str, Any], Any], value: Any) -> None:
    parsed = parse(name, value)  # a value no spelling of which is right is refused as the doors refuse it
    # True == 1: a bool where a number is meant (or a number for a bool) is another spelling too.
    if parsed != value or isinstance(parsed, bool) != isinstance(value, bool):
        raise KerasflowError(f"Options takes {name} parsed, as {parsed!r}; Options.from_arguments (and the "
                             f"strategy and callback) read its other spellings. Received: {name}={value!r}")


def _refuse_unknown(settings: dict[str, Any]) -> None:
    unknown = sorted(set(settings) - set(_PARSERS))
    if unknown:
        raise KerasflowError(f"Unknown kerasflow setting(s) {unknown}. Received: {unknown[0]}="
                             f"{settings[unknown[0]]!r}")


def _refuse_both(door: str, arguments: dict[str, Any]) -> None:
    given = [name for name, value in arguments.items() if value is not None]
    if given:
        raise KerasflowError(
            f"{door} got options= and the keyword argument(s) {given}: pass either options= or the keyword "
            f"arguments (dataclasses.replace(options, {given[0]}=...) changes one of its settings). Received: "
            f"{given[0]}={arguments[given[0]]!r}")


def _refuse_missing(door: str, devices: Sequence[str]) -> None:
    known = known_devices()
    missing = [d for d in devices if d not in known]
    if missing:
        raise KerasflowError(
            f"{door} got device(s) {missing} that do not exist; TensorFlow has {sorted(known)}. "
            "Call kerasflow.devices.virtual_cpus(4) before TensorFlow starts for logical CPUs, or pass "
            "devices= with existing ones.")


def _parsed(settings: dict[str, Any]) -> dict[str, Any]:
    """Each setting given, else its ``KERASFLOW_<NAME>`` variable's, parsed once (and named as it
    came, for the error); one set by neither is left out, to take its default."""
    given = {}
    for name, parse in _PARSERS.items():
        value = settings.get(name)
        if value is not None:
            given[name] = parse(name, value)
            continue
        variable = f"KERASFLOW_{name.upper()}"
        if os.environ.get(variable, "") != "":
            given[name] = parse(variable, os.environ[variable])
    return given
