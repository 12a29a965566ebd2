"""Tick-Tock for memory-bound training: the largest batch and throughput with and without waves.

Plans a Transformer-like step for 4 V100s whose memory is capped at 512 MiB each, and asks
`max_batch` for the largest batch each strategy fits and its throughput there (simulated).

    python examples/tick_tock_memory.py
"""

from kerasflow.planner import synthetic
from kerasflow.planner.sim.report import format_table
from kerasflow.planner.search.maxbatch import max_batch


def main() -> None:
    graph = synthetic.transformer_like(blocks=4)
    rows = []
    for strategy in ("layerwise_model_parallel", "tick_tock_model_parallel", "data_parallel",
                     "tick_tock_data_parallel", "fastt", "fastt+waves"):
        found = max_batch(graph, "4xV100-nvlink", strategy, memory_limit=512 * 2**20)
        rows.append([strategy, str(found.batch), f"{found.samples_per_second:,.0f}",
                     f"{max(found.peak_memory.values()) / 2**20:.0f}"])
    print("Largest batch under 512 MiB per device (4xV100-nvlink, 10% headroom):")
    print(format_table(["strategy", "largest batch", "samples/s", "peak MiB"], rows))


if __name__ == "__main__":
    main()
