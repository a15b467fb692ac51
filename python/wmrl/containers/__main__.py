"""python -m wmrl.containers {wheelhouse,build,run,status} (see the package docstring).

    python -m wmrl.containers wheelhouse train wm            # make wheelhouse
    python -m wmrl.containers build train wm                 # make build
    python -m wmrl.containers run --image wm -- python/check.py --env wm
    python -m wmrl.containers run --image train --exec -- bash -lc 'nvidia-smi'
    python -m wmrl.containers shell --image train            # interactive bash in the train image
    python -m wmrl.containers status
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from wmrl.containers.errors import ContainerError
from wmrl.containers.images import IMAGE_NAMES, LABEL_LOCK_SHA, LABEL_REVISION, image_spec


def _specs(args) -> list:
    names = args.images or list(IMAGE_NAMES)
    if (args.lock or args.tag) and len(names) != 1:
        raise ContainerError("--lock/--tag name one image variant: give exactly one image (train or wm)")
    return [image_spec(n, args.lock, args.tag) for n in names]


def _variant(p: argparse.ArgumentParser) -> None:
    p.add_argument("--lock", help="lock file of a variant (default docker/<image>.lock)")
    p.add_argument("--tag", help="image tag (default wmrl-<image>:latest, or $WMRL_IMAGE_<IMAGE>)")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m wmrl.containers", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)

    w = sub.add_parser("wheelhouse", help="download every locked file (hash-checked) into wheelhouse/")
    w.add_argument("images", nargs="*", metavar="IMAGE", help="train and/or wm (default both)")
    _variant(w)
    w.add_argument("--find-links", action="append", default=[], help="local folder searched first (by hash)")

    b = sub.add_parser("build", help="build images from the wheelhouse")
    b.add_argument("images", nargs="*", metavar="IMAGE", help="train and/or wm (default both)")
    _variant(b)
    b.add_argument("--base-image", help="replace the pinned CUDA base (e.g. a local test base)")
    b.add_argument("--network", help="build network (e.g. host, when apt must reach a mirror)")
    b.add_argument("--no-cache", action="store_true")
    b.add_argument("--quiet", action="store_true", help="step lines only")
    b.add_argument("--json", help="write the build results here")

    r = sub.add_parser("run", help="run `python ARGS` (or a command, --exec) in an image")
    r.add_argument("--image", required=True, choices=IMAGE_NAMES)
    _variant(r)
    r.add_argument("--exec", action="store_true", help="ARGS is a command, not python's arguments")
    r.add_argument("--gpus", help="all | none | 0,1 (default: $GPUS, $CUDA_VISIBLE_DEVICES, else all if the host has NVIDIA GPUs)")
    r.add_argument("--shm-size", default="16g", help="size of /dev/shm (default 16g)")
    r.add_argument("--ipc", choices=["host", "private", "shareable"], help="IPC namespace instead of --shm-size")
    r.add_argument("--network", default="host", help="container network (default host)")
    r.add_argument("--mount", action="append", default=[], help="extra /host[:/container][:ro] (also $WMRL_DOCKER_MOUNTS)")
    r.add_argument("--quiet", action="store_true", help="no [docker] line before the stage's output")
    r.add_argument("args", nargs=argparse.REMAINDER, help="after --: the stage's arguments")

    sh = sub.add_parser("shell", help="an interactive shell in an image (the docker CLI, same settings as run)")
    sh.add_argument("--image", required=True, choices=IMAGE_NAMES)
    _variant(sh)
    sh.add_argument("--gpus", help="as for run")
    sh.add_argument("--print", action="store_true", help="print the docker run command instead of running it")
    sh.add_argument("args", nargs=argparse.REMAINDER, help="after --: a command (default bash)")

    s = sub.add_parser("status", help="images present and whether they match the checkout's lock files")
    s.add_argument("--json", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.cmd == "wheelhouse":
        from wmrl.containers import wheelhouse

        for bad in [n for n in args.images if n not in IMAGE_NAMES]:
            raise ContainerError(f"unknown image {bad!r}: choose train and/or wm")
        for spec in _specs(args):
            print(wheelhouse.fill(spec, [Path(f) for f in args.find_links]).line(), flush=True)
        return 0
    if args.cmd == "build":
        from wmrl.containers.build import BuildConfig, build

        results = [build(BuildConfig(spec, args.base_image, args.network, args.no_cache, quiet=args.quiet))
                   for spec in _specs(args)]
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
        return 0
    if args.cmd == "run":
        from wmrl.containers.run import RunConfig, run

        rest = args.args[1:] if args.args[:1] == ["--"] else args.args
        if not rest:
            raise ContainerError("nothing to run: give the stage after --, e.g. run --image train -- python/check.py")
        cfg = RunConfig(image_spec(args.image, args.lock, args.tag), tuple(rest), python=not args.exec, gpus=args.gpus,
                        shm_size=args.shm_size, ipc=args.ipc, network=args.network, mounts=tuple(args.mount),
                        verbose=not args.quiet)
        return run(cfg)
    if args.cmd == "shell":
        from wmrl.containers.run import RunConfig, shell

        rest = (args.args[1:] if args.args[:1] == ["--"] else args.args) or ["bash"]
        return shell(RunConfig(image_spec(args.image, args.lock, args.tag), tuple(rest), python=False, gpus=args.gpus,
                               verbose=False), print_only=args.print)
    if args.cmd == "status":
        return status(args.json)
    return 2


def status(as_json: bool) -> int:
    import docker

    from wmrl.containers.engine import connect, daemon_address

    client = connect(timeout=30)
    rows = []
    for name in IMAGE_NAMES:
        spec = image_spec(name)
        row = {"image": name, "tag": spec.tag, "lock": spec.lock, "present": False}
        try:
            img = client.images.get(spec.tag)
            labels = img.labels or {}
            row.update(present=True, id=img.short_id, size_gib=round((img.attrs.get("Size") or 0) / 2**30, 2),
                       lock_matches=labels.get(LABEL_LOCK_SHA) == spec.lock_sha256(), commit=labels.get(LABEL_REVISION))
        except docker.errors.ImageNotFound:
            pass
        rows.append(row)
    if as_json:
        print(json.dumps({"daemon": daemon_address(), "images": rows}, indent=2))
    else:
        for r in rows:
            state = ("up to date" if r["lock_matches"] else "built from other lock files: run `make build`") if r["present"] \
                else "missing: run `make build`"
            print(f"{r['tag']:24s} {state}" + (f" ({r['id']}, {r['size_gib']} GiB, commit {str(r['commit'])[:12]})" if r["present"] else ""))
    return 0 if all(r["present"] and r["lock_matches"] for r in rows) else 1


def cli() -> None:
    try:
        code = main()
    except ContainerError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    sys.exit(code)


if __name__ == "__main__":
    cli()
