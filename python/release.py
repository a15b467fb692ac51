"""Release a run as a bundle, and restore a bundle where it lies.

    python python/release.py make --run runs/a --out bundles/a [--no-data] [--profile default]
    python python/release.py restore bundles/a [--refresh-source]
    make release RUN=runs/a OUT=bundles/a [DATA=0]
    make restore BUNDLE=bundles/a [REFRESH_SOURCE=1]

A bundle mirrors the run's layout (weights/policy/global_step_N, the cycles' model pairs and
manifests, data, evidence, lineage, config, environment versions, the kit's source) with
MANIFEST.json: SHA-256 and size of every file. Restore verifies every file (rerun it after an
interruption: files verified and unchanged since are skipped), rewrites the run's absolute
paths in JSON files to the bundle's place (move the bundle and restore again), and unpacks the
source into BUNDLE/source without overwriting local edits unless asked. Then the bundle is a
run folder: make eval RUN=bundles/a CKPT=80.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from wmrl import cli  # noqa: E402
from wmrl.config import profile_names  # noqa: E402


def build(argv: list[str] | None = None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make", help="bundle a run")
    m.add_argument("--run", required=True)
    m.add_argument("--out", required=True)
    m.add_argument("--profile", default="default", choices=profile_names(), help="the profile the run used")
    m.add_argument("--no-data", action="store_true", help="leave the trajectories out (manifests stay)")
    m.add_argument("--overwrite", action="store_true")
    m.add_argument("--no-progress", action="store_true")
    r = sub.add_parser("restore", help="verify, relocate and unpack a bundle")
    r.add_argument("bundle")
    r.add_argument("--refresh-source", action="store_true", help="overwrite locally edited source files")
    r.add_argument("--no-progress", action="store_true")
    return p.parse_args(argv)


def main(args) -> int:
    from wmrl.release.bundle import make_bundle, restore

    if args.cmd == "make":
        out = make_bundle(args.run, args.out, profile=args.profile, data=not args.no_data, overwrite=args.overwrite,
                          progress=not args.no_progress)
        print(f"[release] {out} (MANIFEST.json: every file's SHA-256); restore it with make restore BUNDLE={out}")
    else:
        print(json.dumps(restore(args.bundle, refresh_source=args.refresh_source, progress=not args.no_progress)))
        print(f"[restore] {args.bundle} verified; it is a run folder now (make eval RUN={args.bundle} CKPT=N)")
    return 0


if __name__ == "__main__":
    cli.run(lambda: main(build()))
