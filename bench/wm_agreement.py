"""Does the reward tell imagined successes from failures? The figure that decides whether GRPO
in imagination can work (the world-model issue's agreement), measured end to end on data where
episodes succeed *and* fail, with world models trained here, next to the reward's own ceiling.

    python python/collect_demos.py --tasks 2 --episodes 80 --action-noise 0.45 --keep-failures \\
        --image-size 64 --frame-interval 0 --out runs/noisy/n45
    python python/make_manifest.py --run runs/noisy --replay runs/noisy/n45 --val-ratio 0.3
    python bench/wm_agreement.py --manifest runs/noisy/manifest.json --size 64 --steps 1200 \\
        --views main --views main,wrist --models runs/noisy/pair --json agreement.json

Both views train with ``bench/wm_probe.py``'s loop on the manifest's training episodes
(``--arch``, default the kit's default; ``--models DIR`` keeps them, so reward settings can be
compared on the same pair). For each ``--views``, a reward model trains with the kit's
``train_reward`` as ``make wm-reward`` does: real frames and the frames the pair generates
replaying the training episodes open loop, its threshold calibrated on the first half of the
validation episodes (their imagined replays, success-once per episode). Agreement is measured
as ``make wm-eval`` measures it, on the *other* half, so the threshold is never scored on the
episodes it was chosen on, for the reward reading the imagined frames and reading the real
ones: the agreement a perfect world model would give, the reward's own ceiling.

Each reward is also asked about the two controls imagined from the scored episodes' starts
(``hold``: zero actions, ``random``: uniform ones; the simulator fails both): the share it calls
successful is imagination's false-alarm rate. ``--controls hold,random`` trains a reward with
those controls' rollouts from the training episodes' starts as failures
(``RewardConfig.control_negatives``); repeat ``--controls`` (``none`` for without) to compare.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from wm_probe import held_batch, parse_arch, probe, shrink  # noqa: E402  (bench/, this script's folder)

from wmrl.config import RewardConfig, WorldModelConfig  # noqa: E402
from wmrl.worldmodel.data import Transitions, held_out_halves, load_split, proprio_stats  # noqa: E402
from wmrl.worldmodel.fidelity import episode_agreement, metrics, open_loop  # noqa: E402
from wmrl.worldmodel.model import FrameWorldModel  # noqa: E402
from wmrl.worldmodel.reward import (CONTROLS, RewardModel, control_episodes, control_frames,  # noqa: E402
                                   episode_frames, episode_index, imagined_frames, simulator_outcomes, train_reward)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--manifest", required=True)
    p.add_argument("--size", type=int, default=64)
    p.add_argument("--arch", default="p4+32:128,256,256x1", help="both views (bench/wm_probe.py --arch)")
    p.add_argument("--cond-dim", type=int, default=256)
    p.add_argument("--steps", type=int, default=800, help="updates per view")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--reward-steps", type=int, default=1500)
    p.add_argument("--views", action="append", help="the reward's cameras, e.g. main or main,wrist (repeat to compare; "
                   "default both)")
    p.add_argument("--controls", action="append",
                   help="RewardConfig.control_negatives of a reward, e.g. none or hold,random (repeat to compare with "
                        "every --views; default none)")
    p.add_argument("--horizon", type=int, default=30, help="chunks imagined per episode")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--reward-seeds", type=lambda t: [int(x) for x in t.split(",")],
                   help="train every reward with each of these seeds on the same generated frames (default: --seed)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--json", help="also write the figures here")
    p.add_argument("--models", help="folder for the trained pair: loaded from it when there, else trained and saved "
                   "(to try reward settings on the same world models)")
    p.add_argument("--action-history", type=int, default=WorldModelConfig.action_history,
                   help="past action chunks each world model reads (the kit's default)")
    a = p.parse_args()
    # the rest of wm_probe's options at the kit's defaults (wm_probe.probe reads them)
    a.minutes, a.context_noise, a.strips, a.motion_weight, a.pose_maps = None, 0.0, None, 0.0, False
    a.context, a.ema, a.schedule, a.self_context, a.all_phases, a.final_steps = 2, 0.0, "constant", 0.0, False, []
    a.views = a.views or ["main,wrist"]
    a.controls = a.controls or ["none"]
    a.eval_every = a.steps  # wm_probe's loop: evaluate once, at the end

    _, train, val = load_split(a.manifest, 8)
    calib, test = held_out_halves(val)
    if not (calib and test):
        sys.exit(f"{a.manifest} has {len(val)} validation episodes: build it with a larger --val-ratio (4 or more)")
    train, calib, test = shrink(train, a.size), shrink(calib, a.size), shrink(test, a.size)

    def outcome(eps) -> str:
        return f"{sum(bool(e.success.any()) for e in eps)}/{len(eps)} successful"

    print(f"training {outcome(train)}, calibration {outcome(calib)}, test {outcome(test)} episodes; {a.size} px, "
          f"{a.device}", flush=True)
    tr, va = (Transitions(train, a.context, a.device, a.action_history),
              Transitions(calib, a.context, a.device, a.action_history))
    norm = {k: v.to(a.device) for k, v in proprio_stats(tr).items()}
    models, report = {}, {"args": vars(a), "episodes": {"train": len(train), "calibration": len(calib), "test": len(test)}}
    for view in ("main", "wrist"):
        a.view = view
        saved = Path(a.models or "-") / view
        if a.models and (saved / "config.json").exists():
            models[view] = FrameWorldModel.from_pretrained(saved, a.device).eval()
            print(f"{view} world model from {saved}", flush=True)
            continue
        result, model = probe(parse_arch(a.arch, a), tr, va, calib, norm, held_batch(va, view, norm, a.device, a.context), a)
        model.set_proprio_stats({k: v.to(model.proprio_mean.device) for k, v in norm.items()})
        models[view] = model.eval()
        report[f"train_{view}"] = result["curve"][-1]
        if a.models:
            model.save_pretrained(saved, meta={"trained_by": "bench/wm_agreement.py", **result["curve"][-1]})

    t0 = time.perf_counter()
    both = ("main", "wrist")  # generated once; a reward of fewer views reads its columns of them
    generated = {"train": imagined_frames(models["main"], models["wrist"], train, a.horizon, views=both,
                                          seed=a.seed + 1, device=a.device),
                 "val": imagined_frames(models["main"], models["wrist"], calib, a.horizon, views=both,
                                        seed=a.seed + 2, device=a.device)}
    print(f"{len(generated['train'][0])} + {len(generated['val'][0])} frames generated "
          f"({time.perf_counter() - t0:.0f} s)", flush=True)
    roll = open_loop(models["main"], models["wrist"], test, a.horizon, seed=a.seed + 3, device=a.device)
    report["fidelity"] = metrics(roll)
    # the controls, as negatives for training (from the training episodes' starts) and as the test of
    # imagination's false alarms (from the scored episodes' starts: the simulator says fail for all)
    named = {c for spec in a.controls for c in spec.split(",") if c != "none"}
    np_rng = np.random.default_rng(a.seed + 6)  # the random control's actions on the scored episodes
    t0 = time.perf_counter()
    control_train = {c: control_frames(models["main"], models["wrist"], train, a.horizon, controls=(c,), views=both,
                                       seed=a.seed + 4, device=a.device) for c in sorted(named)}
    control_test = {c: open_loop(models["main"], models["wrist"], control_episodes(test, a.horizon, c, np_rng),
                                 a.horizon, seed=a.seed + 5, device=a.device) for c in CONTROLS}
    print(f"controls: {sum(len(f[0]) for f in control_train.values())} training frames, "
          f"{sum(r['episodes'] for r in control_test.values())} test rollouts ({time.perf_counter() - t0:.0f} s)",
          flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        for spec, ctl, seed in [(v, c, s) for v in a.views for c in a.controls for s in a.reward_seeds or [a.seed]]:
            views = tuple(spec.split(","))
            controls = tuple(c for c in ctl.split(",") if c != "none")
            cfg = RewardConfig(views=views, steps=a.reward_steps, seed=seed, generated_horizon=a.horizon,
                               control_negatives=controls)
            gen = {k: (columns(f, views, a.size), labels, episode) for k, (f, labels, episode) in generated.items()}
            if controls:
                frames, labels, index = (torch.cat(x) for x in zip(*(control_train[c] for c in controls)))
                gen["controls"] = (columns(frames, views, a.size), labels, index)
            spec = (spec if not controls else f"{spec}+{ctl}") + (f"@seed{seed}" if a.reward_seeds else "")
            meta = train_reward(*episode_frames(train, views), *episode_frames(calib, views), cfg, Path(tmp) / spec, {},
                                progress=False, generated=gen, val_episode=episode_index(calib),
                                val_outcomes=simulator_outcomes(calib))
            reward = RewardModel.from_pretrained(Path(tmp) / spec, a.device).eval()
            report[spec] = {"threshold": meta["threshold"], "calibrated_on": meta["calibrated_on"],
                            "calibration": meta["val_generated_episodes"],
                            "single_frames_calibration": meta["val_frame_balanced_accuracy"],
                            "imagined": episode_agreement(roll, reward),
                            "real": episode_agreement(roll, reward, "real", meta["threshold_real"]),
                            # controls the simulator fails: the share imagination calls successful
                            "control_false_alarms": {c: round(episode_agreement(r, reward)["imagined_successes"]
                                                              / max(r["episodes"], 1), 4) for c, r in control_test.items()}}
            for frames in ("imagined", "real"):
                r = report[spec][frames]
                print(f"reward on {spec:11s} reading {frames:8s} frames: agreement {r['balanced_accuracy']} "
                      f"({r['real_successes']} real, {r['imagined_successes']} called successes of {r['episodes']}; "
                      f"{r['confusion']}), timing error {r['timing_error_chunks']} chunks", flush=True)
            print(f"reward on {spec:11s}: controls called successful {report[spec]['control_false_alarms']}", flush=True)
    for h, row in report["fidelity"]["horizons"].items():
        print(f"{h:>2} chunks: main {row['psnr_main']} dB / {row['ssim_main']} (held {row['psnr_main_static']} / "
              f"{row['ssim_main_static']}), wrist {row['psnr_wrist']} / {row['ssim_wrist']} (held "
              f"{row['psnr_wrist_static']} / {row['ssim_wrist_static']})", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=2, default=str))


def columns(frames: torch.Tensor, views: tuple[str, ...], size: int) -> torch.Tensor:
    """From uint8 (N, H, 2 W, 3) main | wrist frames, those of ``views`` side by side."""
    at = {"main": slice(0, size), "wrist": slice(size, 2 * size)}
    return torch.cat([frames[:, :, at[v]] for v in views], dim=2)


if __name__ == "__main__":
    main()
