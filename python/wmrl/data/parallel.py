"""Reading many trajectory files at once: one process per file.

gzip decoding of the frames is the cost of loading, and it runs under the GIL, so files are
read by separate (spawned: no inherited CUDA or GL state) processes."""

from __future__ import annotations

from typing import Callable, Sequence, TypeVar

T = TypeVar("T")
R = TypeVar("R")


def map_files(fn: Callable[[T], R], jobs: Sequence[T], workers: int = 0) -> list[R]:
    """``[fn(job) for job in jobs]`` with up to ``workers`` processes (0: one per core);
    in this process when there is one job or one worker. ``fn`` must be importable."""
    from wmrl.config import default_workers

    workers = min(len(jobs), workers or default_workers())
    if workers <= 1:
        return [fn(j) for j in jobs]
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as pool:
        return list(pool.map(fn, jobs))
