"""World-model fidelity on held-out real episodes: open-loop with the real actions.

    python python/wm_eval.py --run runs/c1                    # pair RUN/model_pair, data RUN/manifest.json
    python python/wm_eval.py --pair runs/c1/model_pair --episodes 20 --videos 4

On the second half of the manifest's validation episodes (``held_out_halves``: the reward
model's threshold was calibrated on the first): PSNR / SSIM per view after 1, 5, 10, 20
chunks, the reward model's accuracy on real and on imagined frames, agreement with the
simulator on whole episodes (replayed actions: does the imagined episode succeed when the real
one did, and when) beside the same reward reading the real frames (its ceiling), whether each
model reads its actions (one chunk ahead: the real chunk against another's, on the pixels
that move), what the two controls reach in imagination from held-out keyframes (``hold``:
zero actions, ``random``: uniform ones; both fail in the simulator, so their imagined success
is imagination's false-alarm rate; ``--control-trials 0`` skips it), and real-vs-imagined MP4s;
written to PAIR/fidelity.json and PAIR/videos/.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from wmrl import cli
from wmrl.config import ConfigError
from wmrl.layout import RunLayout
from wmrl.release.pair import FIDELITY_FILE


def build(argv: list[str] | None = None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", default="runs/default")
    p.add_argument("--pair", help="model pair folder (default RUN/model_pair)")
    p.add_argument("--manifest", help="held-out episodes from this manifest's validation split (default RUN/manifest.json)")
    p.add_argument("--episodes", type=int, default=50,
                   help="validation episodes to imagine (at most; from the half the reward was not calibrated on)")
    p.add_argument("--horizon", type=int, default=30, help="chunks per open-loop rollout (30: a whole 240-step episode)")
    p.add_argument("--videos", type=int, default=4)
    p.add_argument("--control-trials", type=int, default=4,
                   help="closed-loop rollouts of each control (hold, random) per held-out keyframe; 0: none")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--dry-run", action="store_true")
    args = p.parse_args(argv)
    if args.control_trials < 0:
        raise ConfigError(f"--control-trials {args.control_trials}: give 0 (none) or more")
    args.pair = Path(args.pair or RunLayout(args.run).model_pair)
    args.manifest = Path(args.manifest or RunLayout(args.run).manifest)
    for path, how in ((args.pair / "pair.json", "make package"), (args.manifest, "make manifest")):
        if not path.is_file():
            raise ConfigError(f"{path} not found: make it first ({how} RUN={args.run})")
    return args


def main(args) -> int:
    if args.dry_run:
        cli.print_plan("world-model fidelity", {"pair": args.pair, "manifest": args.manifest, "episodes": args.episodes,
                                                "horizon": args.horizon, "out": args.pair / FIDELITY_FILE})
        return 0
    from wmrl.device import pick_device
    from wmrl.fileio import sha256_file, write_json
    from wmrl.release.pair import load_pair
    from wmrl.worldmodel.data import held_out_halves, load_split
    from wmrl.worldmodel.fidelity import (action_response, episode_agreement, metrics, open_loop, peak_ranking,
                                          reward_traces, write_videos)
    from wmrl.worldmodel.model import FrameWorldModel
    from wmrl.worldmodel.reward import RewardModel

    pair = load_pair(args.pair)  # every hash checked before any weights load
    device = pick_device(args.device)
    main_m = FrameWorldModel.from_pretrained(pair.part("main"), device)
    wrist_m = FrameWorldModel.from_pretrained(pair.part("wrist"), device)
    reward = RewardModel.from_pretrained(pair.part("reward"))
    _, _, val = load_split(args.manifest, main_m.cfg.chunk_size)
    if not val:
        raise ConfigError(f"{args.manifest} has no validation episodes; build it with --val-ratio > 0")
    disjoint = len(val) > 1  # else the one validation episode also calibrated the reward's threshold
    val = held_out_halves(val)[1][: args.episodes]  # not the half the reward's threshold was calibrated on
    # two held chunks past each episode's end: the rules of 2 and 3 chunks in a row can confirm a late crossing
    roll = open_loop(main_m, wrist_m, val, args.horizon, seed=args.seed, device=device, hold_chunks=2)
    result = {"pair": str(pair.root), "pair_json_sha256": sha256_file(pair.root / "pair.json"),  # binds it to this pair
              "manifest": str(args.manifest), "horizon": roll["steps"], "seed": args.seed,
              "episodes_disjoint_from_reward_calibration": disjoint, **metrics(roll, reward),
              "agreement": episode_agreement(roll, reward),
              # GRPO's success_chunks: the reward at its threshold in k chunks in a row
              "agreement_by_success_chunks": {str(k): episode_agreement(roll, reward, success_chunks=k)
                                              for k in (1, 2, 3)},
              # the reward's ceiling: reading the real frames, at the threshold chosen on real episodes where
              # the reward has one (a threshold set for blurred imagined frames misjudges sharp ones)
              "agreement_on_real_frames": episode_agreement(roll, reward, frames="real",
                                                            threshold=reward.saved_meta.get("threshold_real")),
              # per episode and chunk: to judge other success rules offline (bench/RESULTS.md)
              "reward_traces": reward_traces(roll, reward),
              "action_response": {v: action_response(m, val, seed=args.seed, device=device)
                                  for v, m in (("main", main_m), ("wrist", wrist_m))}}
    # threshold-free: does the reward rank the imagined successes above the failures at all (AUC),
    # and what would the best threshold on these episodes reach (optimistic: chosen where scored)
    result["reward_ranking"] = {f: peak_ranking(result["reward_traces"], f) for f in ("imagined", "real")}
    if args.control_trials:
        from wmrl.evaluation.ranking import control_false_alarms

        result["controls"] = control_false_alarms(args.pair, args.manifest, trials=args.control_trials,
                                                  max_chunks=args.horizon, seed=args.seed, device=device,
                                                  bf16=device.type == "cuda")
    result["videos"] = write_videos(roll, pair.root / "videos", args.videos)
    write_json(pair.root / FIDELITY_FILE, result)
    print(json.dumps({k: result[k] for k in ("horizons", "reward", "agreement", "agreement_on_real_frames", "reward_ranking",
                                             "action_response", "controls")
                      if k in result},
                     indent=1))
    eef = {h: r for h, r in result["horizons"].items() if "eef_error_mm" in r}
    if eef:  # the proprio drives the wrist warp and the policy's own input: a wrong one shows here first
        print("[wm-eval] imagined end effector off by (mm; the start held): " + ", ".join(
            f"{h} chunks {r['eef_error_mm']} ({r['eef_error_mm_static']})" for h, r in eef.items()))
    from wmrl.report import agreement_text

    print("[wm-eval] agreement by success_chunks (k chunks in a row at the threshold): " + ", ".join(
        f"k={k}: {agreement_text(a)}" for k, a in result["agreement_by_success_chunks"].items()))
    share = result["agreement"].get("grpo_signal_share")
    if share is not None:  # what the agreement means for GRPO in the pair (wmrl.release.pair.signal_share)
        need = f"~{1 / share:.0f}x the rollouts a step for the simulator's signal-to-noise" if share else "no signal at all"
        print(f"[wm-eval] GRPO in this pair follows at most {share:.2f} of the simulator's signal per rollout "
              f"((2 x agreement - 1)^2, from replayed actions; a policy that acts worse on imagined frames gets "
              f"less): {need}")
    print(f"[wm-eval] {pair.root / FIDELITY_FILE}")
    return 0


if __name__ == "__main__":
    cli.run(lambda: main(build()))
