"""How much of a chunk's end-effector motion do its own actions explain? Least squares on
recorded trajectories: the end effector's displacement over chunk k (proprio at boundary k+1
minus boundary k, metres) against the arm actions (x, y, z) of chunk k, of chunk k-1, and of
both, per step. A world model sees only chunk k's actions; what chunk k-1's add is what it
cannot know from them.

    python bench/action_lag.py runs/x/demos/*.hdf5 [--chunk 8] [--json out.json]

Prints R^2 per axis for each set of inputs, and the per-step weights (mm per action unit) of
the joint fit: where in the 16 steps the motion of chunk k comes from.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import h5py
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

from wmrl.worldmodel.data import boundary_frames  # noqa: E402


def chunk_pairs(paths: list[str], chunk: int) -> tuple[np.ndarray, np.ndarray]:
    """(N, 2 * chunk * 3) arm actions of chunks k-1 and k, (N, 3) displacement over chunk k,
    for every k >= 1 of every episode."""
    inputs, moves = [], []
    for path in paths:
        with h5py.File(path, "r") as h:
            for i in range(int(h["data"].attrs["num_episodes"])):
                g = h["data"][f"demo_{i}"]
                idx = boundary_frames(g["frame_step"][()].astype(np.int64), chunk)
                actions = g["actions"][()][:, :3]
                n = min(len(idx) - 1, len(actions) // chunk)
                pos = g["obs/proprio"][()][idx[: n + 1], :3]
                per_chunk = actions[: n * chunk].reshape(n, chunk * 3)
                for k in range(1, n):
                    inputs.append(np.concatenate([per_chunk[k - 1], per_chunk[k]]))
                    moves.append(pos[k + 1] - pos[k])
    if not inputs:
        sys.exit("no episode with two full chunks in the given files")
    return np.array(inputs), np.array(moves)


def fit(x: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
    """R^2 of the least-squares fit y ~ x + bias, and its weights (bias last)."""
    x = np.concatenate([x, np.ones((len(x), 1))], axis=1)
    w, *_ = np.linalg.lstsq(x, y, rcond=None)
    return float(1 - ((y - x @ w) ** 2).mean() / y.var()), w


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="+", help="trajectory HDF5 files (the kit's schema)")
    p.add_argument("--chunk", type=int, default=8)
    p.add_argument("--json", help="also write the figures here")
    a = p.parse_args()
    x, y = chunk_pairs(a.files, a.chunk)
    half = a.chunk * 3
    std = [round(float(s), 4) for s in y.std(0)]
    out = {"transitions": len(x), "displacement_std_m": std, "r2": {}, "weights_mm": {}}
    print(f"{len(x)} chunk transitions; displacement std per axis {std} m")
    for name, cols in (("chunk k", slice(half, None)), ("chunk k-1", slice(0, half)), ("chunks k-1 and k", slice(None))):
        r2 = [round(fit(x[:, cols], y[:, i])[0], 3) for i in range(3)]
        out["r2"][name] = r2
        print(f"R^2 of the displacement over chunk k from the actions of {name:<16} x {r2[0]:.3f}  y {r2[1]:.3f}  z {r2[2]:.3f}")
    for i, axis in enumerate("xyz"):
        w = fit(x, y[:, i])[1][:-1].reshape(2 * a.chunk, 3)[:, i] * 1000
        out["weights_mm"][axis] = w.round(2).tolist()
        print(f"{axis}: mm per unit of the {axis} action at steps 1..{a.chunk} of chunk k-1 | of chunk k: "
              f"{' '.join(f'{v:.1f}' for v in w[:a.chunk])} | {' '.join(f'{v:.1f}' for v in w[a.chunk:])}")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
