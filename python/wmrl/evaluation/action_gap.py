"""Does the policy act on imagined frames as it acts on the real ones?

GRPO in imagination lets the policy act on the pair's frames. Where those frames differ from the
real ones in what the policy reads (the gripper, the object, the arm), it acts otherwise than it
would in the simulator from the same state, and a rollout that would succeed there fails in the
pair: on an H100 the supervised policy succeeded in 25% of its imagined rollouts from the first
keyframes of episodes it had recorded at 63% real (bench/RESULTS.md, "GRPO in a pair that passes
the gate"). ``make wm-eval``'s agreement cannot see this: it replays recorded actions.

This measures it without a simulator. Held-out real episodes are imagined open loop with their
recorded actions (``fidelity.open_loop``); at 1, 5, 10 and 20 chunks the policy is asked for its
action chunk three times with the same sampler noise:

* on the **real** frames and proprio at that boundary (what it does in the simulator);
* on the **imagined** ones (what it does in the pair, on the way the pair drew that moment);
* on the **held** start (frames and proprio of chunk 0: "nothing moved", the bar that PSNR's
  ``*_static`` is for frames);

and, to say which world model costs the most, on the real inputs with one part imagined: the
main view only, the wrist view only, the proprio only.

Per horizon: the mean distance between the policy's actions on each kind of input and on the real
ones (per control step, in the controller's units), the ratio of the imagined to the held start's
(below 1: the imagined frames tell the policy where it is better than the start frame does; near
1: the policy learns nothing from them), and how often the gripper command has the same sign.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch

from wmrl.worldmodel.fidelity import HORIZONS, eef_distance_mm, real_frames

# per kind of input, where each part of the observation comes from (the held start: the real chunk 0)
INPUTS = {"real": {}, "imagined": {"main": "imagined", "wrist": "imagined", "proprio": "imagined"},
          "held": {}, "imagined_main": {"main": "imagined"}, "imagined_wrist": {"wrist": "imagined"},
          "imagined_proprio": {"proprio": "imagined"}}


def observations(roll: dict, episodes: list, rows: list[int], t: int, inputs: str, chunk_size: int) -> list:
    """The policy's observations at boundary ``t`` of episodes ``rows``, each part (main, wrist,
    proprio) real or imagined as ``INPUTS[inputs]`` says; "held": the real start's. ``step`` and
    ``state`` are the same for every kind of input, so the policy draws the same noise for all."""
    from wmrl.worldmodel.model import unit_to_images

    at = 0 if inputs == "held" else t
    src = lambda part: INPUTS[inputs].get(part, "real")  # noqa: E731
    image = lambda view, i: unit_to_images(roll[src(view)][view][i, at][None].float())[0].cpu().numpy()  # noqa: E731
    return [SimpleNamespace(main=image("main", i), wrist=image("wrist", i),
                            proprio=roll["proprio"][src("proprio")][i, at].cpu().numpy(),
                            instruction=episodes[i].instruction, task_index=episodes[i].task, step=t * chunk_size,
                            state=np.asarray([i], np.float64))
            for i in rows]


def action_gap(roll: dict, episodes: list, runner, chunk_size: int, horizons=HORIZONS) -> dict:
    """Per horizon (chunks after the start, where episodes are still running): the distance of
    the policy's actions on imagined and on held inputs from its actions on the real ones.
    ``roll``: ``fidelity.open_loop`` of ``episodes``; ``runner``: a chunk policy (``PolicyRunner``)."""
    out: dict = {"episodes": len(episodes), "policy_id": getattr(runner, "policy_id", "policy"), "horizons": {}}
    for h in horizons:
        if h > roll["steps"]:
            continue
        rows = torch.nonzero(roll["valid"][:, h]).flatten().tolist()
        if not rows:
            continue
        acts = {k: np.asarray(runner.act_batch(observations(roll, episodes, rows, h, k, chunk_size))) for k in INPUTS}
        dist = {k: float(np.linalg.norm(acts[k] - acts["real"], axis=-1).mean()) for k in INPUTS if k != "real"}
        grip = lambda k: float((np.sign(acts[k][..., -1]) == np.sign(acts["real"][..., -1])).mean())  # noqa: E731
        out["horizons"][str(h)] = {
            "episodes": len(rows), **{f"action_gap_{k}": round(d, 4) for k, d in dist.items()},
            # where the imagined proprio puts the end effector (bench/view_sensitivity.py --view proprio
            # says what such an error costs the policy)
            "eef_error_mm_imagined": round(float(eef_distance_mm(roll["proprio"]["imagined"][rows, h],
                                                                 roll["proprio"]["real"][rows, h]).mean()), 2),
            "ratio": round(dist["imagined"] / dist["held"], 3) if dist["held"] > 0 else None,
            "gripper_agrees_imagined": round(grip("imagined"), 3), "gripper_agrees_held": round(grip("held"), 3)}
    return out


def table(result: dict) -> str:
    """The result as a Markdown table, one row per horizon."""
    lines = ["| chunks ahead | episodes | action gap: imagined | held start | ratio | main only | wrist only | "
             "proprio only | gripper agrees, imagined / held |", "|---" * 9 + "|"]
    for h, r in result["horizons"].items():
        lines.append(f"| {h} | {r['episodes']} | {r['action_gap_imagined']} | {r['action_gap_held']} | {r['ratio']} | "
                     f"{r['action_gap_imagined_main']} | {r['action_gap_imagined_wrist']} | "
                     f"{r['action_gap_imagined_proprio']} | "
                     f"{r['gripper_agrees_imagined']:.0%} / {r['gripper_agrees_held']:.0%} |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# What kind of error in a view moves the policy? The real frames with one known corruption in
# place of the imagined ones: a blur (a few-step sampler's soft frames), pixel noise, a shift
# (the camera a little off where the arm really is), the frame one chunk late (the arm's motion
# missed), a ghost of two moments. Each is placed by its PSNR against the real frame, beside
# the world model's own (bench/view_sensitivity.py).

def _blur(x: torch.Tensor, sigma: float) -> torch.Tensor:
    """Separable Gaussian blur of (N, 3, H, W), edges replicated."""
    r = max(1, int(3 * sigma + 0.5))
    k = torch.exp(-torch.arange(-r, r + 1, dtype=x.dtype) ** 2 / (2 * sigma**2))
    k = (k / k.sum()).to(x.device)
    c = x.shape[1]
    x = torch.nn.functional.pad(x, (r, r, r, r), mode="replicate")
    x = torch.nn.functional.conv2d(x, k.view(1, 1, 1, -1).expand(c, 1, 1, -1), groups=c)
    return torch.nn.functional.conv2d(x, k.view(1, 1, -1, 1).expand(c, 1, -1, 1), groups=c)


def _shift(x: torch.Tensor, pixels: int) -> torch.Tensor:
    """The image moved ``pixels`` right and down, the uncovered edge replicated."""
    h, w = x.shape[-2:]
    x = torch.nn.functional.pad(x, (pixels, 0, pixels, 0), mode="replicate")
    return x[..., :h, :w]


def perturb(x: torch.Tensor, how: str, seed: int = 0, images: bool = True,
            proprio: torch.Tensor | None = None) -> torch.Tensor:
    """(E, T, ...) inputs corrupted as ``how`` says: ``blur:S`` (Gaussian, sigma S pixels),
    ``noise:S`` (Gaussian, std S in the inputs' units: [-1, 1] for frames), ``shift:P`` (P pixels
    right and down), ``late:K`` (the input K chunks earlier; the first ones stay), ``blend:W`` (W of
    the input one chunk earlier over 1 - W of this one: the ghost a model unsure of the motion
    draws), ``warp:K`` (wrist frames only: the frame K chunks earlier, warped by the camera's
    motion since then onto the table plane, ``camera.wrist_warp``; needs the real ``proprio``
    (E, T, P)), ``none``; several joined by ``+`` apply left to right (``late:1+blur:2``).
    ``images``: (E, T, 3, H, W) frames in [-1, 1] (kept in range); else any (E, T, ...), where
    blur and shift mean nothing."""
    if "+" in how:
        for part in how.split("+"):
            x = perturb(x, part, seed, images, proprio)
        return x
    kind, _, arg = how.partition(":")
    if kind == "none":
        return x
    if kind == "turn":
        raise ValueError(f"{how!r}: turn:DEG turns the proprio's orientation (view_sensitivity --view proprio)")
    if kind == "warp":
        if not images or proprio is None:
            raise ValueError(f"{how!r}: warp is for the wrist view (it reads the proprio to move the camera)")
        from wmrl.worldmodel.camera import wrist_warp

        k = int(arg)
        before = perturb(proprio, f"late:{k}", images=False)
        return wrist_warp(perturb(x, f"late:{k}").flatten(0, 1), before.flatten(0, 1),
                          proprio.flatten(0, 1)).view(x.shape).clamp(-1, 1).to(x.dtype)
    if kind == "late":
        k = int(arg)
        return torch.cat([x[:, :1].expand(-1, k, *x.shape[2:]), x[:, :-k]], dim=1)[:, :x.shape[1]]
    if kind == "blend":
        w = float(arg)
        return ((1 - w) * x.float() + w * perturb(x, "late:1").float()).to(x.dtype)
    if kind == "noise":
        out = x.float() + float(arg) * torch.randn(x.shape, generator=torch.Generator().manual_seed(seed))
    elif kind in ("blur", "shift") and images:
        flat = x.flatten(0, 1).float()
        out = (_blur(flat, float(arg)) if kind == "blur" else _shift(flat, int(arg))).view(x.shape)
    elif kind in ("blur", "shift"):
        raise ValueError(f"{how!r}: blur and shift are for camera views; the proprio takes noise:S, late:K, blend:W")
    else:
        raise ValueError(f"unknown corruption {how!r}: blur:S, noise:S, shift:P, late:K, blend:W, warp:K, turn:DEG "
                         "(proprio) or none, joined by +")
    return (out.clamp(-1, 1) if images else out).to(x.dtype)


def real_roll(episodes: list, horizon: int) -> dict:
    """``fidelity.open_loop``'s layout with no world model: the real frames and proprio, and as
    "imagined" the same (``perturbed`` then corrupts one view)."""
    steps = min(horizon, max(len(ep.actions) for ep in episodes))
    real, proprio = real_frames(episodes, steps)
    lengths = torch.tensor([len(ep.actions) for ep in episodes])
    valid = torch.arange(steps + 1)[None, :] <= lengths[:, None]
    return {"real": real, "imagined": dict(real), "proprio": {"real": proprio, "imagined": proprio},
            "valid": valid, "steps": steps}


def perturbed(roll: dict, part: str, how: str, seed: int = 0) -> dict:
    """``roll`` whose imagined ``part`` (main, wrist or proprio) is its real one corrupted
    (``perturb``); every other part real. The proprio's noise is in units of each dimension's
    spread over the episodes (its std at their boundaries), so one S means as much for every dimension;
    ``turn:DEG`` turns its orientation (``turned``)."""
    real_p = roll["proprio"]["real"]
    if part != "proprio":
        frames = perturb(roll["real"][part], how, seed, proprio=real_p if part == "wrist" else None)
        return {**roll, "imagined": {**roll["real"], part: frames},
                "proprio": {**roll["proprio"], "imagined": real_p}}
    rows = real_p[roll["valid"]]
    mean, std = rows.mean(0), rows.std(0).clamp_min(1e-6)
    own = real_p
    for part_how in how.split("+"):  # left to right; a turn in the raw orientation, the rest in spread units
        if part_how.startswith("turn:"):
            own = turned(own, float(part_how[5:]), seed)
        else:
            own = perturb((own - mean) / std, part_how, seed, images=False) * std + mean
    return {**roll, "imagined": dict(roll["real"]), "proprio": {**roll["proprio"], "imagined": own}}


def turned(proprio: torch.Tensor, degrees: float, seed: int = 0) -> torch.Tensor:
    """(..., 8) LIBERO proprio with each orientation turned by ``degrees`` about its own random
    axis (seeded), written as the proprio writes it: what a world model's orientation error of
    that size shows the policy (bench/view_sensitivity.py --view proprio --corruptions turn:15)."""
    from wmrl.worldmodel.rotation import turn

    g = torch.Generator().manual_seed(seed)
    axis = torch.randn(*proprio.shape[:-1], 3, generator=g)
    delta = axis / axis.norm(dim=-1, keepdim=True) * torch.deg2rad(torch.tensor(degrees))
    flat = proprio.reshape(-1, proprio.shape[-1]).float()
    out = torch.cat([flat[:, :3], turn(flat[:, 3:6], delta.reshape(-1, 3)), flat[:, 6:]], dim=1)
    return out.view(proprio.shape).to(proprio.dtype)


def psnr(a: torch.Tensor, b: torch.Tensor, valid: torch.Tensor) -> float:
    """Mean PSNR (dB, images in [0, 1]) of (E, T, 3, H, W) frames at the ``valid`` (E, T) boundaries
    after the first (the first is where every rollout starts); identical frames read 100."""
    mse = (((a.float() - b.float()) / 2) ** 2).mean(dim=(2, 3, 4))[:, 1:][valid[:, 1:]]
    return float((10 * torch.log10(1 / mse.clamp_min(1e-10))).mean())


def eef_error_mm(a: torch.Tensor, b: torch.Tensor, valid: torch.Tensor) -> float:
    """Mean distance (mm) between the end-effector positions (the proprio's first three values, in
    metres) of (E, T, P) proprio at the ``valid`` boundaries after the first."""
    return float(eef_distance_mm(a, b)[:, 1:][valid[:, 1:]].mean())
