"""A world-model toy whose answer is known, for distillation checks on a CPU (bench/RESULTS.md,
"Stage 3 (self-forcing DMD) for the LIBERO students on a CPU toy").

    python bench/sf_toy_data.py R [--episodes 200]     # then: python python/wm_update.py --profile tiny --run R

Writes R/data/{new,replay}/*.hdf5 (a square that moves by the chunk's summed actions, both
views; ``wmrl.data.synthetic.moving_square_episode``, through the kit's real HDF5 writer) and
R/manifest.json (10% of the episodes held out).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "python")]

from wmrl.data.manifest import build_manifest  # noqa: E402
from wmrl.data.synthetic import moving_square_episode, write_file  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", type=Path, help="run folder to write (data and manifest)")
    p.add_argument("--episodes", type=int, default=200, help="episodes of 8 chunks; 4 in 5 as new data, the rest replay")
    a = p.parse_args()
    rng = np.random.default_rng(0)
    n_new = a.episodes * 4 // 5
    new = write_file(a.run / "data/new/rollouts.hdf5", [moving_square_episode(rng, 8) for _ in range(n_new)])
    replay = write_file(a.run / "data/replay/demos.hdf5",
                        [moving_square_episode(rng, 8) for _ in range(a.episodes - n_new)])
    build_manifest(a.run / "manifest.json", [str(new)], [str(replay)], val_ratio=0.1, seed=0)
    print(f"[toy] {a.episodes} episodes and {a.run / 'manifest.json'}")


if __name__ == "__main__":
    main()
