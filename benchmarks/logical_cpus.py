"""How logical CPUs share the host: the same independent work on one device and spread over several.

The simulator models each logical CPU as a device of its own that runs one op at a time. This
measures what the host does instead: ``chains`` independent chains of four matrix products
(``n`` x ``n``, float32), traced in one ``tf.function``, placed three ways:

- ``one chain``: a single chain on ``/CPU:0`` (the unit of the table);
- ``all on /CPU:0``: every chain on ``/CPU:0``, the default placement (TensorFlow's inter-op
  threads run independent ops side by side on one device);
- ``spread``: chain ``i`` on ``/CPU:i``, as a plan of independent branches would place them.

Each round runs the three once, in turn; the table gives each placement's median over the
rounds as a multiple of one chain's median. A machine model that is right predicts "spread" no
faster than the host's cores allow, and "all on /CPU:0" faster than one op at a time.

    python benchmarks/logical_cpus.py                 # sizes 64, 256, 768; 4 chains; 15 rounds
    python benchmarks/logical_cpus.py --sizes 512 --chains 2 --rounds 30
"""

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import kerasflow  # noqa: E402


def chained_products(n: int, devices: list[str]):
    """A function running one chain of four products per entry of ``devices``, on that device."""
    import tensorflow as tf

    inputs = []
    for device in devices:
        with tf.device(device):
            inputs.append(tf.random.normal((n, n)))

    @tf.function
    def run():
        sums = []
        for device, x in zip(devices, inputs):
            with tf.device(device):
                y = x
                for _ in range(4):
                    y = tf.matmul(y, x) * 1e-3  # scaled: the values stay finite
                sums.append(tf.reduce_sum(y))
        return tf.add_n(sums)

    run()  # traced and warmed up
    return run


def seconds(function) -> float:
    started = time.perf_counter()
    function().numpy()
    return time.perf_counter() - started


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 256, 768], help="matrix sizes n")
    parser.add_argument("--chains", type=int, default=4, help="independent chains (and logical CPUs)")
    parser.add_argument("--rounds", type=int, default=15, help="alternating rounds; the medians are reported")
    args = parser.parse_args(argv)
    kerasflow.devices.virtual_cpus(args.chains)
    print(f"{os.cpu_count()} cores, {args.chains} logical CPUs; medians of {args.rounds} alternating rounds")
    print(f"{'n':>5}  {'one chain':>10}  {'all on /CPU:0':>14}  {'spread':>7}")
    for n in args.sizes:
        placements = {
            "one": chained_products(n, ["/CPU:0"]),
            "same": chained_products(n, ["/CPU:0"] * args.chains),
            "spread": chained_products(n, [f"/CPU:{i}" for i in range(args.chains)]),
        }
        times = {name: [] for name in placements}
        for _ in range(args.rounds):
            for name, function in placements.items():
                times[name].append(seconds(function))
        one, same, spread = (statistics.median(times[name]) for name in ("one", "same", "spread"))
        print(f"{n:>5}  {one * 1e3:>7.2f} ms  {same / one:>13.2f}x  {spread / one:>6.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
