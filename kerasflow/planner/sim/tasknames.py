"""The names of a task graph's tasks, built and read here only.

A task is an op of the graph, or a copy of one (``<op>@r<replica>@w<wave>@s<shard>``, each part
present only when the plan has replicas, waves or shards), or an auxiliary task that moves data
(``<op>:<output>@<role>``, then where it applies ``@r<replica>``, ``@w<wave>``, ``@<device>``), or
the barrier that holds a wave's forward pass (``@barrier@r<replica>@w<wave>``).
Plans list op tasks in their per-device orders; the applier reads those names back.
"""

from __future__ import annotations

__all__ = ["copy_name", "parse_copy_name", "auxiliary_name", "barrier_name", "with_replica", "replica_template"]


def copy_name(op: str, *, replica: int = -1, wave: int = -1, shard: int = -1) -> str:
    """The task name of ``op``'s copy for a replica, wave and shard (-1: not copied that way).

    Example:
        >>> copy_name("dense/MatMul", wave=1, shard=0)
        'dense/MatMul@w1@s0'
    """
    if replica >= 0:
        op = f"{op}@r{replica}"
    if wave >= 0:
        op = f"{op}@w{wave}"
    return f"{op}@s{shard}" if shard >= 0 else op


def parse_copy_name(task: str) -> tuple[str, int, int, int]:
    """``(op, replica, wave, shard)`` of an op task's name (-1 where the name has no such part).

    Example:
        >>> parse_copy_name("dense/MatMul@w1@s0")
        ('dense/MatMul', -1, 1, 0)
    """
    op, *tags = task.split("@")
    found = {"r": -1, "w": -1, "s": -1}
    for tag in tags:
        if tag[:1] in found and tag[1:].isdigit():
            found[tag[:1]] = int(tag[1:])
    return op, found["r"], found["w"], found["s"]


def auxiliary_name(op: str, output: int, role: str, *, replica: int = -1, wave: int = -1,
                   device: str | None = None) -> str:
    """The name of a task that moves output ``output`` of ``op`` (a split, concat, sum or all-reduce).

    Example:
        >>> auxiliary_name("dense/MatMul", 0, "concat", wave=1, device="/GPU:0")
        'dense/MatMul:0@concat@w1@/GPU:0'
    """
    name = f"{op}:{output}@{role}"
    name += f"@r{replica}" if replica >= 0 else ""
    name += f"@w{wave}" if wave >= 0 else ""
    return name + (f"@{device}" if device is not None else "")


def barrier_name(replica: int, wave: int) -> str:
    """The name of the task wave ``wave``'s forward pass waits on (Tick-Tock's offset).

    Example:
        >>> barrier_name(0, 1)
        '@barrier@r0@w1'
    """
    return f"@barrier@r{replica}@w{wave}"


def with_replica(task: str, replica: int) -> str:
    """``task``'s name for another replica (data parallelism simulates replica 0 and mirrors it).

    Example:
        >>> with_replica("dense/MatMul@r0@w1", 3)
        'dense/MatMul@r3@w1'
    """
    head, tail = replica_template(task)
    return task if tail is None else f"{head}@r{replica}{tail}"


def replica_template(task: str) -> tuple[str, str | None]:
    """``task``'s name split around its ``@r0`` part: ``(before, after)``, or ``(task, None)``
    without one (the simulator renames every mirrored task with it, so it avoids re-parsing).

    Example:
        >>> replica_template("a:0@sum@r0@/GPU:0")
        ('a:0@sum', '@/GPU:0')
    """
    head, found, tail = task.partition("@r0")
    while found and tail[:1] not in ("", "@"):  # "@r01": another replica's tag
        more_head, found, tail = tail.partition("@r0")
        head = f"{head}@r0{more_head}"
    return (head, tail) if found else (task, None)
