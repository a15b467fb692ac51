"""How much of the wrist view's change over a chunk does geometry alone draw? (``camera.wrist_warp``)

    .venv/wm/bin/python bench/wrist_warp.py --data runs/x/collect --strip bench/figures/wrist_warp.png
    .venv/wm/bin/python bench/wrist_warp.py --data runs/x/collect --data runs/y/collect --planes 0.88,0.9,0.92

The wrist camera rides the end effector, so from the proprio at two chunk boundaries its motion
is known. Recorded episodes (HDF5 files under each ``--data``): at every chunk boundary the frame
of the boundary before is compared with the real frame, once as it is ("held": a world model that
misses the motion) and once warped by the camera's motion onto the table plane ("warp": what
``WorldModelConfig.wrist_warp`` hands the wrist model as input). PSNR over the whole frame and
over the rows above the gripper; the strip shows the chunks with the most motion. What each costs
the policy is ``bench/view_sensitivity.py --corruptions late:1,warp:1``. CPU, a few seconds.
"""

from __future__ import annotations

import argparse
import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

from wmrl.config import ConfigError  # noqa: E402


def chunk_pairs(episodes: list, horizon: int):
    """Every (boundary before, boundary) of the episodes: wrist frames (N, 3, H, W) in [-1, 1]
    and raw proprio (N, P) at both ends."""
    import torch

    from wmrl.worldmodel.fidelity import real_frames

    steps = min(horizon, max(len(ep.actions) for ep in episodes))
    real, proprio = real_frames(episodes, steps)
    idx = [(e, t) for e, ep in enumerate(episodes) for t in range(1, min(steps, len(ep.actions)) + 1)]
    pick = lambda x, dt: torch.stack([x[e, t + dt] for e, t in idx])  # noqa: E731
    return pick(real["wrist"], -1).float(), pick(real["wrist"], 0).float(), pick(proprio, -1), pick(proprio, 0)


def psnr_db(a, b, rows: int | None = None) -> float:
    """Mean PSNR (dB) of (N, 3, H, W) frames in [-1, 1] over their first ``rows`` rows (``fidelity.psnr``)."""
    from wmrl.worldmodel.fidelity import psnr

    return float(psnr(a[..., :rows, :], b[..., :rows, :]).mean())


def strip(start, warped, end, path: Path, rows: int = 4) -> None:
    """The ``rows`` chunks with the most change: start | start warped | real end, one row each."""
    import imageio.v3 as iio
    import torch

    from wmrl.worldmodel.model import unit_to_images

    change = ((end - start) ** 2).mean(dim=(1, 2, 3))
    top = change.argsort(descending=True)[:rows]
    grid = torch.cat([torch.cat([start[i], warped[i], end[i]], dim=-1) for i in top], dim=-2)
    image = unit_to_images(grid).numpy().repeat(2, 0).repeat(2, 1)  # twice the size, pixels kept sharp
    path.parent.mkdir(parents=True, exist_ok=True)
    iio.imwrite(path, image)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, action="append", required=True,
                   help="a folder of recorded episodes (make collect's RUN/collect); several: one row each")
    p.add_argument("--episodes", type=int, default=20, help="per folder")
    p.add_argument("--horizon", type=int, default=20, help="chunk boundaries read per episode")
    p.add_argument("--planes", default="0.9", help="comma-separated table heights (world z, m) to warp onto")
    p.add_argument("--strip", type=Path, help="a PNG of the first folder's chunks with the most change")
    p.add_argument("--json", type=Path)
    a = p.parse_args(argv)
    try:
        planes = [float(x) for x in a.planes.split(",")]
    except ValueError:
        raise ConfigError(f"--planes {a.planes!r}: heights in metres, e.g. 0.9 or 0.88,0.9,0.92") from None
    if a.episodes < 1 or a.horizon < 1:
        raise ConfigError("--episodes and --horizon: 1 or more")

    import torch

    from wmrl.config import CHUNK_SIZE
    from wmrl.worldmodel.camera import WRIST_GRIPPER_ROWS, wrist_warp
    from wmrl.worldmodel.data import episodes_under

    rows = []
    for i, data in enumerate(a.data):
        episodes = episodes_under(data, CHUNK_SIZE, a.episodes)
        start, end, p_start, p_end = chunk_pairs(episodes, a.horizon)
        above = end.shape[-2] - round(WRIST_GRIPPER_ROWS * end.shape[-2])  # the rows above the gripper
        row = {"data": str(data), "episodes": len(episodes), "chunks": len(start),
               "eef_motion_mm": round(1000 * float((p_end[:, :3] - p_start[:, :3]).norm(dim=-1).mean()), 1),
               "held_db": round(psnr_db(start, end), 2), "held_above_gripper_db": round(psnr_db(start, end, above), 2)}
        for plane in planes:
            warped = wrist_warp(start, p_start, p_end, plane)
            row[f"warp_{plane}_db"] = round(psnr_db(warped, end), 2)
            row[f"warp_{plane}_above_gripper_db"] = round(psnr_db(warped, end, above), 2)
            if i == 0 and a.strip and plane == planes[0]:
                strip(start, warped, end, a.strip)
        rows.append(row)
        print(f"[wrist_warp] {data}: " + ", ".join(f"{k} {v}" for k, v in row.items() if k != "data"), flush=True)
    result = {"rows": rows, "planes": planes,
              "machine": {"host": platform.node(), "torch": torch.__version__}}
    if a.json:  # atomically: a killed run leaves the previous file whole
        from wmrl.fileio import write_json

        write_json(a.json, result)
    return result


if __name__ == "__main__":
    from wmrl.cli import run

    run(lambda: main() and 0)  # the kit's one-line errors (exit 2); main returns its figures, the exit code 0
