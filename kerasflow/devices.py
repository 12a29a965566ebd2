"""Device helpers: logical CPUs for a multi-device testbed, the devices kerasflow uses by default,
the one spelling of a device name every module compares, the local GPUs as TensorFlow has them
(kind, memory, the card each is carved from), the cost kind of every device (declared for
``kerasflow.testbed``'s), pinning a process to a core, and the wait for devices that run after
the host has moved on."""

from __future__ import annotations

import dataclasses
import functools
import os
import re
from typing import Sequence

from kerasflow.planner.errors import KerasflowError
from kerasflow.planner.ir.hardware import DEVICE_SPECS, GiB
from kerasflow.planner.ir.machine import SharedCompute

__all__ = ["virtual_cpus", "default_devices", "device_kind", "declare_kind", "device_memory", "normalize_device",
           "canonical_device", "known_devices", "task_of", "host_cpu", "device_type", "wait_for_devices", "pin_to_core",
           "LocalGPU", "describe_gpus", "local_gpus", "shared_cards", "UNKNOWN_DEVICE_MEMORY"]

_DEVICE = re.compile(r"device:([A-Za-z]+):(\d+)$", re.IGNORECASE)
# Devices whose cost kind was declared (``declare_kind``): a testbed task's CPU is one core.
_DECLARED_KINDS: dict[str, str] = {}


def normalize_device(device: str) -> str:
    """A local device's short name, the spelling plans use; a remote device keeps its full name.

    Example:
        >>> normalize_device("/job:localhost/replica:0/task:0/device:CPU:1")
        '/CPU:1'
        >>> normalize_device("/job:worker/replica:0/task:1/device:GPU:0")
        '/job:worker/replica:0/task:1/device:GPU:0'
    """
    if not device:
        return ""
    match = _DEVICE.search(device)
    if match is None or (device.startswith("/job:") and not device.startswith("/job:localhost")):
        return device
    return f"/{match.group(1).upper()}:{match.group(2)}"


def canonical_device(device: str) -> str:
    """The one spelling of a device name kerasflow compares: a local device's short name with its
    kind in capitals (``normalize_device``, and ``"/cpu:0"`` as ``"/CPU:0"``); a remote device
    keeps its full name.

    Example:
        >>> canonical_device("/cpu:1"), canonical_device("/job:localhost/replica:0/task:0/device:GPU:0")
        ('/CPU:1', '/GPU:0')
        >>> canonical_device("/job:worker/replica:0/task:1/device:GPU:0")
        '/job:worker/replica:0/task:1/device:GPU:0'
    """
    name = normalize_device(device)
    if name.startswith("/") and ":" in name and "device:" not in name.lower():
        kind, index = name[1:].split(":", 1)
        return f"/{kind.upper()}:{index}"
    return name


def known_devices() -> set[str]:
    """The devices TensorFlow has now (this process's, and every task's once connected), as
    ``canonical_device`` spells them.

    Example:
        >>> "/CPU:0" in known_devices()
        True
    """
    import tensorflow as tf

    return {canonical_device(d.name) for d in tf.config.list_logical_devices()}


def virtual_cpus(count: int = 4, *, intra_op_threads: int | None = None,
                 inter_op_threads: int | None = None) -> list[str]:
    """Splits the host CPU into ``count`` logical devices, so a laptop can try multi-device plans.

    Call it first thing, before TensorFlow runs any op. With ``intra_op_threads=1`` and
    ``inter_op_threads >= count`` a logical CPU behaves like a device of its own (each runs
    one op at a time, and they run side by side).

    Args:
        count: the number of logical CPUs.
        intra_op_threads: threads one op may use (None: TensorFlow's default).
        inter_op_threads: ops that may run at once (None: TensorFlow's default).

    Returns:
        The logical device names, e.g. ``["/CPU:0", ..., "/CPU:3"]``.

    Raises:
        KerasflowError: TensorFlow has already started, or ``count < 1``.

    Example:
        >>> import kerasflow
        >>> kerasflow.devices.virtual_cpus(4)  # doctest: +SKIP
        ['/CPU:0', '/CPU:1', '/CPU:2', '/CPU:3']
    """
    import tensorflow as tf

    if count < 1:
        raise KerasflowError(f"virtual_cpus needs count >= 1; received {count!r}.")
    cpus = tf.config.list_physical_devices("CPU")
    try:
        existing = tf.config.get_logical_device_configuration(cpus[0])
        if existing is None or len(existing) != count:
            tf.config.set_logical_device_configuration(cpus[0], [tf.config.LogicalDeviceConfiguration()] * count)
        if intra_op_threads is not None:
            tf.config.threading.set_intra_op_parallelism_threads(intra_op_threads)
        if inter_op_threads is not None:
            tf.config.threading.set_inter_op_parallelism_threads(inter_op_threads)
    except RuntimeError as error:
        current = [d.name for d in tf.config.list_logical_devices("CPU")]
        if len(current) == count:
            return [f"/CPU:{i}" for i in range(count)]
        raise KerasflowError(
            f"virtual_cpus({count}) must run before TensorFlow starts, but TensorFlow is already running with "
            f"{len(current)} CPU device(s) ({error}). Call kerasflow.devices.virtual_cpus first thing in your "
            "program, before building models or running ops.") from None
    return [f"/CPU:{i}" for i in range(count)]


def default_devices() -> list[str]:
    """All GPUs if there are any, else all logical CPUs (``"/GPU:0"``-style names)."""
    import tensorflow as tf

    gpus = tf.config.list_logical_devices("GPU")
    if gpus:
        return [f"/GPU:{i}" for i in range(len(gpus))]
    return [f"/CPU:{i}" for i in range(len(tf.config.list_logical_devices("CPU")))]


# The memory taken for a device TensorFlow says nothing of, and whose kind has no datasheet.
UNKNOWN_DEVICE_MEMORY = 16 * GiB
# The GPU kinds of kerasflow's presets, read from a card's name as a word of its own ("NVIDIA
# H100 80GB HBM3"; "GH200" is not "H200"), else from its compute capability (a GH200's 9.0 is
# an H100's; an H200, also 9.0, is named).
_KIND_IN_NAME = re.compile(r"\b(H200|H100|A100|V100|K80)\b")
_KIND_OF_CAPABILITY = {(9, 0): "H100", (8, 0): "A100", (7, 0): "V100", (3, 7): "K80"}
_MEMORY_IN_NAME = re.compile(r"(\d+)\s*GB\b")


@dataclasses.dataclass(frozen=True)
class LocalGPU:
    """A logical GPU of this process, as TensorFlow has it.

    Attributes:
        name: its device name (``"/GPU:1"``).
        card: the physical device it is carved from (``"/physical_device:GPU:0"``); logical
            GPUs of one card share its compute.
        kind: the kind costs are keyed by: a preset's (``"H100"``) or the card's own name.
        memory: its bytes: its ``memory_limit`` where it is carved from a card, else the
            card's: from its name where the name also gave the kind (or no preset has it),
            else its kind's datasheet, else ``UNKNOWN_DEVICE_MEMORY``.
        found: how kind and memory were found, in words.

    Example:
        >>> describe_gpus([("/physical_device:GPU:0", {"device_name": "NVIDIA H100 80GB HBM3"}, [30000, 30000])])[1]
        LocalGPU(name='/GPU:1', card='/physical_device:GPU:0', kind='H100', memory=31457280000, found='kind from \
its name; memory from its logical configuration (30000 MiB)')
    """

    name: str
    card: str
    kind: str
    memory: int
    found: str


def describe_gpus(cards: Sequence[tuple[str, dict, Sequence[int | None] | None]]) -> list[LocalGPU]:
    """The logical GPUs of ``cards``, numbered as TensorFlow numbers them.

    Args:
        cards: the visible physical GPUs in order, each ``(name, details, memory limits)``:
            ``tf.config.experimental.get_device_details``' dict (``device_name``,
            ``compute_capability``) and, for a card carved into logical GPUs, each one's
            ``memory_limit`` in MiB (None: not carved, one logical GPU of the whole card).

    Returns:
        One ``LocalGPU`` per logical GPU: a card's logical GPUs in a row, cards in order.

    Example:
        >>> [gpu.kind for gpu in describe_gpus([("/physical_device:GPU:0", {"device_name": "Quadro X"}, None)])]
        ['Quadro X']
    """
    found = []
    for card, details, limits in cards:
        kind, kind_found = _kind(details)
        whole, memory_found = _card_memory(details, kind)
        for limit in limits or [None]:
            memory = whole if limit is None else int(limit) * 2**20
            how = memory_found if limit is None else f"memory from its logical configuration ({int(limit)} MiB)"
            found.append(LocalGPU(f"/GPU:{len(found)}", card, kind, memory, f"{kind_found}; {how}"))
    return found


def _kind(details: dict) -> tuple[str, str]:
    name = str(details.get("device_name") or "GPU")
    match = _KIND_IN_NAME.search(name)
    if match:
        return match.group(1), "kind from its name"
    capability = tuple(details.get("compute_capability") or ())
    if capability in _KIND_OF_CAPABILITY:
        kind = _KIND_OF_CAPABILITY[capability]
        return kind, f"kind from its compute capability {capability[0]}.{capability[1]} ({name!r} is no preset's name)"
    return name, f"kind {name!r}: no preset has its name or its compute capability {capability or 'unknown'}"


def _card_memory(details: dict, kind: str) -> tuple[int, str]:
    # A name says the card's memory ("A100-SXM4-80GB"), unless the kind came from elsewhere: a
    # "GH200 480GB" counts its CPU's memory too, so its kind's datasheet is the safer figure.
    name = str(details.get("device_name") or "")
    match = _MEMORY_IN_NAME.search(name)
    if match and (_KIND_IN_NAME.search(name) or kind not in DEVICE_SPECS):
        return int(match.group(1)) * GiB, "memory from its name"
    if kind in DEVICE_SPECS:
        return int(DEVICE_SPECS[kind].memory), f"memory from the {kind} datasheet"
    return UNKNOWN_DEVICE_MEMORY, f"memory unknown: {UNKNOWN_DEVICE_MEMORY // GiB} GiB assumed"


@functools.lru_cache(maxsize=1)
def local_gpus() -> tuple[LocalGPU, ...]:
    """This process's logical GPUs (``describe_gpus`` of TensorFlow's visible GPUs, their details
    and logical configurations); empty without a GPU."""
    import tensorflow as tf

    cards = []
    for card in tf.config.get_visible_devices("GPU"):
        configuration = tf.config.get_logical_device_configuration(card)
        limits = [c.memory_limit for c in configuration] if configuration else None
        cards.append((card.name, tf.config.experimental.get_device_details(card), limits))
    return tuple(describe_gpus(cards))


def _local_gpu(device: str, gpus: Sequence[LocalGPU] | None) -> LocalGPU | None:
    """The local GPU of ``device``'s index (another host's GPU is taken to be alike)."""
    match = _DEVICE.search(device) or re.search(r"(GPU):(\d+)$", device, re.IGNORECASE)
    if match is None or match.group(1).upper() != "GPU":
        return None
    return next((gpu for gpu in (local_gpus() if gpus is None else gpus) if gpu.name == f"/GPU:{match.group(2)}"),
                None)


def device_kind(device: str, gpus: Sequence[LocalGPU] | None = None) -> str:
    """The cost kind of a device: its declared one (``declare_kind``), else ``"CPU"``, or the
    GPU's (``"H100"``; ``LocalGPU.kind``; ``gpus``: the local GPUs, default ``local_gpus()``).

    Example:
        >>> device_kind("/CPU:1")
        'CPU'
    """
    declared = _DECLARED_KINDS.get(canonical_device(device))
    if declared is not None:
        return declared
    if device_type(device) != "GPU":
        return "CPU"
    gpu = _local_gpu(device, gpus)
    return gpu.kind if gpu is not None else "GPU"


def declare_kind(devices: Sequence[str], kind: str) -> None:
    """From now on in this process, ``devices`` are of cost kind ``kind`` (their profiles, plans
    and calibration are that kind's): ``kerasflow.testbed`` declares its tasks' CPUs.

    Example:
        >>> declare_kind(["/job:worker/replica:0/task:7/device:CPU:0"], "CPU-core")
        >>> device_kind("/job:worker/replica:0/task:7/device:CPU:0")
        'CPU-core'
    """
    for device in devices:
        _DECLARED_KINDS[canonical_device(device)] = kind


def pin_to_core(core: int) -> None:
    """Runs this process on CPU core ``core`` only: every thread it has, and (as Linux has threads
    inherit their creator's cores) every thread it starts later, TensorFlow's included.

    Raises:
        KerasflowError: no such core among those this process may use, or not on Linux.

    Example:
        >>> pin_to_core(sorted(os.sched_getaffinity(0))[0])  # doctest: +SKIP
    """
    allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if core not in allowed:
        raise KerasflowError(f"This process may run on the cores {allowed} (os.sched_getaffinity; none off Linux). "
                             f"Received: core={core!r}")
    for thread in os.listdir("/proc/self/task"):
        os.sched_setaffinity(int(thread), {core})


def device_memory(device: str, gpus: Sequence[LocalGPU] | None = None) -> int:
    """A device's bytes: a local GPU's as TensorFlow has it (``LocalGPU.memory``; ``gpus`` as for
    ``device_kind``), else its kind's datasheet figure, else ``UNKNOWN_DEVICE_MEMORY``.

    Example:
        >>> device_memory("/CPU:0") == DEVICE_SPECS["CPU"].memory
        True
    """
    gpu = _local_gpu(device, gpus) if device_type(device) == "GPU" else None
    if gpu is not None:
        return gpu.memory
    kind = device_kind(device, gpus)
    return int(DEVICE_SPECS[kind].memory) if kind in DEVICE_SPECS else UNKNOWN_DEVICE_MEMORY


def shared_cards(devices: Sequence[str], gpus: Sequence[LocalGPU] | None = None) -> list[SharedCompute]:
    """The cards two or more of ``devices`` are carved from, each as one pool of compute: its
    logical GPUs run a kernel each at once, every kernel spread over the whole card.

    Example:
        >>> gpus = describe_gpus([("/physical_device:GPU:0", {"device_name": "NVIDIA H100"}, [1000, 1000])])
        >>> shared_cards(["/GPU:0", "/GPU:1"], gpus)
        [SharedCompute(devices=('/GPU:0', '/GPU:1'), threads=2, lanes=1)]
    """
    by_card: dict[str, list[str]] = {}
    for device in devices:
        gpu = _local_gpu(device, gpus) if device_type(device) == "GPU" and task_of(device) == "local" else None
        if gpu is not None:
            by_card.setdefault(gpu.card, []).append(device)
    return [SharedCompute(tuple(names), threads=len(names), lanes=1)
            for names in by_card.values() if len(names) > 1]


def task_of(device: str) -> str:
    """The task a device belongs to: ``"/job:worker/replica:0/task:1"``, or ``"local"`` for this process's
    devices named in short (``"/CPU:0"``).

    Example:
        >>> task_of("/job:worker/replica:0/task:1/device:GPU:0"), task_of("/GPU:3")
        ('/job:worker/replica:0/task:1', 'local')
    """
    if device.startswith("/job:") and "/device:" in device:
        return device.split("/device:", 1)[0]
    return "local"


def host_cpu(device: str) -> str:
    """The CPU of ``device``'s machine (its task's first CPU), in the same spelling: where
    TensorFlow runs the ops placed on ``device`` that it has no kernel for (string ops, lookup
    tables), and where a GPU cluster's plans put them (``Cluster.host``).

    Example:
        >>> host_cpu("/GPU:3"), host_cpu("/job:worker/replica:0/task:1/device:GPU:0")
        ('/CPU:0', '/job:worker/replica:0/task:1/device:CPU:0')
    """
    task = task_of(device)
    return "/CPU:0" if task == "local" else f"{task}/device:CPU:0"


def device_type(device: str) -> str:
    """``"GPU"`` or ``"CPU"``, from the last part of a device name, short or full.

    Example:
        >>> device_type("/job:worker/replica:0/task:1/device:GPU:0"), device_type("/CPU:1")
        ('GPU', 'CPU')
    """
    return "GPU" if "GPU" in device.upper().rsplit("/", 1)[-1] else "CPU"


def wait_for_devices() -> None:
    """Returns once every device has run the work queued for it.

    A GPU runs a step's kernels after the host has returned from the step (and so does every
    device when ``tf.config.experimental.set_synchronous_execution(False)``): a step timed or
    marked for the profiler ends here, not when the train function returns. Synchronous CPUs
    have nothing queued, and nothing is waited for.

    Example:
        >>> import tensorflow as tf
        >>> _ = tf.linalg.matmul(tf.ones([64, 64]), tf.ones([64, 64]))
        >>> wait_for_devices()  # the product is done
    """
    import tensorflow as tf

    if not tf.config.experimental.get_synchronous_execution() or any(
            device.device_type != "CPU" for device in tf.config.list_logical_devices()):
        tf.test.experimental.sync_devices()
