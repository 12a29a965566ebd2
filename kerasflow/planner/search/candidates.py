"""The strategies ``plan`` tries: a registry of named builders with readable labels; ``Misfit``, one left out.

``REGISTRY`` maps each base candidate's name to its ``Candidate``, in trial order;
``candidate_plans`` builds them in that order and makes the others from them: FastT's op
splitting from the best list schedule (``<base>+hybrid``, ``<base>+split``) and the wave
candidates (``one_copy_data_parallel``, ``tick_tock_data_parallel``,
``tick_tock_model_parallel``, ``<best placement>+waves``). ``label`` names any of them for
people (``kerasflow compare``'s rows).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, NamedTuple

from ..ir.cluster import Cluster
from ..ir.graphtables import batch_statistics
from ..ir.plan import Plan
from ..schedule.cpop import cpop
from ..schedule.heft import heft
from ..parallel import baselines

# Builders take a ``request.PlanRequest``; annotated by name only, since that module imports this
# one (it checks candidate names against the registry).
__all__ = ["Candidate", "Misfit", "REGISTRY", "CANDIDATES", "PLANNED_CANDIDATES", "label", "strongest_host"]


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One base strategy ``plan`` tries, as ``REGISTRY`` holds it.

    Attributes:
        name: its name in ``Plan.algorithm``, ``Plan.candidates`` and ``PlanRequest.candidates``.
        label: a readable name (``kerasflow compare``'s row).
        build: ``build(request) -> Plan``. A list schedule's also takes ``splits=`` (layers cut
            across devices) and ``unless_slower_than=`` (seconds: None is returned, unsimulated,
            for a plan slower than that), which the split search passes.
        replicated: it replicates the whole step on every device (data parallelism): left out
            with ``replicated=False``, and for a model that refused a smaller batch.
        list_schedule: a list schedule (HEFT, CPOP), where the op-split search may start.
        applies: whether it is tried for a request, beyond being asked for (default: always).

    Example:
        >>> from kerasflow.planner import synthetic
        >>> from kerasflow.planner.search.request import PlanRequest
        >>> heft = REGISTRY["heft"]
        >>> heft.label, heft.list_schedule
        ('HEFT', True)
        >>> heft.build(PlanRequest(synthetic.chain_mlp(layers=2), "2xK80-pcie")).algorithm
        'heft'
    """

    name: str
    label: str
    build: Callable[..., Plan | None]
    replicated: bool = False
    list_schedule: bool = False
    applies: Callable[["PlanRequest"], bool] = lambda request: True


class Misfit(NamedTuple):
    """A candidate left out of the plans, and why: it did not fit the devices' memory, did not
    apply, or was skipped. A pair, so ``dict(misfits)`` is ``Plan.excluded``'s mapping.

    Example:
        >>> misfits = (Misfit("data_parallel", "simulated peak 9.0 MiB exceeds the budget"),)
        >>> misfits[0].name, dict(misfits)["data_parallel"]
        ('data_parallel', 'simulated peak 9.0 MiB exceeds the budget')
    """

    name: str
    reason: str


def strongest_host(cluster: Cluster) -> list[str]:
    """The devices of the host with the most total speed (the first such host on a tie).

    Example:
        >>> strongest_host(Cluster.preset("2x8xV100"))[0]
        '/job:worker/replica:0/task:0/device:GPU:0'
    """
    hosts = cluster.hosts()
    speed = {h: sum(cluster.device(d).speed for d in names) for h, names in hosts.items()}
    return hosts[max(hosts, key=lambda h: (speed[h], -h))]


def _list_schedule(algorithm: Callable[..., Plan | None], affinity: str) -> Callable[..., Plan | None]:
    def build(request: PlanRequest, splits=None, unless_slower_than=None) -> Plan | None:
        return algorithm(request.graph, request.cluster, batch_size=request.batch, memory_limit=request.memory_limit,
                         memory_headroom=request.memory_headroom, affinity=affinity, splits=splits,
                         unless_slower_than=unless_slower_than)
    return build


REGISTRY: dict[str, Candidate] = {candidate.name: candidate for candidate in (
    Candidate(baselines.DEFAULT_PLACEMENT, "default placement",
              lambda r: baselines.default_placement(r.graph, r.cluster, batch=r.batch)),
    Candidate("single_device", "single device", lambda r: baselines.single_device(r.graph, r.cluster, batch=r.batch)),
    # MirroredStrategy's math: each replica's BatchNormalization with its own share's statistics;
    # only where the user allows it, and for a graph where it differs from data_parallel.
    Candidate("data_parallel_replica_statistics", "data-parallel (each replica's own statistics)",
              lambda r: baselines.data_parallel(r.graph, r.cluster, batch=r.batch, synchronized=False),
              replicated=True, applies=lambda r: r.replica_statistics and bool(batch_statistics(r.graph).layer_ops)),
    Candidate("data_parallel", "data-parallel", lambda r: baselines.data_parallel(r.graph, r.cluster, batch=r.batch),
              replicated=True),
    # Several hosts: data parallelism inside the strongest host only, where the network
    # would cost more than the other hosts' devices give.
    Candidate("data_parallel_one_host", "data-parallel inside one host",
              lambda r: baselines.data_parallel(r.graph, r.cluster, devices=strongest_host(r.cluster), batch=r.batch),
              replicated=True, applies=lambda r: len(r.cluster.hosts()) > 1),
    Candidate("layerwise_model_parallel", "layer-wise model-parallel",
              lambda r: baselines.layerwise_model_parallel(r.graph, r.cluster, batch=r.batch)),
    Candidate("heft", "HEFT", _list_schedule(heft, "op"), list_schedule=True),
    Candidate("heft-layers", "HEFT (layer affinity)", _list_schedule(heft, "layer"), list_schedule=True),
    Candidate("cpop", "CPOP", _list_schedule(cpop, "op"), list_schedule=True),
    Candidate("cpop-layers", "CPOP (layer affinity)", _list_schedule(cpop, "layer"), list_schedule=True),
)}

CANDIDATES = tuple(REGISTRY)
# Every candidate but the default placement: ``candidates=PLANNED_CANDIDATES`` returns a plan to
# apply whatever it gains (a benchmark timing plans, a test forcing one).
PLANNED_CANDIDATES = CANDIDATES[1:]

# The candidates made from the registry's, the forms joined to a base's name with "+", and the
# families a model that refused a smaller batch leaves out ("op_splitting", "waves").
_LABELS = {
    **{candidate.name: candidate.label for candidate in REGISTRY.values()},
    "one_copy_data_parallel": "one-copy data-parallel",
    "tick_tock_data_parallel": "Tick-Tock data-parallel",
    "tick_tock_model_parallel": "Tick-Tock model-parallel",
    "split": "op splitting", "op_splitting": "op splitting", "waves": "Tick-Tock waves",
}


def label(candidate: str) -> str:
    """A readable name for a candidate, each "+"-joined part by its label (``"heft+split"`` ->
    ``"HEFT + op splitting"``); a part without one keeps its name.

    Example:
        >>> label("cpop-layers+split+waves")
        'CPOP (layer affinity) + op splitting + Tick-Tock waves'
        >>> label("gpipe-2")
        'gpipe-2'
    """
    return " + ".join(_LABELS.get(part, part) for part in candidate.split("+"))
