"""The simulator's event loop for clusters whose devices share compute (``SharedCompute``).

Tasks of devices in one pool share it (``SharedCompute.rate``): while ``k`` run, each progresses
at ``min(1, lanes / k)`` of its speed alone, so a task's end moves whenever one starts or ends
beside it (each such change reschedules the pool's running tasks; a superseded end event is
skipped). At most the pool's ``threads`` tasks run at once; a device with an order runs one at a
time, one without up to ``threads``. A device outside every pool, and the all-reduce ring, is a
pool of its own that runs one task at a time: there the loop reproduces
``simulator.run_task_graph``'s timeline. Transfers are as in that loop: one at a time per
directed link, once per destination device. The bookkeeping of readiness and transfers repeats
that loop's rather than sharing helpers with it: that loop is the planner's hot path, inlined for
speed, and stays as it was for clusters that share nothing.
"""

from __future__ import annotations

import heapq

from ..ir.cluster import Cluster
from .taskgraph import TaskGraph, queued_tasks

__all__ = ["run_shared"]


def run_shared(tg: TaskGraph, cluster: Cluster) -> tuple[list[float], list[float], list[tuple], list[int]]:
    """Runs ``tg`` on ``cluster`` with shared compute.

    Returns:
        ``(start, end, transfers, dispatch order)`` as ``simulator.run_task_graph`` keeps them
        (an end of -1 marks a task that never ran).
    """
    n = len(tg)
    num_devices = len(tg.devices)
    resource, duration, outputs, priority = tg.resource, tg.duration, tg.outputs, tg.priority
    latency, inverse_bw = cluster.latency_matrix, cluster.inverse_bandwidth_matrix
    index = {name: i for i, name in enumerate(cluster.device_names)}
    pool_of_cluster = cluster.pool_of
    pools = len(cluster.shared)
    # Per resource (devices, then the ring): its pool, and how many tasks it may run at once.
    pool = [pool_of_cluster[index[d]] if pool_of_cluster[index[d]] >= 0 else pools + r
            for r, d in enumerate(tg.devices)] + [pools + num_devices]
    threads = [p.threads for p in cluster.shared] + [1] * (num_devices + 1)
    rate = [p.rate for p in cluster.shared] + [lambda running: 1.0] * (num_devices + 1)
    limit = [1 if tg.orders[r] is not None or pool[r] >= pools else threads[pool[r]] for r in range(num_devices)]
    limit.append(1)
    orders = list(tg.orders) + [None]
    queued = queued_tasks(tg)
    members: list[list[int]] = [[] for _ in threads]  # per pool, its resources
    for r, p in enumerate(pool):
        members[p].append(r)

    missing = list(tg.npreds)
    ready_at = [0.0] * n
    start = [0.0] * n
    end = [-1.0] * n
    left = list(duration)  # seconds of work alone on the pool still to do
    is_ready = [False] * n
    running = [0] * (num_devices + 1)
    position = [0] * (num_devices + 1)
    queues: list[list] = [[] for _ in range(num_devices + 1)]
    on_pool: list[list[int]] = [[] for _ in threads]  # the tasks running on each pool
    since = [0.0] * len(threads)
    version = [0] * len(threads)
    link_free = [[0.0] * num_devices for _ in range(num_devices)]
    transfers: list[tuple] = []
    dispatched: list[int] = []
    events: list[tuple] = []  # (time, seq, task or ~task for an arrival, the pool's version for an end or -1)
    push, pop = heapq.heappush, heapq.heappop
    seq = 0

    def reschedule(p: int, now: float, joining: int = -1, leaving: int = -1) -> None:
        """Brings the pool's running tasks to ``now``, changes who runs, and pushes their new ends."""
        nonlocal seq
        tasks = on_pool[p]
        done = (now - since[p]) * rate[p](len(tasks))
        for t in tasks:
            left[t] -= done
        if leaving >= 0:
            tasks.remove(leaving)
        if joining >= 0:
            tasks.append(joining)
        since[p] = now
        version[p] += 1
        speed = rate[p](len(tasks))
        for t in tasks:
            seq += 1
            push(events, (now + max(left[t], 0.0) / speed, seq, t, version[p]))

    def next_task(r: int) -> int:
        queue = queues[r]
        if queue:
            return pop(queue)[1]
        order = orders[r]
        if order is None or position[r] >= len(order) or not is_ready[order[position[r]]]:
            return -1
        position[r] += 1
        return order[position[r] - 1]

    def fill(p: int, now: float) -> None:
        """Starts tasks on the pool's resources while threads and ready tasks last."""
        for r in members[p]:
            while running[r] < limit[r] and len(on_pool[p]) < threads[p]:
                t = next_task(r)
                if t < 0:
                    break
                running[r] += 1
                start[t] = now
                dispatched.append(t)
                reschedule(p, now, joining=t)

    woken: set[int] = set()

    def make_ready(c: int, now: float) -> None:
        nonlocal seq
        r = resource[c]
        if r < 0:  # an instant task (a wave barrier) finishes as it becomes ready
            start[c] = now
            seq += 1
            push(events, (now, seq, c, -1))
            return
        if queued[c]:
            push(queues[r], (priority[c], c))
        else:
            is_ready[c] = True
        woken.add(pool[r])

    for t in range(n):
        if missing[t] == 0:
            make_ready(t, 0.0)
    for p in sorted(woken):
        fill(p, 0.0)
    woken.clear()

    while events:
        now, _, t, seen = pop(events)
        if t < 0:  # the inputs of task ~t have arrived
            make_ready(~t, now)
        else:
            src = resource[t]
            if src >= 0:
                p = pool[src]
                if seen != version[p]:
                    continue  # superseded: the pool's sharing changed since this end was pushed
                running[src] -= 1
                reschedule(p, now, leaving=t)
                woken.add(p)
            end[t] = now
            on_device = 0 <= src < num_devices
            for entry_index, (_, nbytes, consumers) in enumerate(outputs[t]):
                arrivals: dict[int, float] = {}
                for c in consumers:
                    dst = resource[c]
                    if dst == src or dst < 0 or dst >= num_devices or not on_device:
                        arrival = now
                    elif dst in arrivals:
                        arrival = arrivals[dst]
                    else:
                        row = link_free[src]
                        begin = max(now, row[dst])
                        arrival = row[dst] = arrivals[dst] = begin + latency[src][dst] + nbytes * inverse_bw[src][dst]
                        transfers.append((t, entry_index, src, dst, begin, arrival, nbytes))
                    ready_at[c] = max(ready_at[c], arrival)
                    missing[c] -= 1
                    if missing[c] == 0:
                        if ready_at[c] <= now:
                            make_ready(c, now)
                        else:
                            seq += 1
                            push(events, (ready_at[c], seq, ~c, -1))
        if woken and (not events or events[0][0] > now):
            for p in sorted(woken):
                fill(p, now)
            woken.clear()
    return start, end, transfers, dispatched
