"""Package RUN/model_pair: both world models (from the update's selection), the reward model
and real initial observations, with SHA-256 and lineage in pair.json.

    python python/package_pair.py --run runs/c1          # -> runs/c1/model_pair/pair.json
    python python/package_pair.py --verify runs/c1/model_pair
"""

from __future__ import annotations

import argparse
import json

from wmrl import cli


def build(argv: list[str] | None = None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", default="runs/default")
    p.add_argument("--out", help="pair folder (default RUN/model_pair)")
    p.add_argument("--verify", metavar="PAIR", help="only verify an existing pair's hashes")
    p.add_argument("--overwrite", action="store_true")
    p.add_argument("--dry-run", action="store_true")
    return p.parse_args(argv)


def main(args) -> int:
    from wmrl.release.pair import load_pair, package_pair

    if args.verify:
        pair = load_pair(args.verify)
        n = sum(len(v) for v in pair.meta["files"].values())
        print(f"[pair] {pair.root}: {n} files match pair.json")
        return 0
    if args.dry_run:
        cli.print_plan("package model pair", {"run": args.run, "out": args.out or f"{args.run}/model_pair",
                                              "from": f"{args.run}/train/selected_world_models.json"})
        return 0
    path = package_pair(args.run, args.out, overwrite=args.overwrite)
    meta = json.loads(path.read_text())
    print(f"[pair] {path}: main step {meta['models']['main']['step']}, wrist step {meta['models']['wrist']['step']}, "
          f"{meta['init_observations']['episodes']} initial observations")
    return 0


if __name__ == "__main__":
    cli.run(lambda: main(build()))
