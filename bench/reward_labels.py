"""Which training frames and labels let the reward call *episode* success on real frames?
The reward's ceiling (what a perfect world model would give it) was 0.55 on the H200's ten
tasks: a successful episode ends at its one success frame, so the reward learns success from a
hundred-odd pictures against ten thousand others. This compares, on real frames only (no world
models), the kit's reward (``train_reward``) trained on:

* ``phase0``: the chunk-boundary frames with the simulator's labels (what ``make wm-reward`` does);
* ``phases``: every phase of every-step recordings (8x the frames: the steps just before
  success are the hardest failures there are);
* ``phases+wW``: every phase, and the frames of the last W steps before a success labelled
  success ("success within the next chunk": 1 + W positives per successful episode);
* ``...+cut``: each training episode cut after its first success frame: on recordings made with
  ``--post-success-steps`` (which go on past the success), what a normal recording would hold,
  so one collection compares the two.

Scored as ``make wm-eval`` scores agreement (success-once per episode over the real
chunk-boundary frames after the start, the simulator's outcome as truth): the threshold chosen on
one half of the validation episodes, applied to the other, both ways round.

    python bench/reward_labels.py --manifest runs/noisy/manifest.json --size 64 --seeds 0,1 \\
        --variants phase0,phases,phases+w7 --json reward_labels.json
    python bench/reward_labels.py --manifest runs/post/manifest.json --val-manifest runs/other/manifest.json \\
        --variants phase0,phase0+cut      # validation: every episode of another collection
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from wm_probe import shrink  # noqa: E402  (bench/, this script's folder)

from wmrl.config import RewardConfig  # noqa: E402
from wmrl.worldmodel.data import held_out_halves, load_split  # noqa: E402
from wmrl.worldmodel.model import images_to_unit  # noqa: E402
from wmrl.worldmodel.reward import (RewardModel, balanced_accuracy, calibrate_episodes, episode_frames,  # noqa: E402
                                   episode_index, episode_peaks, simulator_outcomes, train_reward)


def success_within(episodes, chunk: int, window: int) -> list[torch.Tensor]:
    """Per episode stream, its frames labelled success where the recorded episode succeeds
    within ``window`` steps of the frame (0: the simulator's own labels)."""
    first: dict[str, int] = {}  # recorded episode -> step of its first success, over all phases
    for e in episodes:
        hit = e.success.nonzero()[0]
        if len(hit):
            step = e.phase + chunk * int(hit[0])
            first[recorded(e)] = min(first.get(recorded(e), step), step)
    out = []
    for e in episodes:
        steps = e.phase + chunk * torch.arange(len(e.success))
        t = first.get(recorded(e))
        near = (steps >= t - window) if t is not None and window else torch.zeros(len(steps), dtype=torch.bool)
        out.append(torch.from_numpy(e.success) | near)
    return out


def cut_at_success(e):
    """The episode stream up to and including its first success frame (unchanged without one)."""
    hit = e.success.nonzero()[0]
    if not len(hit):
        return e
    n = int(hit[0]) + 1
    return replace(e, main=e.main[:n], wrist=e.wrist[:n], proprio=e.proprio[:n], actions=e.actions[:n - 1],
                   success=e.success[:n])


def recorded(e) -> str:
    """The recorded episode a phase stream comes from (keys repeat across files)."""
    return f"{e.file_sha256}:{e.key.split('@')[0]}"


def peaks_of(model: RewardModel, episodes, views) -> tuple[torch.Tensor, torch.Tensor]:
    """Per episode: the highest success probability after its start, and the simulator's outcome
    (its success-once, also where the goal held only inside a chunk)."""
    frames, labels = episode_frames(episodes, views)
    with torch.no_grad():
        probs = torch.cat([torch.sigmoid(model(images_to_unit(frames[i:i + 256]))) for i in range(0, len(frames), 256)])
    return episode_peaks(probs, labels, episode_index(episodes), simulator_outcomes(episodes))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--manifest", required=True)
    p.add_argument("--val-manifest", help="score on every episode of this manifest instead of --manifest's validation ones")
    p.add_argument("--size", type=int, default=64)
    p.add_argument("--views", default="main,wrist")
    p.add_argument("--variants", default="phase0,phases,phases+w7")
    p.add_argument("--seeds", default="0,1")
    p.add_argument("--steps", type=int, default=1500, help="reward training steps")
    p.add_argument("--channels", help="the reward's convolution widths, e.g. 32,64,128,128,256 (default: RewardConfig's)")
    p.add_argument("--shift", type=float, default=RewardConfig.shift,
                   help="random shift of each view in training, a fraction of its side (RewardConfig.shift; 0: off)")
    p.add_argument("--json", help="also write the figures here")
    a = p.parse_args()
    views, chunk = tuple(a.views.split(",")), 8

    _, every, val = load_split(a.manifest, chunk, phases=True)
    if a.val_manifest:  # another collection's episodes, training and validation alike, at phase 0
        _, other_train, other_val = load_split(a.val_manifest, chunk)
        val = [e for e in other_train if e.phase == 0] + other_val
    every, val = shrink(every, a.size), shrink(val, a.size)
    halves = held_out_halves(val)
    report = {"args": vars(a), "episodes": {"train": len({recorded(e) for e in every}), "val": len(val)}}
    print(f"{report['episodes']['train']} training episodes ({len(every)} phase streams), {len(val)} validation: "
          f"{int(simulator_outcomes(val).sum())} successful", flush=True)
    for variant in a.variants.split(","):
        base, cut = variant.removesuffix("+cut"), variant.endswith("+cut")
        name, _, w = base.partition("+w")
        if name not in ("phase0", "phases"):
            sys.exit(f"--variants {variant}: phase0, phases or phases+wW (W steps before success count as success), "
                     "each optionally +cut")
        eps = every if name == "phases" else [e for e in every if e.phase == 0]
        eps = [cut_at_success(e) for e in eps] if cut else eps
        labels = success_within(eps, chunk, int(w or 0))
        frames, _ = episode_frames(eps, views)
        labels = torch.cat(labels)
        for seed in (int(s) for s in a.seeds.split(",")):
            cfg = RewardConfig(views=views, steps=a.steps, seed=seed, generated_horizon=0, shift=a.shift,
                               **({"channels": tuple(int(c) for c in a.channels.split(","))} if a.channels else {}))
            t0 = time.perf_counter()
            with tempfile.TemporaryDirectory() as tmp:
                vf, vl = episode_frames(halves[0], views)
                train_reward(frames, labels, vf, vl, cfg, Path(tmp), {}, progress=False)
                model = RewardModel.from_pretrained(Path(tmp), "cpu").eval()
            scores = []
            for cal, test in ((halves[0], halves[1]), (halves[1], halves[0])):
                peak_c, real_c = peaks_of(model, cal, views)
                th, _ = calibrate_episodes(peak_c, real_c) or (0.5, None)
                peak_t, real_t = peaks_of(model, test, views)
                scores.append({"threshold": round(th, 2), "agreement": round(balanced_accuracy(peak_t >= th, real_t), 3),
                               "said": int((peak_t >= th).sum()), "real": int(real_t.sum()), "episodes": len(test)})
            row = {"train_frames": len(labels), "success_frames": int(labels.sum()), "halves": scores,
                   "mean_agreement": round(sum(s["agreement"] for s in scores) / 2, 3),
                   "wall_s": round(time.perf_counter() - t0, 1)}
            report[f"{variant}/s{seed}"] = row
            print(f"{variant:10s} seed {seed}: {row['success_frames']} success of {row['train_frames']} frames; "
                  f"agreement {scores[0]['agreement']} / {scores[1]['agreement']} (mean {row['mean_agreement']}; "
                  f"said {scores[0]['said']}/{scores[0]['real']}, {scores[1]['said']}/{scores[1]['real']} real successes); "
                  f"{row['wall_s']} s", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
