"""What kind of error in one camera view moves the policy? (``wmrl.evaluation.action_gap``)

    .venv/train/bin/python bench/view_sensitivity.py --run runs/x --policy sft/4000@ode --data runs/x/collect
    .venv/train/bin/python bench/view_sensitivity.py --run runs/x --policy sft/4000@ode --data D --view wrist \\
        --corruptions none,blur:1,blur:2,noise:0.1,shift:4,late:1 --episodes 16 --json out.json

``bench/action_gap.py`` found that the imagined wrist view alone makes the whole gap between the
policy's actions in the pair and in the simulator. This says which *kind* of wrist error does:
real recorded episodes (HDF5 files under ``--data``), their real frames with one view corrupted
in a known way (a blur, as a few-step sampler's soft frames; pixel noise; a shift, the camera a
little off where the arm is; the frame one chunk late, the arm's motion missed), the policy's
action chunk on them against its chunk on the real inputs (same sampler noise), at the same
horizons as the action gap. Each corruption is placed by its PSNR against the real frame, so a
world model's frames (their PSNR in ``fidelity.json``) can be set beside the corruption that costs
the same; ``warp:K``: the late frame warped by the camera's motion since (what geometry alone
recovers). ``--view proprio``: the proprio instead (noise in each dimension's spread over the
episodes, late, ghost, ``turn:DEG``: the orientation turned), each placed by its end-effector
position error in mm. Runs in the policy's
environment (.venv/train); no world model, no GPU needed.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

from wmrl.config import ConfigError  # noqa: E402

DEFAULT = ("none,blur:1,blur:2,blur:3,noise:0.05,noise:0.1,shift:2,shift:4,shift:8,blend:0.25,blend:0.5,late:1,"
           "late:1+blur:2,late:2")
DEFAULT_PROPRIO = "none,noise:0.05,noise:0.1,noise:0.25,noise:0.5,blend:0.25,blend:0.5,late:1,late:2"


def parse_mark(text: str, key: str) -> dict:
    """``--mark 'LABEL=X,GAP'``: an extra point on the plot, at X (``key``: dB or mm) and GAP."""
    label, _, numbers = text.rpartition("=")
    try:
        x, gap = (float(v) for v in numbers.split(","))
    except ValueError:
        raise ConfigError(f"--mark {text!r}: LABEL=PSNR,GAP, e.g. 'H200 pair=15.7,0.34'") from None
    return {"label": label, key: x, "action_gap": gap}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", default="runs/default", help="where --policy's checkpoint is found")
    p.add_argument("--policy", required=True, help="a checkpoint (sft/N, a GRPO step N or a folder), optionally @ode "
                                                   "(the same action for the same input) or @T=<temperature>")
    p.add_argument("--data", type=Path, required=True, help="a folder of recorded episodes (make collect's RUN/collect)")
    p.add_argument("--view", default="wrist", choices=["main", "wrist", "proprio"],
                   help="the input to corrupt (proprio: noise:S in each dimension's std, late:K, blend:W, turn:DEG: "
                        "the orientation turned about a random axis)")
    p.add_argument("--corruptions", help="comma-separated: blur:S, noise:S, shift:P, late:K, blend:W, warp:K (wrist: "
                                         "the late frame warped by the camera's motion), none; several "
                                         f"joined by + (late:1+blur:2); default {DEFAULT} ({DEFAULT_PROPRIO} for the proprio)")
    p.add_argument("--episodes", type=int, default=16)
    p.add_argument("--horizon", type=int, default=20, help="chunks read (the horizons 1, 5, 10, 20 within it)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--json", type=Path)
    p.add_argument("--plot", type=Path, help="a PNG: the action gap one chunk ahead against each corruption's PSNR")
    p.add_argument("--mark", action="append", default=[], metavar="LABEL=PSNR,GAP",
                   help="an extra point on the plot, e.g. a pair's imagined wrist view: 'H200 pair=15.7,0.34' "
                        "(--view proprio: LABEL=MM,GAP)")
    a = p.parse_args(argv)
    if a.episodes < 1 or a.horizon < 1:
        raise ConfigError("--episodes and --horizon: 1 or more")
    corruptions = (a.corruptions or (DEFAULT if a.view != "proprio" else DEFAULT_PROPRIO)).split(",")
    marks = [parse_mark(m, "psnr_db" if a.view != "proprio" else "eef_error_mm") for m in a.mark]

    import torch

    from wmrl.config import CHUNK_SIZE
    from wmrl.device import pick_device
    from wmrl.evaluation.action_gap import action_gap, eef_error_mm, perturb, perturbed, psnr, real_roll
    from wmrl.evaluation.ranking import parse_policy
    from wmrl.policy.runner import PolicyRunner
    from wmrl.worldmodel.data import episodes_under

    images = a.view != "proprio"
    for how in corruptions:  # a typo fails here, before the policy loads
        try:
            if images:
                perturb(torch.zeros(1, 2, 3, 8, 8), how, proprio=torch.zeros(1, 2, 8) if a.view == "wrist" else None)
            else:  # on a still proprio of one episode: turns, and the rest in spread units
                perturbed({"real": {}, "valid": torch.ones(1, 2, dtype=torch.bool),
                           "proprio": {"real": torch.zeros(1, 2, 8)}}, "proprio", how)
        except ValueError as e:
            raise ConfigError(f"--corruptions: {e}") from None
    spec = parse_policy(a.policy, a.run)
    if spec.checkpoint is None:
        raise ConfigError(f"--policy {a.policy}: a control reads no frames; give a checkpoint (e.g. sft/4000@ode)")
    episodes = episodes_under(a.data, CHUNK_SIZE, a.episodes)
    device = pick_device(a.device)
    runner = PolicyRunner(spec.checkpoint, device=str(device), sampler=spec.sampler, temperature=spec.temperature,
                          seed=a.seed)
    size = episodes[0].main.shape[1]
    if runner.image_size != size:
        raise ConfigError(f"the policy reads {runner.image_size} px images, the episodes under {a.data} hold {size} px")
    t0 = time.perf_counter()
    roll = real_roll(episodes, a.horizon)
    rows = []
    for how in corruptions:
        r = perturbed(roll, a.view, how, a.seed)
        gap = action_gap(r, episodes, runner, CHUNK_SIZE)
        if images:
            size = {"psnr_db": round(psnr(r["imagined"][a.view], roll["real"][a.view], roll["valid"]), 2)}
        else:
            size = {"eef_error_mm": round(eef_error_mm(r["proprio"]["imagined"], roll["proprio"]["real"], roll["valid"]), 2)}
        rows.append({"corruption": how, **size,
                     "horizons": {h: {"episodes": g["episodes"], "action_gap": g["action_gap_imagined"],
                                      "held_start": g["action_gap_held"],
                                      "gripper_agrees": g["gripper_agrees_imagined"]}
                                  for h, g in gap["horizons"].items()}})
        print(f"[sensitivity] {a.view} {how}: {next(iter(size.values()))} {'dB' if images else 'mm'}, action gap "
              + ", ".join(f"{h}: {v['action_gap']}" for h, v in rows[-1]["horizons"].items()), flush=True)
    result = {"view": a.view, "policy": a.policy, "data": str(a.data), "episodes": len(episodes),
              "tasks": sorted({e.task for e in episodes}), "rows": rows, "seconds": round(time.perf_counter() - t0, 1),
              "machine": {"host": platform.node(), "device": str(device), "torch": torch.__version__}}
    print(table(result))
    if a.plot:
        from wmrl.plots import sensitivity_scatter

        sensitivity_scatter({**result, "marks": marks}, a.plot)
    if a.json:  # atomically: a killed run leaves the previous file whole
        from wmrl.fileio import write_json

        write_json(a.json, result)
    return result


def table(result: dict) -> str:
    hs = list(result["rows"][0]["horizons"])
    images = result["view"] != "proprio"
    size = "PSNR to the real frame (dB)" if images else "end-effector error (mm)"
    lines = [f"| {result['view']} | {size} | " + " | ".join(f"gap at {h}" for h in hs)
             + " | gripper sign agrees at 1 |", "|---" * (len(hs) + 3) + "|"]
    for r in result["rows"]:
        first = r["horizons"].get(hs[0], {})
        gaps = " | ".join(str(r["horizons"][h]["action_gap"]) for h in hs)
        lines.append(f"| {r['corruption']} | {r['psnr_db'] if images else r['eef_error_mm']} | {gaps} | "
                     f"{first.get('gripper_agrees', 0):.0%} |")
    held = " | ".join(str(result["rows"][0]["horizons"][h]["held_start"]) for h in hs)
    lines.append(f"| held start (every part of chunk 0) | | {held} | |")
    return "\n".join(lines)


if __name__ == "__main__":
    from wmrl.cli import run

    run(lambda: main() and 0)  # the kit's one-line errors (exit 2); main returns its figures, the exit code 0
