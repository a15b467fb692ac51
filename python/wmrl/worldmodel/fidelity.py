"""How faithful are the world models? Open-loop rollouts with the real actions.

For held-out real episodes (the manifest's validation split), start from the real first
frames and feed the episode's real action chunks: the main model imagines the main view,
the wrist model the wrist view (seeing the imagined main view), each from its own imagined
history and the predicted proprio. Compared with the real frames at the same chunk:

* PSNR and SSIM per view after 1, 5, 10, 20 chunks (episodes that are long enough), next to
  the same figures for the frame the rollout started from, held (``*_static``): a model that
  predicts that nothing moves. Most of a LIBERO main view is a static table, so a world model
  earns its PSNR only where it beats that baseline;
* the reward model's accuracy on the real frames and on the imagined ones (agreement with
  the simulator's per-frame success), with balanced accuracy too: success frames are few, so
  "never success" alone scores ~93% plain accuracy;
* agreement with the simulator on whole episodes (``episode_agreement``): does the reward
  model, reading the frames imagined with an episode's real actions, call the episode a
  success when the simulator did, and at which chunk? Balanced accuracy of episode success
  (failures are common in a policy's data, successes in demonstrations) and the timing error.
  This is the figure that decides whether GRPO in imagination can work. Under the rule that asks
  k chunks in a row at the threshold (GRPO's ``success_chunks``), an episode's replay goes on
  past its last real chunk with the arm held still (``hold_chunks``), so a crossing at the end
  can be confirmed as it would be in GRPO;
* whether each model reads the actions (``action_response``): one chunk ahead from real
  frames, the real action chunk against another transition's, from the same noise;
* a video per episode: real | imagined, main view then wrist view.

Results go to ``fidelity.json`` next to ``pair.json``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from wmrl.release.pair import signal_share
from wmrl.worldmodel.reward import balanced_accuracy, calibrate_episodes, simulator_outcomes

HORIZONS = (1, 5, 10, 20)


def psnr(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per-image PSNR in dB of images in [-1, 1] (peak-to-peak 2)."""
    mse = ((a - b) ** 2).flatten(1).mean(1).clamp_min(1e-10)
    return 10 * torch.log10(4.0 / mse)


def ssim(a: torch.Tensor, b: torch.Tensor, window: int = 11, sigma: float = 1.5) -> torch.Tensor:
    """Per-image SSIM (Wang et al. 2004: Gaussian window 11, sigma 1.5, K1 0.01, K2 0.03),
    averaged over channels; images (B, C, H, W) in [-1, 1] are mapped to [0, 1]."""
    a, b = (a + 1) / 2, (b + 1) / 2
    c = a.shape[1]
    x = torch.arange(window, dtype=a.dtype, device=a.device) - window // 2
    g = torch.exp(-(x**2) / (2 * sigma**2))
    g = g / g.sum()
    k = (g[:, None] * g[None, :]).expand(c, 1, window, window)
    f = lambda z: F.conv2d(z, k, groups=c)  # noqa: E731  ("valid" windows, as the reference)
    mu_a, mu_b = f(a), f(b)
    var_a, var_b, cov = f(a * a) - mu_a**2, f(b * b) - mu_b**2, f(a * b) - mu_a * mu_b
    c1, c2 = 0.01**2, 0.03**2
    s = ((2 * mu_a * mu_b + c1) * (2 * cov + c2)) / ((mu_a**2 + mu_b**2 + c1) * (var_a + var_b + c2))
    return s.flatten(1).mean(1)


def eef_distance_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Distance (mm) between the end-effector positions of two raw proprio tensors (..., P): their
    first three values, in metres."""
    return 1000 * (a[..., :3].float() - b[..., :3].float()).norm(dim=-1)


@torch.no_grad()
def open_loop(main_model, wrist_model, episodes, horizon: int, seed: int = 0, device="cpu", bf16: bool = True,
              hold_chunks: int = 0) -> dict:
    """Imagine every episode with its real actions; returns real and imagined frames per step.

    Episodes run as one batch (``Imagination``); those shorter than ``horizon`` chunks simply
    stop contributing. Returned tensors are (E, T + 1, 3, H, W) in [-1, 1] with ``valid`` (E, T + 1).
    ``hold_chunks``: an episode that ends within the horizon is imagined that many chunks further
    with zero actions (the arm held still, the gripper as it was), marked in ``imagined_valid``;
    the real frames and ``valid`` end where the episode did (T counts these chunks too).
    On a GPU the models run under bf16 autocast (``bf16``), as GRPO's imagination does: the
    reward is calibrated, and agreement measured, on frames made the way GRPO makes them."""
    from wmrl.worldmodel.imagine import Imagination

    e = len(episodes)
    real_steps = min(horizon, max(len(ep.actions) for ep in episodes))
    steps = real_steps + hold_chunks
    real, real_proprio = real_frames(episodes, steps)
    acts = torch.stack([torch.from_numpy(_pad(ep.actions, steps)) for ep in episodes])
    lengths = torch.tensor([len(ep.actions) for ep in episodes])
    acts[torch.arange(steps)[None, :] >= lengths[:, None]] = 0  # past its end an episode holds still
    acts = acts.to(device)
    t = torch.arange(steps + 1)[None, :]
    valid = (t <= lengths[:, None]) & (t <= real_steps)
    ended = lengths <= real_steps  # over within the horizon: imagined on while held still
    imagined_valid = valid | (ended[:, None] & (t <= lengths[:, None] + hold_chunks))
    p0 = real_proprio[:, 0].to(device)
    g = torch.Generator(device="cpu").manual_seed(seed)
    world = Imagination(main_model, wrist_model)
    world.start(real["main"][:, :1].to(device), real["wrist"][:, :1].to(device), p0)
    imagined = {v: [real[v][:, 0].to(device)] for v in ("main", "wrist")}
    imagined_proprio = [p0.float()]
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16 and torch.device(device).type == "cuda")
    for t in range(steps):
        with autocast:
            main, wrist, proprio = world.step(acts[:, t], generator=g)
        imagined["main"].append(main)
        imagined["wrist"].append(wrist)
        imagined_proprio.append(proprio.float())
    success = [torch.from_numpy(_pad(ep.success, steps + 1)) & valid[i] for i, ep in enumerate(episodes)]
    return {"real": {v: real[v] for v in real}, "imagined": {v: torch.stack(imagined[v], 1).cpu() for v in imagined},
            "proprio": {"real": real_proprio, "imagined": torch.stack(imagined_proprio, 1).cpu()},  # (E, T + 1, P) raw
            "valid": valid, "imagined_valid": imagined_valid, "success": success, "steps": real_steps,
            "hold_chunks": hold_chunks, "episodes": e, "outcome": simulator_outcomes(episodes)}


def real_frames(episodes, steps: int) -> tuple[dict, torch.Tensor]:
    """Both views' real frames (E, steps + 1, 3, H, W) in [-1, 1] and raw proprio (E, steps + 1, P),
    an episode's last row repeated past its end (callers mask those rows)."""
    from wmrl.worldmodel.model import images_to_unit

    frames = {v: torch.stack([images_to_unit(torch.from_numpy(_pad(getattr(ep, v), steps + 1))) for ep in episodes])
              for v in ("main", "wrist")}
    return frames, torch.stack([torch.from_numpy(_pad(ep.proprio, steps + 1)) for ep in episodes]).float()


def _pad(x: np.ndarray, n: int) -> np.ndarray:
    """First n rows, repeating the last where the episode is shorter (masked by ``valid``)."""
    if len(x) >= n:
        return x[:n]
    return np.concatenate([x, np.repeat(x[-1:], n - len(x), axis=0)])


def metrics(roll: dict, reward=None) -> dict:
    out = {"episodes": roll["episodes"], "horizons": {}}
    for h in HORIZONS:
        if h > roll["steps"]:
            continue
        ok = roll["valid"][:, h]
        if not ok.any():
            continue
        row = {"episodes": int(ok.sum())}
        for v in ("main", "wrist"):
            real = roll["real"][v][ok, h]
            for name, guess in (("", roll["imagined"][v][ok, h]), ("_static", roll["real"][v][ok, 0])):
                row[f"psnr_{v}{name}"] = round(float(psnr(guess, real).mean()), 2)
                row[f"ssim_{v}{name}"] = round(float(ssim(guess, real).mean()), 4)
        if "proprio" in roll:  # where the imagined proprio puts the end effector
            real = roll["proprio"]["real"][ok, h]
            for name, guess in (("", roll["proprio"]["imagined"][ok, h]), ("_static", roll["proprio"]["real"][ok, 0])):
                row[f"eef_error_mm{name}"] = round(float(eef_distance_mm(guess, real).mean()), 1)
        out["horizons"][str(h)] = row
    if reward is not None:
        valid = roll["valid"]
        labels = torch.stack(roll["success"])[valid]
        real = reward.inputs({v: roll["real"][v][valid] for v in reward.cfg.views})
        imag = reward.inputs({v: roll["imagined"][v][valid] for v in reward.cfg.views})
        pr = torch.cat([reward.success(real[i:i + 256]) for i in range(0, len(real), 256)])
        pi = torch.cat([reward.success(imag[i:i + 256]) for i in range(0, len(imag), 256)])
        out["reward"] = {"frames": int(len(labels)), "success_frames": int(labels.sum()),
                         "accuracy_real": round(float((pr == labels).float().mean()), 4),
                         "accuracy_imagined": round(float((pi == labels).float().mean()), 4),
                         "balanced_accuracy_real": _round(balanced_accuracy(pr, labels)),
                         "balanced_accuracy_imagined": _round(balanced_accuracy(pi, labels)),
                         "real_vs_imagined_agreement": round(float((pi == pr).float().mean()), 4)}
    return out


def in_a_row(hit: torch.Tensor, k: int) -> torch.Tensor:
    """(E, T) bool -> (E, T) bool: True where ``hit`` holds at t and the k - 1 chunks after it."""
    out = hit.clone()
    for j in range(1, k):
        out[:, :-j] &= hit[:, j:]
        out[:, -j:] = False
    return out


def episode_agreement(roll: dict, reward, frames: str = "imagined", threshold: float | None = None,
                      success_chunks: int = 1) -> dict:
    """Episode-level success in imagination against the simulator's, for the rollouts of
    ``open_loop`` (real actions from the real start): success-once over the valid imagined
    frames, as GRPO's imagined environment judges it; timing error in chunks where both say
    success. ``success_chunks`` k: as GRPO's rule of that name, the reward at its threshold in k
    chunks in a row, the first of them within the episode, the others possibly in the chunks
    imagined past its end (``open_loop(hold_chunks=k - 1)``).

    ``frames="real"``: the same reward reading the real frames instead, the agreement a perfect
    world model would get (the reward's own ceiling: below it, the world models lose what
    success looks like; at it, the reward cannot tell). ``threshold``: instead of the reward's
    own (calibrated on imagined episodes), e.g. its ``threshold_real``, chosen on real episodes,
    for the ceiling: a threshold set for blurred imagined frames misjudges sharp ones."""
    valid = roll["valid"]
    readable = roll.get("imagined_valid", valid) if frames == "imagined" else valid
    if success_chunks > 1 and frames == "imagined" and roll.get("hold_chunks", 0) < success_chunks - 1:
        raise ValueError(f"success_chunks={success_chunks} needs open_loop(hold_chunks >= {success_chunks - 1})")
    labels = torch.stack(roll["success"]).bool() & valid
    e = labels.shape[0]
    said = torch.zeros_like(labels)
    views = roll[frames]
    for i in range(e):
        x = reward.inputs({v: views[v][i] for v in reward.cfg.views})
        with torch.no_grad():
            hit = reward.success(x) if threshold is None else torch.sigmoid(reward(x)) >= threshold
        said[i] = hit.cpu() & readable[i]
    said[:, 0] = False  # the start is a real frame, not imagined
    said = in_a_row(said, success_chunks) & valid  # the run begins within the episode
    seen = labels.any(1)  # a success frame among the chunk boundaries the reward reads
    # the truth is the simulator's success-once; a success whose goal held only inside a chunk
    # has no success frame to see (counted: the part of the gap no reward can close)
    real, imag = roll.get("outcome", seen), said.any(1)
    first = lambda m: torch.where(m.any(1), m.float().argmax(1), torch.full((e,), -1.0))  # noqa: E731
    both = real & imag
    timing = (first(said) - first(labels))[imag & seen].abs()  # where both have a success frame
    return {"episodes": e, "success_chunks": success_chunks, "real_successes": int(real.sum()),
            "imagined_successes": int(imag.sum()),
            "successes_without_success_frame": int((real & ~seen).sum()),
            "balanced_accuracy": _round(balanced_accuracy(imag, real)),
            "balanced_accuracy_95": balanced_accuracy_interval(imag, real),
            "grpo_signal_share": signal_share(balanced_accuracy(imag, real)),
            "accuracy": round(float((imag == real).float().mean()), 4),
            "confusion": {"both_success": int(both.sum()), "only_real": int((real & ~imag).sum()),
                          "only_imagined": int((~real & imag).sum()), "both_failure": int((~real & ~imag).sum())},
            "timing_error_chunks": round(float(timing.mean()), 2) if len(timing) else None}


def balanced_accuracy_interval(pred: torch.Tensor, truth: torch.Tensor, draws: int = 2000,
                               seed: int = 0) -> list[float] | None:
    """95% interval of the episodes' balanced accuracy (stratified bootstrap: the real successes
    and the real failures each resampled with replacement, so every draw has both). A few dozen
    held-out episodes make a wide interval: say it beside the figure (None without both kinds)."""
    pred, truth = pred.bool().cpu(), truth.bool().cpu()
    pos, neg = pred[truth], ~pred[~truth]  # per episode: was it judged right
    if not len(pos) or not len(neg):
        return None
    g = torch.Generator().manual_seed(seed)
    recall = lambda right: right[torch.randint(len(right), (draws, len(right)), generator=g)].float().mean(1)  # noqa: E731
    bal = (recall(pos) + recall(neg)) / 2
    return [round(float(q), 4) for q in torch.quantile(bal, torch.tensor([0.025, 0.975]))]


@torch.no_grad()
def reward_traces(roll: dict, reward) -> dict:
    """Per episode of ``open_loop``'s rollouts, the reward's probability at every chunk on the
    imagined and on the real frames, with the simulator's labels: the raw material for judging a
    success rule (threshold, several chunks in a row, a horizon) offline; invalid chunks are None."""
    valid = roll["valid"]
    out = {"imagined": [], "real": [], "labels": [], "outcome": [bool(x) for x in roll.get(
        "outcome", torch.stack(roll["success"]).bool().any(1))]}
    for i in range(valid.shape[0]):
        for frames in ("imagined", "real"):
            x = reward.inputs({v: roll[frames][v][i] for v in reward.cfg.views})
            prob = torch.sigmoid(reward(x)).float().cpu()
            ok_at = roll.get("imagined_valid", valid)[i] if frames == "imagined" else valid[i]  # past the end: held
            out[frames].append([round(float(p), 4) if ok else None for p, ok in zip(prob, ok_at)])
        out["labels"].append([bool(y) and bool(ok) for y, ok in zip(roll["success"][i], valid[i])])
    return out


def episode_peaks_from_traces(traces: dict, frames: str = "imagined") -> torch.Tensor:
    """Per episode of ``reward_traces``: the reward's highest probability over the chunks it judges
    as ``episode_agreement`` does (after the start, within the episode; the held chunks past its
    end not counted)."""
    peaks = []
    for seen, real in zip(traces[frames], traces["real"]):  # real None: past the episode's end
        judged = [p for j, (p, r) in enumerate(zip(seen, real)) if j > 0 and p is not None and r is not None]
        peaks.append(max(judged, default=0.0))
    return torch.tensor(peaks)


def peak_ranking(traces: dict, frames: str = "imagined") -> dict | None:
    """Does the reward rank the simulator's successes above its failures, whatever its threshold?
    From ``reward_traces``: the area under the ROC curve of each episode's peak probability
    (1: every success above every failure; 0.5: chance), and the best balanced accuracy any one
    threshold reaches on these same episodes, with that threshold. That best is optimistic (chosen
    where it is scored; ``bench/reward_ranking.py`` also scores a threshold chosen on one half of
    the episodes on the other). An AUC below ~0.85 says no threshold can reach issue 15's bar:
    the frames or the reward must change. None unless both outcomes are among the episodes."""
    peak, real = episode_peaks_from_traces(traces, frames), torch.tensor(traces["outcome"], dtype=torch.bool)
    best = calibrate_episodes(peak, real)
    if best is None:
        return None
    pos, neg = peak[real], peak[~real]
    above = (pos[:, None] > neg[None, :]).float() + 0.5 * (pos[:, None] == neg[None, :]).float()
    return {"episodes": len(peak), "real_successes": int(real.sum()), "auc": _round(float(above.mean())),
            "best_balanced_accuracy": _round(best[1]), "best_threshold": round(best[0], 2)}


@torch.no_grad()
def action_response(model, episodes, seed: int = 0, device="cpu", bf16: bool = True, batch: int = 256
                    ) -> dict | None:
    """Does ``model`` read the actions? At every chunk boundary of ``episodes``, from the real
    context frames (and, for the wrist model, the real main frame at the chunk's start), predict
    the next frame once with the chunk's real actions and once with another transition's (a
    fixed shift by half the set, so mostly another episode's), from the same noise. PSNR of both
    against the real next frame, over the whole frame and over the pixels that move in the real
    chunk (``model.moving_pixels``: the arm's pixels, a small part of a LIBERO frame, where a
    blurred, unmoved arm hides behind a static table in whole-frame PSNR), beside the current
    frame held (PSNR of the squared error pooled over all pixels). A model that ignores its
    actions gains 0 dB exactly; one that reads them is better with its own. None for fewer than
    two transitions."""
    from wmrl.worldmodel.data import Transitions
    from wmrl.worldmodel.model import moving_pixels

    t = Transitions(episodes, model.cfg.context, action_history=model.cfg.action_history)
    s = t.size
    if s < 2:
        return None
    other = (torch.arange(s) + s // 2) % s
    norm = {k: v.cpu() for k, v in model.proprio_stats.items()}  # the transitions stay on the CPU
    g = torch.Generator(device="cpu").manual_seed(seed)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16 and torch.device(device).type == "cuda")
    se = {k: torch.zeros(()) for k in ("true", "other", "held")}
    se_moving = {k: torch.zeros(()) for k in se}
    pixels = pixels_moving = 0
    for i in range(0, s, batch):
        idx = torch.arange(i, min(i + batch, s))
        b = {k: v.to(device) for k, v in t.batch(idx, model.cfg.view, model.cfg.main_condition, norm).items()}
        target = b["target"].float()
        noise = torch.randn(target.shape, generator=g).to(device)
        guesses = {"held": model.current_frame(b["frames"]).float()}
        swapped = b["actions"].clone()  # the past chunks stay: only the chunk to imagine is another's
        swapped[:, -model.cfg.chunk_size:] = t.actions[other[idx]].to(device)
        for name, acts in (("true", b["actions"]), ("other", swapped)):
            with autocast:
                guesses[name] = model.generate(b["frames"], acts, b["proprio"], noise=noise)[0].float()
        mask = moving_pixels(target, guesses["held"]).expand_as(target)
        for name, guess in guesses.items():
            err = (guess - target) ** 2
            se[name] += err.sum().cpu()
            se_moving[name] += err[mask].sum().cpu()
        pixels += target.numel()
        pixels_moving += int(mask.sum())

    def db(total, n):
        return round(float(10 * torch.log10(4.0 / (total / n).clamp_min(1e-10))), 2) if n else None

    out = {"transitions": s, "moving_fraction": round(pixels_moving / pixels, 4)}
    for key, sums, n in (("psnr", se, pixels), ("psnr_moving", se_moving, pixels_moving)):
        row = {k: db(v, n) for k, v in sums.items()}
        row["gain_db"] = None if row["true"] is None else round(row["true"] - row["other"], 2)
        out[key] = row
    return out


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def write_videos(roll: dict, out_dir: Path, count: int, fps: int = 4) -> list[str]:
    """real | imagined (main), real | imagined (wrist), one MP4 per episode."""
    from wmrl.fileio import write_video
    from wmrl.worldmodel.model import unit_to_images

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(min(count, roll["episodes"])):
        n = int(roll["valid"][i].sum())
        rows = [torch.cat([roll["real"][v][i, :n], roll["imagined"][v][i, :n]], dim=-1) for v in ("main", "wrist")]
        video = unit_to_images(torch.cat(rows, dim=-1)).numpy()  # (T, H, 4W, 3)
        paths.append(str(write_video(out_dir / f"episode_{i:02d}_real_vs_imagined.mp4", video, fps)))
    return paths
