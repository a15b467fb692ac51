"""Train the frozen reward model (success classifier on main-view frames) from the manifest.

    python python/wm_reward.py --run runs/c1                  # RUN/manifest.json -> RUN/worldmodels/reward/
    python python/wm_reward.py --profile tiny --run runs/t

Labels are the simulator's per-frame success in the trajectory files; the threshold is
calibrated on the manifest's validation episodes and stored with the weights. A finished
reward model is left alone (pass --overwrite to train it again).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from wmrl import cli
from wmrl.config import ConfigError, get_profile, override, profile_names
from wmrl.layout import RunLayout


def build(argv: list[str] | None = None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--profile", default="default", choices=profile_names())
    p.add_argument("--run", default="runs/default")
    p.add_argument("--manifest", help="default: RUN/manifest.json")
    p.add_argument("--steps", type=int)
    p.add_argument("--overwrite", action="store_true")
    p.add_argument("--dry-run", action="store_true")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    manifest = Path(args.manifest or RunLayout(args.run).manifest)
    if not manifest.is_file():
        raise ConfigError(f"{manifest} not found: make it first with `make manifest RUN={args.run}`")
    return args, manifest


def main(args, manifest: Path) -> int:
    cfg = override(get_profile(args.profile).reward, steps=args.steps)
    out = RunLayout(args.run).reward
    if args.dry_run:
        cli.print_plan("reward model", {"manifest": manifest, "config": cfg, "out": out})
        return 0
    if (out / "config.json").exists() and not args.overwrite:
        print(f"[reward] {out} exists (pass --overwrite to train again)")
        return 0
    import numpy as np
    import torch
    from wmrl.fileio import sha256_file
    from wmrl.lineage import git_commit
    from wmrl.worldmodel.data import load_split
    from wmrl.worldmodel.reward import train_reward

    _, train, val = load_split(manifest, chunk=8)
    def cat(eps, key):
        return torch.from_numpy(np.concatenate([getattr(e, key) for e in eps]))

    meta = train_reward(cat(train, "main"), cat(train, "success"), cat(val, "main") if val else torch.zeros(0),
                        cat(val, "success") if val else torch.zeros(0, dtype=torch.bool), cfg, out,
                        {"manifest": str(manifest), "manifest_sha256": sha256_file(manifest), "git_commit": git_commit()},
                        progress=not args.no_progress)
    print(json.dumps({k: meta[k] for k in ("threshold", "val_balanced_accuracy", "train_frames", "train_success_frames")}))
    return 0


if __name__ == "__main__":
    cli.run(lambda: main(*build()))
