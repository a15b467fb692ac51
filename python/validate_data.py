"""Check trajectory files against the HDF5 schema; exit 1 on any problem.

    python python/validate_data.py runs/demos            # every .hdf5 in the folder
    python python/validate_data.py a.hdf5 b.hdf5 --json
"""

from __future__ import annotations

import argparse
import json

from wmrl import cli


def main(argv: list[str] | None = None) -> int:
    from wmrl.data.trajectory import find_trajectory_files
    from wmrl.data.validate import validate_file

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("inputs", nargs="+", help="trajectory files or folders")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    args = p.parse_args(argv)
    reports = [validate_file(f) for f in find_trajectory_files(args.inputs)]
    if args.json:
        print(json.dumps([r.as_dict() for r in reports], indent=2))
    else:
        for r in reports:
            status = "ok" if r.ok else f"{len(r.problems)} problem(s)"
            print(f"{r.path}: {status} - {r.episodes} episodes ({r.successes} successful), {r.frames} frames, {r.steps} steps")
            for prob in r.problems[:50]:
                print(f"  - {prob}")
    return 0 if all(r.ok for r in reports) else 1


if __name__ == "__main__":
    cli.run(main)
