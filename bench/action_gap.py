"""Does the policy act on the pair's imagined frames as on the real ones? (``wmrl.evaluation.action_gap``)

    .venv/train/bin/python bench/action_gap.py --run runs/h200 --policy sft/4000@ode
    .venv/train/bin/python bench/action_gap.py --run runs/h200 --policy sft/4000@ode --episodes 40 --json gap.json

Held-out episodes of RUN's manifest (the half ``make wm-eval`` reads) are imagined in the pair
(RUN/model_pair) with their recorded actions; at 1, 5, 10 and 20 chunks the policy's action chunk
on the imagined frames and on the held start is compared with its action on the real frames
(same sampler noise). Prints a table and the JSON; runs in the policy's environment (.venv/train).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

from wmrl.cli import parse_guidance  # noqa: E402
from wmrl.config import ConfigError  # noqa: E402
from wmrl.layout import RunLayout  # noqa: E402


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", default="runs/default")
    p.add_argument("--policy", required=True, help="a checkpoint (sft/N, a GRPO step N or a folder), optionally @ode "
                                                   "or @T=<temperature> (@ode: the same action for the same input)")
    p.add_argument("--pair", help="model pair folder (default RUN/model_pair)")
    p.add_argument("--manifest", help="held-out episodes from this manifest's validation split (default RUN/manifest.json)")
    p.add_argument("--episodes", type=int, default=20)
    p.add_argument("--horizon", type=int, default=20, help="chunks to imagine (the horizons 1, 5, 10, 20 within it)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--guidance", default="", help="imagine at each of these action-guidance scales, e.g. 1,2 (a pair "
                                                  "trained with --action-dropout; default: the pair's own)")
    p.add_argument("--json", type=Path)
    a = p.parse_args(argv)
    pair_dir = Path(a.pair or RunLayout(a.run).model_pair)
    manifest = Path(a.manifest or RunLayout(a.run).manifest)
    for path, how in ((pair_dir / "pair.json", "make package"), (manifest, "make manifest")):
        if not path.is_file():
            raise ConfigError(f"{path} not found: make it first ({how} RUN={a.run})")
    if a.episodes < 1 or a.horizon < 1:
        raise ConfigError("--episodes and --horizon: 1 or more")
    guidance = parse_guidance(a.guidance)

    from wmrl.device import pick_device
    from wmrl.evaluation.action_gap import action_gap, table
    from wmrl.evaluation.ranking import guidance_scales, parse_policy
    from wmrl.policy.runner import PolicyRunner
    from wmrl.release.pair import load_pair
    from wmrl.worldmodel.data import held_out_halves, load_split
    from wmrl.worldmodel.fidelity import open_loop
    from wmrl.worldmodel.model import FrameWorldModel

    spec = parse_policy(a.policy, a.run)
    if spec.checkpoint is None:
        raise ConfigError(f"--policy {a.policy}: a control reads no frames; give a checkpoint (e.g. sft/4000@ode)")
    pair = load_pair(pair_dir)  # every file's hash before any weight loads
    contract = pair.meta["contract"]
    device = pick_device(a.device)
    runner = PolicyRunner(spec.checkpoint, device=str(device), sampler=spec.sampler, temperature=spec.temperature,
                          seed=a.seed)
    if runner.image_size != contract["image_size"]:
        raise ConfigError(f"the policy reads {runner.image_size} px images, the pair {pair_dir} imagines "
                          f"{contract['image_size']} px: use a pair of the policy's profile")
    main_m = FrameWorldModel.from_pretrained(pair.part("main"), device)
    wrist_m = FrameWorldModel.from_pretrained(pair.part("wrist"), device)
    scales = guidance_scales({"main": main_m, "wrist": wrist_m}, guidance)
    _, _, val = load_split(manifest, main_m.cfg.chunk_size)
    if not val:
        raise ConfigError(f"{manifest} has no validation episodes; build it with --val-ratio > 0")
    episodes = held_out_halves(val)[1][: a.episodes]  # the half wm-eval reads
    t0 = time.perf_counter()
    by_scale = {}
    for w in scales:  # the same episodes, seed and policy noise at each scale: only the guidance differs
        main_m.guidance = wrist_m.guidance = w
        roll = open_loop(main_m, wrist_m, episodes, a.horizon, seed=a.seed, device=device)
        by_scale[w] = action_gap(roll, episodes, runner, main_m.cfg.chunk_size)
        if len(scales) > 1:
            print(f"[action-gap] action guidance {w:g}:\n{table(by_scale[w])}")
    result = {**by_scale[scales[0]], "pair": str(pair.root), "policy": a.policy, "guidance": scales[0],
              **({"by_guidance": {str(w): r for w, r in by_scale.items()}} if len(scales) > 1 else {}),
              "seconds": round(time.perf_counter() - t0, 1), "machine": {"host": platform.node(), "device": str(device)}}
    print(table(result))
    print(json.dumps(result, indent=1))
    if a.json:  # atomically: a killed run leaves the previous file whole
        from wmrl.fileio import write_json

        write_json(a.json, result)
    return result


if __name__ == "__main__":
    from wmrl.cli import run

    run(lambda: main() and 0)  # the kit's one-line errors (exit 2); main returns its figures, the exit code 0
