"""Carry a trained policy to the lent GPU machine instead of training it again there.

    python3 bench/policy_pack.py pack runs/h200/weights/sft/global_step_4000 .offline/policy/sft4000.tar.xz
    python3 bench/policy_pack.py unpack .offline/policy/sft4000.tar.xz runs/h200      # -> weights/sft/global_step_4000

The pack is the checkpoint's weights in float16 (or --dtype bfloat16), norm statistics and
language cache, xz-compressed: 19 MiB for the default policy, which fits beside the offline
bundle in one call's 64 MiB (wmrl.policy.pack says why float16). ``bench/gpu.py`` unpacks one
given as POLICY_PACK=... before its phases (``unpack+grpo``).

A policy trained on from an unpacked pack (GRPO) packs as a delta against that pack (only the
changed tensors, ~13 MiB: it comes back from a GPU call) and unpacks with the same base:

    python3 bench/policy_pack.py pack runs/h200/grpo/seed0/weights/policy/global_step_6 grpo6.tar.xz \
        --base .offline/policy/sft4000.tar.xz
    python3 bench/policy_pack.py unpack grpo6.tar.xz runs/h200b --base .offline/policy/sft4000.tar.xz

A GRPO full state packs with --state as a portable state (weights, step, RNG, lr; not Adam's
moments, unless --moments: in bfloat16) and unpacks with --kind policy into a GRPO run that
resumes it on another machine:

    python3 bench/policy_pack.py pack runs/h200/grpo/seed0/weights/policy/global_step_4 grpo4.tar.xz --state [--moments]
    python3 bench/policy_pack.py unpack grpo4.tar.xz runs/h200/grpo/seed0 --kind policy
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

from wmrl.policy.checkpoint import CheckpointError  # noqa: E402
from wmrl.policy.pack import DTYPES, pack_checkpoint, unpack_checkpoint  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("pack", help="a checkpoint folder -> one .tar.xz")
    a.add_argument("checkpoint")
    a.add_argument("out")
    a.add_argument("--dtype", default="float16", choices=DTYPES)
    a.add_argument("--base", help="a full pack this checkpoint was trained from: keep only the tensors that differ")
    a.add_argument("--state", action="store_true", help="a GRPO full state: its step, RNG and lr go along "
                                                        "(not Adam's moments), so GRPO resumes it elsewhere")
    a.add_argument("--moments", action="store_true", help="with --state: Adam's moments too, in bfloat16 (~20 MB "
                                                          "more): the resumed run goes on as if it had not stopped")
    b = sub.add_parser("unpack", help="a .tar.xz -> RUN/weights/<kind>/global_step_<step>")
    b.add_argument("pack")
    b.add_argument("run")
    b.add_argument("--kind", default="sft", choices=("sft", "policy"))
    b.add_argument("--step", type=int, default=None, help="default: the packed checkpoint's step")
    b.add_argument("--base", help="for a delta pack: the full pack it was made against")
    args = p.parse_args(argv)
    try:
        if args.cmd == "pack":
            meta = pack_checkpoint(args.checkpoint, args.out, dtype=args.dtype, base=args.base, state=args.state,
                                   moments=args.moments)
            delta = f", {meta['tensors']} tensors that differ from {args.base}" if args.base else ""
            if args.state:
                delta += f", with its GRPO state ({'Adam moments in bfloat16' if args.moments else 'no Adam moments'})"
            print(f"[pack] {args.out}: {Path(args.out).stat().st_size / 2**20:.1f} MiB, {meta['dtype']}, "
                  f"step {meta['config'].get('step')}{delta}")
        else:
            print(f"[pack] {unpack_checkpoint(args.pack, args.run, kind=args.kind, step=args.step, base=args.base)}")
    except CheckpointError as e:
        sys.exit(f"error: {e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
