"""The compute of devices that share it (``SharedCompute``), for the simulator's event loop.

Tasks of devices in one pool share it (``SharedCompute.rate``): while ``k`` run, each progresses
at ``min(1, lanes / k)`` of its speed alone, so a task's end moves whenever one starts or ends
beside it (each such change reschedules the pool's running tasks; a superseded end event is
skipped). At most the pool's ``threads`` tasks run at once; a device with an order runs one at a
time, one without up to ``threads``. A device outside every pool, and the all-reduce ring, is a
pool of its own that runs one task at a time: there a task's timeline is as on an independent
device (``eventloop.exclusive``).
"""

from __future__ import annotations

import heapq

from .eventloop import Compute, EventLoop

__all__ = ["shared_pools"]


def shared_pools(loop: EventLoop) -> Compute:
    """The ``eventloop.Compute`` of ``loop.cluster``'s pools of shared compute.

    Example:
        >>> from kerasflow.planner import Cluster, Plan, synthetic
                >>> from kerasflow.planner.sim.taskgraph import build_task_graph
        >>> cluster, graph = Cluster.preset("logical-cpus:2"), synthetic.chain_mlp(layers=2)
        >>> tg = build_task_graph(graph, cluster, Plan(placement={o.name: "/CPU:0" for o in graph.ops}))
        >>> compute = EventLoop(tg, cluster, shared_pools).compute
        >>> compute.units, compute.replays  # both CPUs in pool 0; the ring a pool of its own
        ([0, 0, 3], False)
    """
    tg, cluster = loop.tg, loop.cluster
    num_devices, pools = len(tg.devices), len(cluster.shared)
    index = {name: i for i, name in enumerate(cluster.device_names)}
    pool = [cluster.pool_of[index[d]] if cluster.pool_of[index[d]] >= 0 else pools + r
            for r, d in enumerate(tg.devices)] + [pools + num_devices]
    threads = [p.threads for p in cluster.shared] + [1] * (num_devices + 1)
    rate = [p.rate for p in cluster.shared] + [lambda running: 1.0] * (num_devices + 1)
    # Per resource, how many tasks it may run at once.
    limit = [1 if tg.orders[r] is not None or pool[r] >= pools else threads[pool[r]] for r in range(num_devices)] + [1]
    members: list[list[int]] = [[] for _ in threads]  # per pool, its resources
    for r, p in enumerate(pool):
        members[p].append(r)
    left = list(tg.duration)  # seconds of work alone on the pool still to do
    on_pool: list[list[int]] = [[] for _ in threads]  # the tasks running on each pool
    since = [0.0] * len(threads)
    running, pick, start, dispatched, latest = loop.running, loop.pick, loop.start, loop.dispatched, loop.latest
    events, next_seq, push = loop.events, loop.next_seq, heapq.heappush

    def reschedule(p: int, now: float, joining: int = -1, leaving: int = -1) -> None:
        """Brings the pool's running tasks to ``now``, changes who runs, and pushes their new ends."""
        tasks = on_pool[p]
        done = (now - since[p]) * rate[p](len(tasks))
        for t in tasks:
            left[t] -= done
        if leaving >= 0:
            tasks.remove(leaving)
        if joining >= 0:
            tasks.append(joining)
        since[p] = now
        speed = rate[p](len(tasks))
        for t in tasks:
            seq = latest[t] = next_seq()
            push(events, (now + max(left[t], 0.0) / speed, seq, t))

    def fill(woken: list[int], now: float) -> None:
        for p in sorted(set(woken)):
            for r in members[p]:
                while running[r] < limit[r] and len(on_pool[p]) < threads[p]:
                    t = pick(r)
                    if t < 0:
                        break
                    running[r] += 1
                    start[t] = now
                    dispatched.append(t)
                    reschedule(p, now, joining=t)

    return Compute(pool, fill, reschedule, False)
