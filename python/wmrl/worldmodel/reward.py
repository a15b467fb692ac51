"""The reward model: does the goal hold in these frames? Frozen during GRPO.

It reads the cameras of ``RewardConfig.views`` side by side in one image (main | wrist by
default: the wrist camera shows the bowl on the plate from above), so the same convolutions
read both and the pooled features mix them.

GRPO scores imagined rollouts with it, so it must judge *generated* frames. It trains on
real frames (labels: the simulator's per-frame success, ``rewards`` in the trajectory files)
made to look generated - blurred and noised at random - and, once the world models exist, on
frames they generated: every training episode replayed open loop with its real actions from
its real start (``imagined_frames``), each imagined frame labelled with the real frame's
success, so the reward learns to say what the simulator said from what the world model
shows. Success frames are rare (an episode ends soon after success), so batches are drawn half
positive, half negative, and every view is shifted by a few pixels at random (``RewardConfig.shift``):
from ~120 success frames it then generalises to other episodes' far better (episode agreement on
real frames 0.78 -> 0.86, bench/RESULTS.md).

The decision threshold is stored with the weights. It is calibrated for the decision GRPO
makes: an imagined rollout succeeds once any of its frames reaches the threshold, so over a
30-chunk rollout a threshold that is right for single frames calls nearly every rollout a
success (measured on the H200: 20 of 20 held-out episodes, 13 real successes, and every GRPO
group skipped). Where the validation episodes' generated frames show both outcomes, the
threshold is the one with the best balanced accuracy of *episode* success (success-once over
the episode's generated frames against the simulator's); else it is calibrated on frames,
generated or real.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from wmrl.augment import random_shift as shift_one
from wmrl.config import RewardConfig
from wmrl.pretrained import Pretrained


class RewardModel(Pretrained, nn.Module):
    """Saved and loaded with ``save_pretrained`` / ``from_pretrained`` (``wmrl.pretrained``);
    the calibrated threshold is a buffer, so it travels with the weights."""

    FORMAT = "wmrl-reward/2"  # /2: the views side by side (/1 read the main view alone)
    CONFIG_CLASS = RewardConfig

    def __init__(self, cfg: RewardConfig):
        super().__init__()
        layers, cin = [], 3
        for c in cfg.channels:
            layers += [nn.Conv2d(cin, c, 3, stride=2, padding=1), nn.GroupNorm(min(8, c), c), nn.SiLU()]
            cin = c
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(cin, 1)
        self.cfg = cfg
        self.register_buffer("threshold", torch.tensor(0.5))

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        """frames (B, 3, H, W x views) in [-1, 1], ``inputs``' layout -> success logits (B,)."""
        return self.head(self.features(frames).mean(dim=(2, 3))).squeeze(-1)

    def inputs(self, views: dict[str, torch.Tensor]) -> torch.Tensor:
        """Per view (B, 3, H, W) -> the model's input: its views side by side (B, 3, H, W x views)."""
        return side_by_side(views, self.cfg.views, dim=-1)

    @torch.no_grad()
    def success(self, frames: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self(frames)) >= self.threshold


def side_by_side(views: dict[str, torch.Tensor], names: tuple[str, ...], dim: int) -> torch.Tensor:
    """The named views concatenated along the width (``dim``: -1 for (B, 3, H, W), 2 for uint8
    (N, H, W, 3)); each view must have the same height."""
    return torch.cat([views[v] for v in names], dim=dim)


def episode_frames(episodes, views: tuple[str, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """The real chunk-boundary frames of ``episodes`` as the reward reads them, uint8
    (N, H, W x views, 3), and the simulator's success at each (N,)."""
    if not episodes:
        return torch.zeros(0, dtype=torch.uint8), torch.zeros(0, dtype=torch.bool)
    frames = {v: torch.from_numpy(np.concatenate([getattr(e, v) for e in episodes])) for v in views}
    return side_by_side(frames, views, dim=2), torch.from_numpy(np.concatenate([e.success for e in episodes]))


def simulator_outcomes(episodes) -> torch.Tensor:
    """Per episode, the simulator's success-once (``Episode.outcome``; where unknown, whether a
    frame is labelled success): the truth that agreement with the simulator is scored against."""
    return torch.tensor([e.succeeded for e in episodes], dtype=torch.bool)


def episode_index(episodes) -> torch.Tensor:
    """For ``episode_frames(episodes, ...)``: which episode each frame belongs to (N,)."""
    return torch.cat([torch.full((len(e.success),), i) for i, e in enumerate(episodes)]) if episodes else \
        torch.zeros(0, dtype=torch.long)


def generated_style(x: torch.Tensor, cfg: RewardConfig, g: torch.Generator) -> torch.Tensor:
    """Random blur (a 3x3 box, as a few-step generator's softness) and pixel noise."""
    blur = F.avg_pool2d(F.pad(x, (1, 1, 1, 1), mode="replicate"), 3, stride=1)
    pick = (torch.rand(x.shape[0], 1, 1, 1, generator=g, device=g.device) < cfg.blur_prob).to(x.dtype)
    x = pick * blur + (1 - pick) * x
    return (x + cfg.noise_std * torch.randn(x.shape, generator=g, device=g.device)).clamp(-1, 1)


def random_shift(x: torch.Tensor, pad: int, views: int, g: torch.Generator) -> torch.Tensor:
    """DrQ's augmentation: each view of (B, 3, H, W x views) moved by up to ``pad`` pixels in x
    and y (edges repeated), independently per sample and view, so the views never mix at the seam."""
    w = x.shape[-1] // views
    return torch.cat([shift_one(x[..., v * w:(v + 1) * w], pad, g) for v in range(views)], dim=-1)


@torch.no_grad()
def imagined_frames(main_model, wrist_model, episodes, horizon: int, *, views: tuple[str, ...], batch: int = 32,
                    seed: int = 0, device="cpu") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The frames the pair generates for ``episodes`` (real start, real actions) as the reward
    reads them (``views`` side by side), uint8 (N, H, W x views, 3), with the real frames'
    success labels (N,) and the index of the episode each frame belongs to (N,); the start
    frames (real) are left out."""
    from wmrl.worldmodel.fidelity import open_loop
    from wmrl.worldmodel.model import unit_to_images

    frames, labels, index = [], [], []
    for i in range(0, len(episodes), batch):
        roll = open_loop(main_model, wrist_model, episodes[i:i + batch], horizon, seed=seed + i, device=device)
        valid = roll["valid"].clone()
        valid[:, 0] = False
        success = torch.stack(roll["success"]).bool()
        frames.append(unit_to_images(side_by_side({v: roll["imagined"][v][valid] for v in views}, views, dim=-1)))
        labels.append(success[valid])
        index.append((torch.arange(valid.shape[0])[:, None] + i).expand_as(valid)[valid])
    if not frames:
        return no_frames()
    return torch.cat(frames), torch.cat(labels), torch.cat(index)


CONTROLS = ("hold", "random")


def control_frames(main_model, wrist_model, episodes, horizon: int, *, controls: tuple[str, ...],
                   views: tuple[str, ...], batch: int = 32, seed: int = 0, device="cpu"):
    """Known failures as negatives: the pair imagines each episode from its real start under a
    control's actions for ``horizon`` chunks (``hold``: zero actions, the arm stays and the
    gripper does not move; ``random``: uniform in [-1, 1]^7), neither of which completes a task
    from a start where the goal does not hold. Every frame is labelled failure. The reward then
    sees what the pair's drift looks like under actions that cannot succeed, where the open-loop
    replays of real episodes show drift only along trajectories that may. Returns
    ``imagined_frames``' triple."""
    rng = np.random.default_rng(seed)
    parts = []
    for k, name in enumerate(controls):
        eps = control_episodes(episodes, horizon, name, rng)
        if eps:
            parts.append(imagined_frames(main_model, wrist_model, eps, horizon, views=views, batch=batch,
                                         seed=seed + 1000 * (k + 1), device=device))
    if not parts:
        return no_frames()
    return tuple(torch.cat(x) for x in zip(*parts))


def control_episodes(episodes, horizon: int, control: str, rng: np.random.Generator) -> list:
    """``episodes`` whose goal does not hold at the start, with ``horizon`` chunks of the
    control's actions in place of theirs and no success anywhere (what the simulator would say)."""
    from dataclasses import replace

    if control not in CONTROLS:
        raise ValueError(f"unknown control {control!r}; choose from {CONTROLS}")
    out = []
    for e in episodes:
        if e.success[0]:
            continue
        acts = np.zeros((horizon, *e.actions.shape[1:]), np.float32)
        if control == "random":
            acts = rng.uniform(-1.0, 1.0, acts.shape).astype(np.float32)
        out.append(replace(e, actions=acts, success=np.zeros(horizon + 1, bool), outcome=False))
    return out


def no_frames() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``imagined_frames`` of no episode."""
    return torch.zeros(0, dtype=torch.uint8), torch.zeros(0, dtype=torch.bool), torch.zeros(0, dtype=torch.long)


def balanced_accuracy(pred: torch.Tensor, labels: torch.Tensor) -> float | None:
    """Mean of the recall on success frames and on the others (None without both kinds):
    success frames are rare, so plain accuracy rewards never saying "success"."""
    pred, labels = pred.bool(), labels.bool()
    if labels.all() or not labels.any():
        return None
    return sum(float((pred[labels == c] == c).float().mean()) for c in (True, False)) / 2


def calibrate(probs: torch.Tensor, labels: torch.Tensor) -> tuple[float, float]:
    """The threshold with the best balanced accuracy, and that accuracy (both kinds of frame
    must be present)."""
    best = (0.5, -1.0)
    for th in torch.linspace(0.05, 0.95, 19):
        bal = balanced_accuracy(probs >= th, labels)
        if bal > best[1]:
            best = (float(th), bal)
    return best


def episode_outcomes(probs: torch.Tensor, labels: torch.Tensor, episode: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per episode (of those with frames): the highest success probability of its frames and
    whether the simulator called it a success (any frame labelled success)."""
    ids, inverse = torch.unique(episode, return_inverse=True)
    peak = torch.full((len(ids),), -1.0).scatter_reduce(0, inverse, probs.float(), "amax")
    real = torch.zeros(len(ids)).scatter_reduce(0, inverse, labels.float(), "amax").bool()
    return peak, real


def episode_peaks(probs: torch.Tensor, labels: torch.Tensor, episode: torch.Tensor,
                  outcomes: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``episode_outcomes`` of real episodes' frames in order (``episode_index``), each start frame
    left out: it is never judged (GRPO and ``episode_agreement`` start from it). ``outcomes``
    (``simulator_outcomes`` of the same episodes): the truth, instead of the labelled frames."""
    start = torch.ones(len(episode), dtype=torch.bool)
    start[1:] = episode[1:] != episode[:-1]
    peak, real = episode_outcomes(torch.where(start, -1.0, probs), labels, episode)
    return peak, (real if outcomes is None else outcomes[torch.unique(episode)].bool())


def calibrate_episodes(peak: torch.Tensor, real: torch.Tensor) -> tuple[float, float] | None:
    """The threshold of success-once (an episode succeeds when any of its frames reaches it),
    from ``episode_outcomes``, with the best balanced accuracy of episode success, and that
    accuracy; None unless both outcomes are among the episodes. Of equally good thresholds the
    middle one: ties are common with few episodes, and the middle is furthest from flipping any."""
    if real.all() or not real.any():
        return None
    grid = torch.linspace(0.01, 0.99, 99)
    scores = torch.tensor([balanced_accuracy(peak >= th, real) for th in grid])
    best = torch.nonzero(scores >= scores.max() - 1e-9).flatten()
    return float(grid[best[len(best) // 2]]), float(scores.max())


def real_and_generated(idx: torch.Tensor, generated_from: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``idx`` (frame indices of one label) split into the real frames' and the pair's."""
    return idx[idx < generated_from], idx[idx >= generated_from]


def draw(every: torch.Tensor, real: torch.Tensor, gen: torch.Tensor, n: int, share: float,
         g: torch.Generator) -> torch.Tensor:
    """``n`` frame indices of one label, ``share`` of them from the generated ones where there are
    both kinds; else (share 0, or one kind missing) uniformly from ``every``, as before the option."""
    if share == 0 or not len(real) or not len(gen):
        return every[torch.randint(len(every), (n,), generator=g, device=every.device)]
    k = round(share * n)
    return torch.cat([real[torch.randint(len(real), (n - k,), generator=g, device=real.device)],
                      gen[torch.randint(len(gen), (k,), generator=g, device=gen.device)]])


class RewardObjective(nn.Module):
    """Binary cross-entropy of the wrapped model, for DeepSpeed's engine (inputs cast to its dtype)."""

    def __init__(self, model: RewardModel):
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        dt = next(self.model.parameters()).dtype
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=x.is_cuda):
            return F.binary_cross_entropy_with_logits(self.model(x.to(dt)).float(), y.float())


def train_reward(train_frames: torch.Tensor, train_labels: torch.Tensor, val_frames: torch.Tensor,
                 val_labels: torch.Tensor, cfg: RewardConfig, out: Path, lineage: dict, progress: bool = True,
                 ds_config_path: str | None = None, generated: dict | None = None,
                 val_episode: torch.Tensor | None = None, val_outcomes: torch.Tensor | None = None) -> dict:
    """uint8 frames (N, H, W, 3) and bool labels -> ``out/model.safetensors`` + ``config.json``.
    Trained through DeepSpeed like the world models (one process; bf16 on a GPU).
    ``generated``: {"train": (frames, labels), "val": (frames, labels)} imagined by the pair;
    the training ones join the real frames, the validation ones set the threshold; an optional
    "controls" entry (``control_frames``) joins the training frames too.
    ``val_episode`` (``episode_index`` of the real validation frames): also calibrate
    success-once on the real validation episodes (``threshold_real``), the threshold with which
    ``make wm-eval`` measures the reward's own ceiling on real frames; ``val_outcomes``
    (``simulator_outcomes``): the simulator's verdict on those episodes as the truth there."""
    gen_train_n = control_n = 0
    generated_from = len(train_frames)  # frames from here on are the pair's (RewardConfig.generated_share)
    if generated is not None and len(generated["train"][0]):
        gen_train_n = len(generated["train"][0])
        train_frames = torch.cat([train_frames, generated["train"][0]])
        train_labels = torch.cat([train_labels, generated["train"][1]])
    if generated is not None and len(generated.get("controls", no_frames())[0]):  # control_frames: all failures
        control_n = len(generated["controls"][0])
        train_frames = torch.cat([train_frames, generated["controls"][0]])
        train_labels = torch.cat([train_labels, generated["controls"][1]])
    import deepspeed
    from tqdm import tqdm

    from wmrl.config import WMTrainConfig
    from wmrl.device import pick_device
    from wmrl.worldmodel.model import images_to_unit
    from wmrl.worldmodel.train import ds_config, init_distributed

    pos, neg = torch.nonzero(train_labels).flatten(), torch.nonzero(~train_labels).flatten()
    if len(pos) == 0 or len(neg) == 0:
        raise ValueError(f"the reward model needs success and failure frames; the training episodes have {len(pos)} "
                         f"success and {len(neg)} other frames (include successful and failed episodes)")
    torch.manual_seed(cfg.seed)
    model = RewardModel(cfg)
    device = pick_device("auto")
    on_gpu = device.type == "cuda"
    # frames, indices and the augmentation's noise all on the training device: done on the
    # host, the per-step blur and noise of a 128 px batch cost more than the model's step
    g = torch.Generator(device=device).manual_seed(cfg.seed)
    frames, labels = train_frames.to(device), train_labels.to(device)
    pos, neg = pos.to(device), neg.to(device)
    pools = {"pos": (pos, *real_and_generated(pos, generated_from)), "neg": (neg, *real_and_generated(neg, generated_from))}
    tc = WMTrainConfig(steps=cfg.steps, micro_batch=cfg.batch, grad_accum=1, lr=cfg.lr, warmup=min(50, cfg.steps // 10))
    init_distributed(on_gpu)
    engine, *_ = deepspeed.initialize(model=RewardObjective(model), model_parameters=model.parameters(),
                                      config=ds_config(ds_config_path or (tc.ds_config_gpu if on_gpu else tc.ds_config_cpu),
                                                       tc, on_gpu, world=1))
    t0 = time.perf_counter()
    for _ in tqdm(range(cfg.steps), desc="reward model", disable=not progress):
        half = cfg.batch // 2
        idx = torch.cat([draw(*pools["pos"], half, cfg.generated_share, g), draw(*pools["neg"], cfg.batch - half,
                                                                                 cfg.generated_share, g)])
        x = random_shift(images_to_unit(frames[idx]), round(cfg.shift * frames.shape[1]), len(cfg.views), g)
        loss = engine(generated_style(x, cfg, g), labels[idx])
        engine.backward(loss)
        engine.step()
    model = engine.module.model.float().cpu().eval()

    def probs_of(frames: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return torch.cat([torch.sigmoid(model(images_to_unit(frames[i:i + 256])))
                              for i in range(0, len(frames), 256)]) if len(frames) else torch.zeros(0)

    def both_kinds(labels: torch.Tensor) -> bool:
        return len(labels) > 0 and bool(labels.any()) and bool((~labels).any())

    gen_val = generated["val"] if generated is not None else no_frames()
    real_probs, gen_probs = probs_of(val_frames), probs_of(gen_val[0])
    # calibrated where and as GRPO judges: success-once over generated episodes when they show
    # both outcomes, else single generated frames, else real ones
    cal = (gen_probs, gen_val[1], "generated") if both_kinds(gen_val[1]) else (real_probs, val_labels, "real")
    threshold, bal_acc, calibrated_on = (*calibrate(cal[0], cal[1]), cal[2]) if both_kinds(cal[1]) else (0.5, None, None)
    frame_threshold, episodes = threshold, None
    if len(gen_val[0]):
        peak, real = episode_outcomes(gen_probs, gen_val[1], gen_val[2])
        by_episode = calibrate_episodes(peak, real)
        if by_episode is not None:
            (threshold, bal_acc), calibrated_on = by_episode, "generated episodes"
        episodes = {"episodes": len(peak), "real_successes": int(real.sum()),
                    "imagined_successes": int((peak >= threshold).sum()),
                    "balanced_accuracy": balanced_accuracy(peak >= threshold, real),
                    "imagined_successes_at_frame_threshold": int((peak >= frame_threshold).sum())}
    model.threshold.fill_(threshold)
    real_episodes = None
    if val_episode is not None and len(val_frames):
        peak, real = episode_peaks(real_probs, val_labels, val_episode, val_outcomes)
        by_real = calibrate_episodes(peak, real)
        real_episodes = {"episodes": len(peak), "real_successes": int(real.sum()),
                         "threshold": by_real[0] if by_real else None, "balanced_accuracy": by_real[1] if by_real else None}

    def frame_accuracy(probs: torch.Tensor, labels: torch.Tensor) -> float | None:
        return balanced_accuracy(probs >= frame_threshold, labels) if len(probs) else None

    # single frames at the frame threshold: high on real frames and low on generated ones says
    # the world models, not the reward model, lose the success
    frames = {"real": frame_accuracy(real_probs, val_labels), "generated": frame_accuracy(gen_probs, gen_val[1])}
    meta = {"threshold": threshold, "calibrated_on": calibrated_on, "val_balanced_accuracy": bal_acc,
            "frame_threshold": frame_threshold, "val_frame_balanced_accuracy": frames,
            "val_generated_episodes": episodes, "val_real_episodes": real_episodes,
            "threshold_real": (real_episodes or {}).get("threshold"),
            "val_balanced_accuracy_real": balanced_accuracy(real_probs >= threshold, val_labels) if len(val_frames) else None,
            "val_balanced_accuracy_generated": balanced_accuracy(gen_probs >= threshold, gen_val[1]) if len(gen_val[0])
            else None, "val_frames": len(val_frames), "val_generated_frames": len(gen_val[0]),
            "train_frames": len(train_frames), "train_generated_frames": gen_train_n,
            "train_control_frames": control_n,
            "train_success_frames": int(len(pos)), "final_loss": float(loss.detach()),
            "wall_s": round(time.perf_counter() - t0, 1), **lineage}
    model.save_pretrained(out, meta=meta)
    warning = no_signal_warning(meta)
    if warning:
        print(f"[reward] warning: {warning}", flush=True)
    return meta


NO_SIGNAL_BELOW = 0.6  # episode balanced accuracy under which imagined rewards are close to coin flips


def no_signal_warning(meta: dict) -> str | None:
    """A sentence for people when the reward cannot tell imagined successes from failures on
    the validation episodes (GRPO in such a pair learns nothing), with the likely culprit."""
    episodes = meta.get("val_generated_episodes") or {}
    bal = episodes.get("balanced_accuracy")
    if bal is None or bal >= NO_SIGNAL_BELOW:
        return None
    frames = meta.get("val_frame_balanced_accuracy") or {}
    real, gen = frames.get("real"), frames.get("generated")
    fmt = lambda x: "n/a" if x is None else f"{x:.2f}"  # noqa: E731
    if real is None:
        culprit = "compare the reward's accuracy on real frames with the world models' fidelity to find the culprit"
    elif real >= 0.8:
        culprit = "the world models lose what success looks like: train them longer (more wm steps or --max-minutes)"
    else:
        culprit = "the reward model does not learn success even on real frames: train it longer (reward steps)"
    return (f"on the validation episodes' imagined rollouts the reward tells success from failure with balanced "
            f"accuracy {bal:.2f} (chance is 0.5; {episodes.get('real_successes')} real and "
            f"{episodes.get('imagined_successes')} imagined successes of {episodes.get('episodes')}), so GRPO in "
            f"this pair gets little or no signal. Single frames: {fmt(real)} real, {fmt(gen)} generated; {culprit}.")


