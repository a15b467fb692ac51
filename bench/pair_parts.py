"""Carry a trained model pair between lent GPU machines in parts, instead of training it again.

A pair (two world models in float32, 150 MB, with its reward and start keyframes) is larger than
what one call brings back from the lent machine or carries to it (64 MiB, files of at most 16 MiB).
``split`` writes the pair folder(s) as one tar cut into parts, grouped into sets of one call each;
``join`` checks every part against the index and unpacks them (the pair's own SHA-256 checks then
run when it loads):

    # on the lent machine, once; then each call brings one set back ($OUT: at most 8 files)
    python3 bench/pair_parts.py split runs/h200/model_pair_students --out /root/parts
    cp /root/parts/set0/* $OUT/            # next call: set1, ...
    # here: each call's files into .offline/pair/setK/; in a later lease carry one set a call,
    # copy it into /root/parts/setK/, and once all are there:
    python3 bench/pair_parts.py join /root/parts --into runs/h200

Calibrate the pair's threshold closed loop (make wm-calibrate) before splitting: it needs the
held-out episodes, which stay behind; its closed_loop.json travels inside the pair folder.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

from wmrl.fileio import write_json  # noqa: E402

INDEX = "parts.json"
FORMAT = "wmrl-pair-parts/1"


def split(folders: list[Path], out: Path, part_mib: float = 13, per_set: int = 4) -> dict:
    """``folders`` (each kept under its own name) as one uncompressed tar in parts of ``part_mib``
    MiB, ``per_set`` parts to a folder ``out/setK`` (13 x 4 = 52 MiB: one call's carry beside the
    kit's tree); the index (every part's size and SHA-256, the whole tar's) goes into set0."""
    for f in folders:
        if not (f / "pair.json").is_file():
            raise SystemExit(f"error: {f} is not a model pair (no pair.json): give the folder make package-pair wrote")
    if (out / "set0" / INDEX).exists():
        raise SystemExit(f"error: {out} holds a split already: remove it first, or join it")
    size = int(part_mib * 2**20)
    parts, whole = [], hashlib.sha256()
    with tempfile.TemporaryFile() as tmp:  # the tar once, then cut: its size is known before any part is named
        with tarfile.open(fileobj=tmp, mode="w") as tar:
            for f in folders:  # the real-vs-imagined videos stay behind: GRPO never reads them (MBs each)
                tar.add(f, arcname=f.name, filter=lambda ti: None if ti.name.split("/")[1:2] == ["videos"] else ti)
        tmp.seek(0)
        while chunk := tmp.read(size):
            name = f"pair.{len(parts):03d}"
            target = out / f"set{len(parts) // per_set}" / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(chunk)
            whole.update(chunk)
            parts.append({"name": name, "set": len(parts) // per_set, "bytes": len(chunk),
                          "sha256": hashlib.sha256(chunk).hexdigest()})
    index = {"format": FORMAT, "folders": [f.name for f in folders], "parts": parts, "sha256": whole.hexdigest(),
             "sets": parts[-1]["set"] + 1}
    write_json(out / "set0" / INDEX, index)  # last, atomically: a split without it is unfinished (rerun it)
    return index


def join(roots: list[Path], into: Path) -> list[Path]:
    """The parts found under ``roots`` (any folder depth), checked against the index, unpacked
    into ``into``; a folder already there is left alone (refused), one unpacked half is never left."""
    found = {p.name: p for r in roots for p in sorted(r.rglob("pair.[0-9][0-9][0-9]"))}
    indexes = [p for r in roots for p in r.rglob(INDEX)]
    if not indexes:
        raise SystemExit(f"error: no {INDEX} under {', '.join(map(str, roots))}: it comes back with set0")
    index = json.loads(indexes[0].read_text())
    if index.get("format") != FORMAT:
        raise SystemExit(f"error: {indexes[0]} is not a {FORMAT} index")
    missing = sorted({p["set"] for p in index["parts"] if p["name"] not in found})
    if missing:
        raise SystemExit(f"error: the parts of set(s) {missing} are missing ({len(index['parts'])} parts in "
                         f"{index['sets']} sets): bring those sets back or carry them too")
    clash = [into / name for name in index["folders"] if (into / name).exists()]
    if clash:
        raise SystemExit(f"error: {clash[0]} exists: remove it first (a joined pair is never overwritten)")
    data, whole = io.BytesIO(), hashlib.sha256()
    for p in index["parts"]:
        chunk = found[p["name"]].read_bytes()
        if len(chunk) != p["bytes"] or hashlib.sha256(chunk).hexdigest() != p["sha256"]:
            raise SystemExit(f"error: {found[p['name']]} differs from the index (size or SHA-256): bring it again")
        data.write(chunk)
        whole.update(chunk)
    if whole.hexdigest() != index["sha256"]:
        raise SystemExit("error: the parts joined differ from the split tar (SHA-256): bring them again")
    into.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".pair_parts.", dir=into))
    try:
        data.seek(0)
        with tarfile.open(fileobj=data, mode="r") as tar:
            tar.extractall(staging, filter="data")
        for name in index["folders"]:
            (staging / name).rename(into / name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return [into / name for name in index["folders"]]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("split", help="pair folder(s) -> parts in sets of one call each")
    s.add_argument("folders", nargs="+", type=Path)
    s.add_argument("--out", type=Path, required=True)
    s.add_argument("--part-mib", type=float, default=13)
    s.add_argument("--per-set", type=int, default=4)
    j = sub.add_parser("join", help="parts (every set) -> the pair folder(s)")
    j.add_argument("roots", nargs="+", type=Path, help="folders holding the sets (searched at any depth)")
    j.add_argument("--into", type=Path, required=True, help="the run folder the pair folder(s) go into")
    args = p.parse_args(argv)
    if args.cmd == "split":
        index = split(args.folders, args.out, args.part_mib, args.per_set)
        print(f"[pair_parts] {len(index['parts'])} parts in {index['sets']} sets under {args.out} "
              f"({sum(x['bytes'] for x in index['parts']) / 2**20:.1f} MiB)")
    else:
        for f in join(args.roots, args.into):
            print(f"[pair_parts] {f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
