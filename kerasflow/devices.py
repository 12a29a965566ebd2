"""Device helpers: logical CPUs for a multi-device testbed, the devices kerasflow uses by default,
the one spelling of a device name every module compares, and the wait for devices that run
after the host has moved on."""

from __future__ import annotations

import re

from kerasflow.planner.errors import KerasflowError

__all__ = ["virtual_cpus", "default_devices", "device_kind", "normalize_device", "task_of", "device_type",
           "wait_for_devices"]

_DEVICE = re.compile(r"device:([A-Za-z]+):(\d+)$", re.IGNORECASE)


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


_KNOWN_KINDS = ("H200", "H100", "A100", "V100", "K80")


def device_kind(device: str) -> str:
    """The cost kind of a device: ``"CPU"``, or the GPU's model (``"H100"``) where known.

    Example:
        >>> device_kind("/CPU:1")
        'CPU'
    """
    if "GPU" not in device.upper():
        return "CPU"
    import tensorflow as tf

    index = int(device.rsplit(":", 1)[-1])
    gpus = tf.config.list_physical_devices("GPU")
    if index < len(gpus):
        name = tf.config.experimental.get_device_details(gpus[index]).get("device_name", "GPU")
        for kind in _KNOWN_KINDS:
            if kind in name:
                return kind
        return name
    return "GPU"


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
