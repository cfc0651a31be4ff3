"""What the hang heartbeat costs a training step: the one store the trainer makes per step.

    .venv/bin/python benchmarks/heartbeat_cost.py

The trainer's per-step heartbeat work is ``beat[STEP] = step`` (hpctrain.job.heartbeat): into a memoryview
of a mapped /dev/shm file when the watchdog watches the run, into a plain list otherwise. This times that
store both ways against the same loop without it (best of several rounds of 10^6), and prints the extra
nanoseconds per step as its last line; a CPU training step here takes about 15 ms (trainer_overhead.py).
"""

import tempfile
import timeit
from pathlib import Path

from hpctrain.job.heartbeat import STEP, Heart, NoHeart

N, ROUNDS = 1_000_000, 7


def best(stmt: str, ns: dict) -> float:
    return min(timeit.repeat(stmt, globals=ns, number=N, repeat=ROUNDS)) / N * 1e9


def main() -> None:
    with tempfile.TemporaryDirectory() as d:
        heart = Heart(Path(d), 0, 0)
        try:
            ns = {"beat": heart.slots, "plain": NoHeart().slots, "STEP": STEP}
            loop = best("for i in range(100): pass", ns) / 100
            mapped = best("for i in range(100): beat[STEP] = i", ns) / 100 - loop
            listed = best("for i in range(100): plain[STEP] = i", ns) / 100 - loop
        finally:
            heart.close()
    print(f"store into the mapped heartbeat: {mapped:.1f} ns; into the stand-in list: {listed:.1f} ns")
    print(f"heartbeat cost per step: {mapped:.1f} ns ({mapped / 15e6 * 100:.5f} % of a 15 ms step)")


if __name__ == "__main__":
    main()
