"""Build RUN/manifest.json: new trajectories + replay sources, split by episode, hashed.

    python python/make_manifest.py --run runs/c1 --new runs/c1/collect --replay runs/default/demos
    make manifest RUN=runs/c1 DATA=runs/c1/collect REPLAY=runs/default/demos

The seed's defaults: validation ratio 0.2 (by episode), sampling ratio of new data 0.5.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from wmrl import cli
from wmrl.layout import RunLayout


def build(argv: list[str] | None = None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", default="runs/default", help="run folder (the manifest goes to RUN/manifest.json)")
    p.add_argument("--out", help="manifest path (default RUN/manifest.json)")
    p.add_argument("--new", nargs="*", default=[], help="this cycle's trajectory files or folders")
    p.add_argument("--replay", nargs="*", default=[], help="replay sources: demonstrations, earlier cycles")
    p.add_argument("--val-ratio", type=float, default=0.2)
    p.add_argument("--new-ratio", type=float, default=0.5, help="probability that a training sample is new data")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--overwrite", action="store_true")
    p.add_argument("--dry-run", action="store_true")
    return p.parse_args(argv)


def main(args) -> int:
    from wmrl.data.manifest import build_manifest
    from wmrl.data.trajectory import find_trajectory_files

    out = Path(args.out or RunLayout(args.run).manifest)
    files = {"new": [str(f) for f in find_trajectory_files(args.new)] if args.new else [],
             "replay": [str(f) for f in find_trajectory_files(args.replay)] if args.replay else []}
    if args.dry_run:
        cli.print_plan("manifest", {"out": out, **files, "val_ratio": args.val_ratio, "new_ratio": args.new_ratio})
        return 0
    if out.exists() and not args.overwrite:
        raise FileExistsError(f"{out} exists; pass --overwrite (OVERWRITE=1) to build it again")
    m = build_manifest(out, args.new, args.replay, val_ratio=args.val_ratio, new_ratio=args.new_ratio, seed=args.seed)
    summary = {s: {"files": sum(f["source"] == s for f in m["files"]),
                   "episodes": sum(f["episodes"] for f in m["files"] if f["source"] == s),
                   "val_episodes": sum(len(f["val_episodes"]) for f in m["files"] if f["source"] == s)}
               for s in ("new", "replay")}
    print(json.dumps({"manifest": str(out), **summary}, indent=2))
    return 0


if __name__ == "__main__":
    cli.run(lambda: main(build()))
