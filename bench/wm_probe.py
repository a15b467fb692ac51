"""How fast does a world model of a given size learn, per update and per GPU-second? One view,
a plain PyTorch loop (bf16 autocast on a GPU), several architectures one after the other on
the same data and the same time budget.

    python bench/wm_probe.py --manifest runs/x/manifest.json --view main --size 128 \
        --arch 64,128,256x2 --arch 32,64,128,256x1 --arch 32,64,128,256x1@0.3 --minutes 2 --batch 64 \
        --lr 2e-4 --json probe.json

``--arch [pP[+R]:]C1,C2,...xB[@N][/rS][~W][&H][^]``: optionally the pixel patch folded into channels before the
U-Net (``WorldModelConfig.patch``: ``p4:`` runs a 128 px frame at 32 x 32; ``p4+32:`` adds the
full-resolution head of ``WorldModelConfig.refine`` with 32 channels), the U-Net widths per
level, blocks per level, optionally the context-noise augmentation's largest std
(``WorldModelConfig.context_noise``) and ``/rS``: generate the change from the current frame
(``WorldModelConfig.residual``) with EDM's ``sigma_data`` S; the default profile's is ``p4+32:128,256,256x1``,
the earlier defaults ``32,64,128,256x1`` and ``64,128,256x2`` (the default profile's reads one past
chunk of actions too: ``p4+32:128,256,256x1&1``). Frames are
area-downsampled to ``--size`` (one 128 px collection serves several sizes). Each evaluation reports, on the held-out
episodes, PSNR and SSIM (grain that PSNR hardly sees shows in SSIM):

* one chunk ahead, teacher-forced (real context frames), against copying the last frame;
* open loop over 5 and 10 chunks with the real actions (the model's own frames and proprio as
  context; the wrist model sees the real main view), against holding the start frame: the
  figure ``wm_eval`` reports for a pair, here per view and per architecture;
* at the end, the action response (``fidelity.action_response``): one chunk ahead on the pixels
  that move, the real action chunk against another transition's: what the actions are worth.

``~W`` after an architecture (or ``--motion-weight W`` for all) trains it with
``WorldModelConfig.motion_weight``: the pixels that move weigh 1 + W in the loss. ``&N`` (or
``--action-history N``) gives it ``WorldModelConfig.action_history``: the N chunks of actions
before the current one. A final ``^``
(or ``--pose-maps``) turns on ``WorldModelConfig.pose_maps`` (main view): the end effector now
and after the chunk drawn as two input channels. A final ``%P`` (or ``--action-dropout P``) trains
with ``WorldModelConfig.action_dropout``; such a model is evaluated again at the end with action
guidance at each of ``--guidance`` (its action response too). ``--main-at-end`` (wrist view) trains
with ``WorldModelConfig.main_at_chunk_end``: the wrist model sees the main frame at the chunk's
end instead of its start; here the real one, so its open loop is an upper bound (imagination feeds
it the main model's frame). ``--wrist-warp`` (wrist view) trains with ``WorldModelConfig.wrist_warp``:
the current frame warped by the camera's motion over the chunk as three more input channels.

``--ema BETA`` also keeps an exponential moving average of the weights (the decay ramps up as
``(1 + n) / (10 + n)`` until it reaches BETA) and evaluates it beside the raw weights at every
evaluation: the same training run, read two ways.

``--final-steps 8,16`` evaluates the trained weights again with that many Euler steps (the
models sample with ``WorldModelConfig.sample_steps``, 3): is a blurred arm the sampler's or the
network's?

``--strips DIR`` writes, per architecture, real | imagined frames of the first held-out episodes
open loop (rows: chunks 0, 1, 2, 5, 10). For sweeping model size and learning rate before a long
DeepSpeed run; the numbers it prints are in bench/RESULTS.md where quoted.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

from wmrl.config import WorldModelConfig  # noqa: E402
from wmrl.ema import EMA  # noqa: E402
from wmrl.worldmodel.data import Transitions, load_split, proprio_stats  # noqa: E402
from wmrl.worldmodel.fidelity import action_response, psnr, ssim  # noqa: E402
from wmrl.worldmodel.model import FrameWorldModel, images_to_unit, own_actions, unit_to_images  # noqa: E402
from wmrl.worldmodel.train import own_context  # noqa: E402
from wm_throughput import flops_per_sample  # noqa: E402  (bench/, this script's folder)

H200_PEAK = 790e12  # dense bf16 FLOP/s: the MFU printed on a GPU is against this

OPEN_LOOP = (5, 10)
STRIP_CHUNKS = (0, 1, 2, 5, 10)


def shrink(episodes, size: int):
    for e in episodes:
        for v in ("main", "wrist"):
            if getattr(e, v).shape[1] == size:
                continue
            x = torch.from_numpy(getattr(e, v)).permute(0, 3, 1, 2).float()
            setattr(e, v, F.interpolate(x, size=size, mode="area").round().byte().permute(0, 2, 3, 1).numpy())
    return episodes


def parse_arch(text: str, a) -> dict:
    """``32,64,128,256x1``; with GameNGen's context-noise augmentation ``32,64,128,256x1@0.3``;
    on 4 x 4 pixel patches ``p4:128,256,256x1``, with a 32-channel full-resolution head
    ``p4+32:128,256,256x1``; generating the change from the current frame with sigma_data 0.13
    ``32,64,128,256x1/r0.13``; moving pixels weighing 10x in the loss ``p4+32:128,256,256x1~9``.
    Without ``@``: --context-noise; without ``~``: --motion-weight. A final ``=``: the wrist warp
    (``WorldModelConfig.wrist_warp``), for one arch what ``--wrist-warp`` is for all."""
    warp = text.endswith("=")
    text, _, drop = text.removesuffix("=").partition("%")
    pose = text.endswith("^")
    text, _, history = text.removesuffix("^").partition("&")
    patch, _, rest = text.rpartition(":")
    patch, _, refine = patch.partition("+")
    rest, _, motion = rest.partition("~")
    rest, _, res = rest.partition("/")
    arch, _, noise = rest.partition("@")
    widths, _, blocks = arch.partition("x")
    try:
        if (patch and not patch.startswith("p")) or (res and not res.startswith("r")):
            raise ValueError
        return {"channels": tuple(int(c) for c in widths.split(",")), "blocks_per_level": int(blocks or 1),
                "context_noise": float(noise or a.context_noise), "patch": int(patch[1:] or 1), "refine": int(refine or 0),
                "residual": bool(res), **({"sigma_data": float(res[1:])} if res else {}),
                "motion_weight": float(motion or a.motion_weight), "pose_maps": pose or a.pose_maps,
                "action_history": int(history or a.action_history),
                "action_dropout": float(drop or a.action_dropout), "wrist_warp": warp or a.wrist_warp}
    except ValueError:
        raise SystemExit(f"--arch {text!r}: write the patch (optional), widths, blocks per level, the context noise "
                         "and the residual's sigma_data (both optional), e.g. 32,64,128,256x1, 32,64,128,256x1@0.3, "
                         "p4:128,256,256x1, p4+32:128,256,256x1, 32,64,128,256x1/r0.13 or p4+32:128,256,256x1~9") from None


@torch.no_grad()
def open_loop(model, episodes, view: str, norm: dict, horizon: int, device, steps: int | None = None
              ) -> tuple[dict, torch.Tensor | None]:
    """PSNR and SSIM at each horizon of OPEN_LOOP, imagined vs real and held start frame vs
    real, over the episodes at least that long (all of them as one batch); and the real and
    imagined frames (2, episodes, horizon + 1, 3, H, W) for the strips."""
    eps = [e for e in episodes if len(e.actions) >= horizon]
    if not eps:
        return {}, None
    cfg = model.cfg
    real = torch.stack([images_to_unit(torch.from_numpy(getattr(e, view)[: horizon + 1])) for e in eps]).to(device)
    main = torch.stack([images_to_unit(torch.from_numpy(e.main[: horizon + 1])) for e in eps]).to(device)
    acts = torch.stack([torch.from_numpy(e.actions[:horizon]) for e in eps]).to(device)
    acts = torch.cat([acts.new_zeros(len(eps), cfg.action_history, *acts.shape[2:]), acts], 1)  # zeros before the start
    p = (torch.stack([torch.from_numpy(e.proprio[0]) for e in eps]).to(device) - norm["mean"]) / norm["std"]
    history = [real[:, 0]]
    g = torch.Generator(device=device).manual_seed(0)
    out = {}
    for t in range(horizon):
        ctx = history[-cfg.context:]
        ctx = [ctx[0]] * (cfg.context - len(ctx)) + ctx
        frames = torch.stack(ctx, 1)
        if cfg.condition_on_main:  # the real main view (a one-view probe), at the chunk's start or end
            frames = torch.cat([frames, main[:, t + int(cfg.main_at_chunk_end), None]], 1)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=real.is_cuda):
            x, p = model.generate(frames, acts[:, t:t + cfg.action_chunks].flatten(1, 2), p, steps=steps, generator=g)
        history.append(x.float())  # generate clamps to [-1, 1]
        if t + 1 in OPEN_LOOP:
            x, y, y0 = history[-1], real[:, t + 1], real[:, 0]
            out[t + 1] = {"episodes": len(eps), "psnr": float(psnr(x, y).mean()), "static": float(psnr(y0, y).mean()),
                          "ssim": float(ssim(x, y).mean()), "static_ssim": float(ssim(y0, y).mean())}
    return out, torch.stack([real, torch.stack(history, 1)])


def evaluate(model, held: dict, val_eps, view: str, norm: dict, device, steps: int | None = None
             ) -> tuple[dict, torch.Tensor | None]:
    """One chunk ahead and open loop on the held-out episodes, with ``steps`` Euler steps
    (None: the model's ``sample_steps``)."""
    model.eval()
    g = torch.Generator(device=device).manual_seed(0)
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16, enabled=held["target"].is_cuda):
        x, _ = model.generate(held["frames"], own_actions(model.cfg, held["actions"]), held["proprio"], steps=steps, generator=g)
    x = x.float()
    ol, frames = open_loop(model, val_eps, view, norm, max(OPEN_LOOP), device, steps)
    model.train()
    return {"one_chunk": float(psnr(x, held["target"]).mean()), "one_chunk_ssim": float(ssim(x, held["target"]).mean()),
            "open_loop": ol}, frames


def scores_text(scores: dict) -> str:
    """``evaluate``'s scores in one line: one chunk ahead, then each open-loop horizon."""
    return (f"one chunk {scores['one_chunk']:.2f} dB / SSIM {scores['one_chunk_ssim']:.3f}; open loop "
            + "; ".join(f"{k} chunks {v['psnr']:.2f} / {v['ssim']:.3f}" for k, v in scores["open_loop"].items()))


def write_strip(frames: torch.Tensor, path: Path, episodes: int = 3) -> None:
    """Real | imagined columns for the first ``episodes`` held-out episodes, a row per chunk of
    STRIP_CHUNKS: grain, blur and a frozen arm are easier to see than to read off a number."""
    import imageio.v3 as iio

    real, imagined = frames[0, :episodes], frames[1, :episodes]
    rows = [torch.cat([torch.cat([real[e, t], imagined[e, t]], dim=2) for e in range(real.shape[0])], dim=2)
            for t in STRIP_CHUNKS if t < real.shape[1]]
    image = unit_to_images(torch.cat(rows, dim=1)[None].cpu())[0]
    path.parent.mkdir(parents=True, exist_ok=True)
    iio.imwrite(path, image.numpy())


@torch.no_grad()
def generation_rate(model, held: dict, batch: int, device, repeats: int = 5) -> float:
    """Frames per second this one view generates (``sample_steps`` Euler steps each), ``batch``
    at once, bf16 on a GPU: the imagination side of an architecture's cost."""
    idx = torch.arange(batch, device=device) % held["target"].shape[0]
    args = (held["frames"][idx], own_actions(model.cfg, held["actions"][idx]), held["proprio"][idx])
    model.eval()
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=device == "cuda"):
        model.generate(*args)  # warm-up (cuDNN picks its kernels)
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(repeats):
            model.generate(*args)
        if device == "cuda":
            torch.cuda.synchronize()
    model.train()
    return batch * repeats / (time.perf_counter() - t0)


def held_batch(va: Transitions, view: str, norm: dict, device, context: int, main_at_end: bool = False) -> dict:
    """Every held-out transition as one batch, with copy-last's PSNR and SSIM (the baseline one
    chunk ahead)."""
    main = ("end" if main_at_end else "start") if view == "wrist" else None
    held = va.batch(torch.arange(va.size, device=device), view, main, norm)
    held["copy_last"] = float(psnr(held["frames"][:, context - 1], held["target"]).mean())
    held["copy_last_ssim"] = float(ssim(held["frames"][:, context - 1], held["target"]).mean())
    return held


def probe(arch, tr, va, val_eps, norm, held, a) -> tuple[dict, FrameWorldModel]:
    """Train one architecture on ``tr`` within the step / time budget, evaluating on the way;
    returns its curve and the trained model."""
    torch.manual_seed(a.seed)
    cfg = WorldModelConfig(view=a.view, image_size=a.size, cond_dim=a.cond_dim, condition_on_main=a.view == "wrist",
                           main_at_chunk_end=a.main_at_end, proprio_motion=a.proprio_motion,
                           context=a.context, **arch)
    channels, blocks, noise, patch = cfg.channels, cfg.blocks_per_level, cfg.context_noise, cfg.patch
    model = FrameWorldModel(cfg).to(a.device)
    model.set_proprio_stats(norm)  # for the action response, which reads them from the model
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=1e-2)
    ema = EMA(model, a.ema) if a.ema else None
    prefix = f"p{patch}" + (f"+{cfg.refine}" if cfg.refine else "") + ":" if patch > 1 or cfg.refine else ""
    name = prefix + f"{','.join(map(str, channels))}x{blocks}" + (f"@{noise}" if noise else "") \
        + (f"/r{cfg.sigma_data}" if cfg.residual else "") + (f"~{cfg.motion_weight:g}" if cfg.motion_weight else "") \
        + (f"&{cfg.action_history}" if cfg.action_history else "") + ("^" if cfg.pose_maps else "") \
        + (f"%{cfg.action_dropout:g}" if cfg.action_dropout else "") + (">" if cfg.main_at_chunk_end else "") \
        + ("=" if cfg.wrist_warp else "")
    flops = flops_per_sample(model, cfg, a.device)
    print(f"== {name}: {sum(p.numel() for p in model.parameters()):,} parameters, {flops / 1e9:.1f} GFLOP per training "
          "sample (forward + backward)", flush=True)
    curve, trained, step, frames = [], 0.0, 0, None
    budget = a.minutes * 60 if a.minutes else float("inf")
    next_eval = a.eval_every
    while step < a.steps and trained < budget:
        if a.device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        idx = torch.randint(0, tr.size, (a.batch,), device=a.device)
        b = tr.batch(idx, a.view, cfg.main_condition, norm)
        if a.self_context:  # WMTrainConfig.self_context
            b = own_context(model, tr, idx, b, a.self_context, a.view, norm)
        step += 1
        # linear warm-up, then constant or (--schedule cosine, the kit's WarmupCosineLR) a cosine
        # decay over the budget: by updates, or by training time when --minutes bounds the run
        done = trained / budget if a.minutes else step / a.steps
        decay = 0.5 * (1 + math.cos(math.pi * min(1.0, done))) if a.schedule == "cosine" else 1.0
        for group in opt.param_groups:
            group["lr"] = a.lr * min(1.0, step / 100) * decay
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=a.device == "cuda"):
            loss, _ = model.loss(**{**b, "actions": own_actions(model.cfg, b["actions"])})
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if ema:
            ema.update(model, min(a.ema, (1 + step) / (10 + step)))
        if a.device == "cuda":
            torch.cuda.synchronize()
        trained += time.perf_counter() - t0
        last = step >= a.steps or trained >= budget
        if step >= next_eval or last:
            next_eval += a.eval_every
            rate = step * a.batch / trained
            r = {"update": step, "train_s": round(trained, 1), "samples_per_s": round(rate, 1),
                 **({"mfu_h200": round(rate * flops / H200_PEAK, 4)} if a.device == "cuda" else {}),
                 "loss": round(loss.item(), 4)}
            scores, frames = evaluate(model, held, val_eps, a.view, norm, a.device)
            if ema:
                r["ema"], _ = evaluate(ema.net, held, val_eps, a.view, norm, a.device)
            curve.append(r | scores)
            ol = "; ".join(f"{k} chunks {v['psnr']:.2f} / {v['ssim']:.3f} (held {v['static']:.2f} / {v['static_ssim']:.3f})"
                           for k, v in scores["open_loop"].items())
            print(f"update {step}: loss {r['loss']:.4f}, one chunk {scores['one_chunk']:.2f} dB / SSIM "
                  f"{scores['one_chunk_ssim']:.3f} (copy-last {held['copy_last']:.2f} / {held['copy_last_ssim']:.3f}); "
                  f"open loop {ol}; {r['samples_per_s']} samples/s, {trained:.0f} s", flush=True)
            if ema:
                e = r["ema"]
                print(f"  EMA weights: {scores_text(e)}", flush=True)
    model.eval()
    response = action_response(model, val_eps, seed=0, device=a.device)
    model.train()
    if ema and response:
        response["ema"] = action_response(ema.net, val_eps, seed=0, device=a.device)
    if response:
        m = response["psnr_moving"]
        print(f"action response, one chunk ahead on the {response['moving_fraction']:.1%} of pixels that move: "
              f"{m['true']:.2f} dB with the real chunk, {m['other']:.2f} with another's (held {m['held']:.2f}): "
              f"the actions are worth {m['gain_db']:+.2f} dB", flush=True)
        if response.get("ema"):
            print(f"  EMA weights: the actions are worth {response['ema']['psnr_moving']['gain_db']:+.2f} dB", flush=True)
    by_steps = {}
    for n in a.final_steps:  # the trained weights read with more (or fewer) sampling steps
        by_steps[n], more = evaluate(model, held, val_eps, a.view, norm, a.device, steps=n)
        print(f"  {n} Euler steps: {scores_text(by_steps[n])}", flush=True)
        if a.strips and more is not None:
            write_strip(more, Path(a.strips) / f"{name.replace(':', '_').replace('/', '_')}_{n}steps.png")
    if a.strips and frames is not None:
        write_strip(frames, Path(a.strips) / f"{name.replace(':', '_').replace('/', '_')}.png")
    by_guidance = {}
    for w in a.guidance if cfg.action_dropout else []:  # the same weights sampled with action guidance w
        model.guidance = w
        by_guidance[w], _ = evaluate(model, held, val_eps, a.view, norm, a.device)
        model.eval()
        by_guidance[w]["action_response"] = action_response(model, val_eps, seed=0, device=a.device)
        model.train()
        r = by_guidance[w]
        print(f"  guidance {w:g}: {scores_text(r)}"
              + (f"; the actions are worth {r['action_response']['psnr_moving']['gain_db']:+.2f} dB on moving pixels"
                 if r["action_response"] else ""), flush=True)
    model.guidance = 1.0
    gen_batch = 256 if a.device == "cuda" else 16
    rate = generation_rate(model, held, gen_batch, a.device)
    print(f"generation: {rate:,.0f} frames/s ({gen_batch} at once, {cfg.sample_steps} Euler steps)", flush=True)
    return {"arch": name, "parameters": sum(p.numel() for p in model.parameters()), "gflop_per_sample": flops / 1e9,
            "frames_per_s": round(rate, 1), "generation_batch": gen_batch, "action_response": response, "curve": curve,
            "by_sample_steps": by_steps, "by_guidance": by_guidance}, model


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--manifest", required=True)
    p.add_argument("--view", choices=["main", "wrist"], default="wrist")
    p.add_argument("--size", type=int, default=64)
    p.add_argument("--arch", action="append",
                   help="[pP[+R]:]widths,...xblocks[@context_noise][/r<sigma_data>][~motion_weight][&history][^] "
                        "(repeat to compare); default 32,64,128x1")
    p.add_argument("--cond-dim", type=int, default=256)
    p.add_argument("--context", type=int, default=2, help="WorldModelConfig.context: frames of history, one chunk apart")
    p.add_argument("--context-noise", type=float, default=0.0,
                   help="WorldModelConfig.context_noise of an --arch without @ (0: off)")
    p.add_argument("--motion-weight", type=float, default=0.0,
                   help="WorldModelConfig.motion_weight: extra loss weight of the pixels that move (0: off)")
    p.add_argument("--pose-maps", action="store_true",
                   help="WorldModelConfig.pose_maps for every --arch (main view; or '^' after one --arch)")
    p.add_argument("--main-at-end", action="store_true",
                   help="WorldModelConfig.main_at_chunk_end for every --arch (wrist view; its name ends in '>'): the "
                        "main frame of the chunk's end as input, here the real one (imagination gives the main model's)")
    p.add_argument("--proprio-motion", action=argparse.BooleanOptionalAction, default=True,
                   help="WorldModelConfig.proprio_motion (the profiles' default, on): the proprio head predicts the "
                        "chunk's motion")
    p.add_argument("--wrist-warp", action="store_true",
                   help="WorldModelConfig.wrist_warp for every --arch (wrist view; its name ends in '='): its frame warped "
                        "by the camera's motion over the chunk (to the proprio head's end pose) as input")
    p.add_argument("--action-history", type=int, default=0,
                   help="WorldModelConfig.action_history of an --arch without &N: past chunks of actions it reads")
    p.add_argument("--action-dropout", type=float, default=0.0,
                   help="WorldModelConfig.action_dropout for every --arch (one arch: a final %%P, e.g. 64,128x1%%0.1)")
    p.add_argument("--guidance", type=lambda t: [float(x) for x in t.split(",") if x], default=[2.0, 4.0],
                   help="after training, models with action dropout are evaluated again at these action guidance "
                        "scales (WorldModelConfig.action_guidance; 1: none)")
    p.add_argument("--steps", type=int, default=500, help="updates per architecture (at most)")
    p.add_argument("--minutes", type=float, help="training time per architecture (at most; evaluations not counted)")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--seed", type=int, default=0, help="initial weights and batch order")
    p.add_argument("--final-steps", type=lambda t: [int(x) for x in t.split(",") if x], default=[],
                   help="after training, evaluate again with these numbers of Euler steps (e.g. 8,16; the model's own: "
                        "WorldModelConfig.sample_steps)")
    p.add_argument("--ema", type=float, default=0.0,
                   help="also evaluate an exponential moving average of the weights with this decay (e.g. 0.999; 0: off)")
    p.add_argument("--schedule", choices=["constant", "cosine"], default="constant",
                   help="lr after the warm-up: constant, or a cosine decay to 0 over the budget (the kit's)")
    p.add_argument("--self-context", type=float, default=0.0,
                   help="fraction of each batch trained on the model's own one-chunk prediction as context "
                        "(WMTrainConfig.self_context)")
    p.add_argument("--all-phases", action="store_true",
                   help="train on every chunk-boundary phase of every-step recordings (WMTrainConfig.all_phases)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--json", help="also write every curve here")
    p.add_argument("--strips", help="folder for a real | imagined PNG per architecture (open loop, held-out episodes)")
    p.add_argument("--save", help="folder for each trained model (FrameWorldModel format, one subfolder per "
                   "architecture): a teacher that `wm_distill.py` can read through a run's selection")
    a = p.parse_args()
    archs = [parse_arch(s, a) for s in (a.arch or ["32,64,128x1"])]
    _, train, val = load_split(a.manifest, 8, phases=a.all_phases)
    if not val:
        sys.exit(f"{a.manifest} has no validation episodes: build it with --val-ratio > 0")
    train, val = shrink(train, a.size), shrink(val, a.size)
    history = max(arch["action_history"] for arch in archs)  # each model reads the tail it needs (own_actions)
    tr, va = Transitions(train, a.context, a.device, history), Transitions(val, a.context, a.device, history)
    norm = {k: v.to(a.device) for k, v in proprio_stats(tr).items()}
    held = held_batch(va, a.view, norm, a.device, a.context, a.main_at_end)
    print(f"{tr.size} training / {va.size} held-out transitions ({len(val)} episodes), {a.view} view, {a.size} px, "
          f"batch {a.batch}, lr {a.lr}, {a.device}", flush=True)
    results = []
    for arch in archs:
        result, model = probe(arch, tr, va, val, norm, held, a)
        results.append(result)
        if a.save:
            folder = Path(a.save) / result["arch"].replace(":", "_").replace("/", "_")
            model.save_pretrained(folder, meta={"probe": {k: v for k, v in vars(a).items() if k != "arch"},
                                                "updates": result["curve"][-1]["update"] if result["curve"] else 0})
            print(f"saved {folder}", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps({"args": vars(a), "copy_last": held["copy_last"],
                                            "copy_last_ssim": held["copy_last_ssim"], "results": results}, indent=2))


if __name__ == "__main__":
    main()
