"""Few-step students of the world models: ``python python/wm_distill.py --run RUN``.

Imagination spends its time in the world models' samplers: ``sample_steps`` (3) network calls
per frame and per view. A student makes the frame in fewer calls (``student_steps``, 1): for a
noise draw, the teacher's Euler sample is the target of the student's sample from the same draw
(Luhman & Luhman 2021, knowledge distillation of an iterative sampler). The student starts as a
copy of the teacher; real training transitions condition both (the wrist model sees the real
main view, as in its training). The loss is the mean squared error of the two frames in
[-1, 1]. The proprio head is the teacher's, unchanged.

With ``self_forcing_steps`` > 0 the student then goes through the four-stage recipe's Stage 3
(SF-DMD, Self Forcing with DMD2's loss; ``wmrl.bimanual.distill`` does the same for the
bimanual model). The sampler distillation above only ever conditions on real frames, while
imagination feeds the model its own: here every rollout starts from a real transition and the
student generates ``rollout_chunks`` chunks, each on the frames it generated before (self
forcing; real actions and proprio; the wrist model starts each chunk on the main teacher's own
frame, imagined beside it as in imagination: ``main_teacher``). Its last frame is
noised to a random level and denoised by the frozen teacher (the real score, with the teacher's
action guidance) and by a critic (the fake score: a copy of the teacher that keeps learning,
with the EDM loss, the student's own rollouts); the student's frame moves along the difference
of the two, normalised by its distance to the teacher's estimate. Of every ``student_every``
iterations one updates the student and the rest the critic, each with its own optimizer; the
first ``critic_warmup`` iterations update the critic alone.

Read top to bottom: ``load_teachers`` checks the inputs, ``distill_view`` is the loop for one
view (resumed from ``state.pt`` if there is one), ``self_forcing`` its Stage 3 (``rollout``,
``dmd_loss``), ``compare`` measures student against teacher on held-out transitions one chunk
ahead and over a rollout, ``main`` runs both views and writes the selection.

Files, ``V`` = main or wrist:

* ``RUN/worldmodels/V_student/global_step_N/``  inference weights (``FrameWorldModel`` format; its
  config says ``sample_steps = student_steps``; the meta names the teacher and its hash);
* ``RUN/worldmodels/V_student/state.pt``        optimizer and step, in Stage 3 the critic and its
  optimizer too (each step's batch and noise come from generators seeded by the step, so a
  rerun continues bit for bit);
* ``RUN/worldmodels/V_student/report.json``     student vs teacher on held-out transitions;
* ``RUN/train/selected_students.json``          both students (``make wm-reward STUDENTS=1`` trains their reward,
  ``make package STUDENTS=1`` packs them);
* ``RUN/logs/wm_distill_V.jsonl``               loss per update.

One process, plain PyTorch (bf16 autocast on a GPU): a student is fine-tuned for a few hundred
updates, not trained, so the DeepSpeed machinery of ``wm_update`` buys nothing here.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from wmrl.config import VIEWS, ConfigError, DistillConfig
from wmrl.fileio import atomic_path, read_json, write_json
from wmrl.layout import RunLayout, step_name

STATE_FILE = "state.pt"


class DistillError(ConfigError):
    """Bad input to a distillation: said before any update."""


@dataclass
class DistillJob:
    run: Path
    cfg: DistillConfig
    views: tuple[str, ...] = VIEWS
    device: str = "auto"
    progress: bool = True


def load_teachers(job: DistillJob) -> dict[str, dict]:
    """The update's selected model of each view (config read, hashes checked when loaded),
    refused when its sampler is already as short as the student's."""
    from wmrl.worldmodel.model import FrameWorldModel

    layout = RunLayout(job.run)
    sel = read_json(layout.selection, DistillError, f"update the world models first (make wm-update RUN={job.run})")
    if not layout.manifest.is_file():
        raise DistillError(f"{layout.manifest} not found: the students learn on the update's data (make manifest)")
    teachers = {}
    for view in job.views:
        path = Path(sel[view]["weights"])
        cfg, meta = FrameWorldModel.read_config(path)
        if cfg.sample_steps <= job.cfg.student_steps:
            raise DistillError(f"the {view} model samples in {cfg.sample_steps} step(s), the student would take "
                               f"{job.cfg.student_steps}: nothing to distil (lower --student-steps)")
        teachers[view] = {"weights": path, "cfg": cfg, "config_sha256": meta.get("config_sha256", "")}
    return teachers


def _autocast(device: torch.device):
    return torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda")


def _draw(cfg: DistillConfig, step: int, view_index: int, n: int, shape: tuple[int, ...]):
    """Step ``step``'s transitions and noise: a function of the seed and the step only."""
    g = torch.Generator().manual_seed((cfg.seed * 1_000_003 + step) * len(VIEWS) + view_index)
    return torch.randint(n, (cfg.batch,), generator=g), torch.randn((cfg.batch, *shape), generator=g)


def distill_view(job: DistillJob, view: str, teacher_info: dict, train, device,
                 main_model=None) -> tuple[dict, object, object]:
    """Distil one view to ``job.cfg.steps`` updates; returns the selection entry, the student
    and the teacher. ``main_model``: what a wrist rollout's main frames come from (``main_teacher``)."""
    from tqdm import tqdm

    from wmrl.logs import MetricsLog
    from wmrl.worldmodel.model import FrameWorldModel

    cfg, layout = job.cfg, RunLayout(job.run)
    out = layout.wm_student(view)
    teacher = FrameWorldModel.from_pretrained(teacher_info["weights"], device).requires_grad_(False)
    # the student learns the teacher's guided sample in its own few calls: it needs no guidance of its own
    student_cfg = dataclasses.replace(teacher.cfg, sample_steps=cfg.student_steps, action_guidance=1.0)
    step, state = 0, None
    if (out / STATE_FILE).exists():
        state = torch.load(out / STATE_FILE, map_location="cpu", weights_only=True)
        if state["teacher_sha256"] != teacher_info["config_sha256"]:
            raise DistillError(f"{out} was distilled from another {view} model than the update's selection now names; "
                               f"remove {out} to distil this one")
        student = FrameWorldModel.from_pretrained(out / state["weights"], device)
        step = int(state["step"])
    else:
        student = FrameWorldModel(student_cfg).to(device)
        student.load_state_dict(teacher.state_dict())
    student.train()
    head = set(student.proprio_head.parameters())  # the teacher's proprio head stays as it is
    opt = torch.optim.AdamW([p for p in student.parameters() if p not in head], lr=cfg.lr, weight_decay=0.0)
    if state is not None:
        opt.load_state_dict(state["optimizer"])
    log = MetricsLog(layout.logs / f"wm_distill_{view}.jsonl", tag=f"distill_{view}", start_step=step)
    shape = (3, student_cfg.image_size, student_cfg.image_size)
    norm = teacher.proprio_stats
    bar = tqdm(total=cfg.steps + cfg.self_forcing_steps, initial=step, desc=f"distil {view}", disable=not job.progress)
    t0 = time.perf_counter()
    while step < cfg.steps:
        step += 1
        idx, noise = _draw(cfg, step, VIEWS.index(view), train.size, shape)
        b = train.batch(idx.to(device), view, student_cfg.main_condition, norm)
        noise = noise.to(device)
        with torch.no_grad(), _autocast(device):
            target = teacher.sample(noise, b["frames"], b["actions"], b["proprio"], teacher.cfg.sample_steps)
        with _autocast(device):
            pred = student.sample(noise, b["frames"], b["actions"], b["proprio"], cfg.student_steps)
        loss = F.mse_loss(pred.float(), target.float().clamp(-1, 1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(student.parameters(), 1.0)
        opt.step()
        bar.update(1)
        if step % cfg.log_interval == 0 or step == cfg.steps:
            log.write({"step": step, "loss": round(loss.item(), 6),
                       "samples_per_s": round(cfg.batch * cfg.log_interval / (time.perf_counter() - t0), 1)})
            t0 = time.perf_counter()
        if step % cfg.save_interval == 0 or step == cfg.steps:
            save(out, student, opt, step, teacher_info, cfg)
    if cfg.self_forcing_steps:
        step = self_forcing(job, view, student, teacher, opt, train, device, step, state, teacher_info, log, bar,
                            main_model)
    bar.close()
    entry = {"weights": str(out / step_name(step)), "step": step, "reason": "finished",
             "teacher": str(teacher_info["weights"]), "sample_steps": cfg.student_steps,
             "self_forcing_steps": max(0, step - cfg.steps)}
    return entry, student, teacher


def rollout(model, data, idx, view: str, norm: dict, noises, steps: int, device, grad: bool = False,
            main_model=None, main_noises=None):
    """The model's own rollout of ``len(noises)`` chunks from transitions ``idx``: the real
    history at the start, then each chunk on the frames it generated before (real actions and
    proprio). A wrist model sees the main view's frame of each chunk's start (or, with
    ``main_at_chunk_end``, its end): the real one, or with ``main_model`` that model's own,
    imagined in lockstep from the real start (its sampler, ``main_noises``: one per main frame
    imagined, ``main_frames_imagined``), as imagination gives it. Returns the last frame (with
    gradients through its sampler when ``grad``) and the batch that conditioned it."""
    cfg, hist, main_hist = model.cfg, None, None
    imagined_main = cfg.condition_on_main and main_model is not None
    for j, noise in enumerate(noises):
        b = data.batch(idx + j, view, cfg.main_condition, norm)
        hist = list(b["frames"][:, :cfg.context].unbind(1)) if hist is None else hist
        frames = torch.stack(hist[-cfg.context:], 1)
        last = j == len(noises) - 1
        if imagined_main:
            mb = data.batch(idx + j, "main", None, main_model.proprio_stats)
            main_hist = list(mb["frames"].unbind(1)) if main_hist is None else main_hist
            if cfg.main_at_chunk_end:  # the main model imagines this chunk's end first
                main_hist.append(_main_frame(main_model, main_noises[j], main_hist, mb, device))
            frames = torch.cat([frames, main_hist[-1][:, None]], 1)
        elif cfg.condition_on_main:
            frames = torch.cat([frames, b["frames"][:, cfg.context:]], 1)
        with torch.set_grad_enabled(grad and last), _autocast(device):
            x = model.sample(noise.to(device), frames, b["actions"], b["proprio"], steps).float()
        hist.append(x.clamp(-1, 1))
        if imagined_main and not cfg.main_at_chunk_end and not last:  # the main frame the next chunk starts on
            main_hist.append(_main_frame(main_model, main_noises[j], main_hist, mb, device))
    return x, {**b, "frames": frames}


def main_frames_imagined(cfg, chunks: int) -> int:
    """Main-view frames a wrist rollout of ``chunks`` imagines beside it (noises to draw): every
    chunk's end, or (the main frame of each chunk's start) all but the last one's."""
    return chunks if cfg.main_at_chunk_end else chunks - 1


def _main_frame(main_model, noise, main_hist: list, mb: dict, device) -> torch.Tensor:
    """The main model's next frame from its own history ``main_hist`` (no gradients)."""
    with torch.no_grad(), _autocast(device):
        m = main_model.sample(noise.to(device), torch.stack(main_hist[-main_model.cfg.context:], 1),
                              mb["actions"], mb["proprio"], main_model.cfg.sample_steps).float()
    return m.clamp(-1, 1)


def main_teacher(job: DistillJob, device):
    """The model whose frames a wrist rollout starts each chunk on (``rollout``'s
    ``main_model``): the selection's main model, the distribution the main student is distilled
    towards and there before any student is (a view may be distilled alone)."""
    from wmrl.worldmodel.model import FrameWorldModel

    sel = read_json(RunLayout(job.run).selection, DistillError, "update the world models first")
    return FrameWorldModel.from_pretrained(Path(sel["main"]["weights"]), device).eval().requires_grad_(False)


def rollout_starts(data, chunks: int):
    """Transitions followed by ``chunks - 1`` more of the same episode: where a rollout can start."""
    ok = torch.ones(data.size, dtype=torch.bool, device=data.previous.device)
    ok[max(0, data.size - chunks + 1):] = False
    for j in range(1, min(chunks, data.size)):
        ok[: data.size - j] &= data.previous[j:] == torch.arange(j - 1, data.size - 1, device=ok.device)
    return torch.nonzero(ok).flatten()


def dmd_loss(x, b, teacher, critic, g: torch.Generator):
    """Stage 3's student loss on frames ``x`` (with gradients): DMD2's distribution matching
    between the teacher (real score) and the critic (fake score) at one EDM noise level."""
    cfg = teacher.cfg
    y = x - teacher.anchor(b["frames"], b["actions"], b["proprio"]) if cfg.residual else x  # the denoiser's data space
    n = y.shape[0]
    with torch.no_grad():
        sigma = torch.exp(cfg.p_mean + cfg.p_std * torch.randn(n, generator=g)).clamp(cfg.sigma_min, cfg.sigma_max)
        sigma = sigma.to(y.device)
        noisy = y.detach() + sigma[:, None, None, None] * torch.randn(y.shape, generator=g).to(y.device)
        real = teacher.guided_denoise(noisy, sigma, b["frames"], b["actions"], b["proprio"])
        fake = critic.denoise(noisy, sigma, b["frames"], b["actions"], b["proprio"]).float()
        # DMD's normaliser: the real score's mean distance to the frame keeps the step size
        # independent of how far the student is from the data
        norm = (y - real).abs().mean((1, 2, 3), keepdim=True).clamp_min(1e-6)
        aim = y - torch.nan_to_num((fake - real) / norm)
    return 0.5 * F.mse_loss(y, aim)


def self_forcing(job: DistillJob, view: str, student, teacher, opt, train, device, step: int, state, teacher_info,
                 log, bar, main_model=None) -> int:
    """Stage 3 (SF-DMD) from ``step`` to ``steps + self_forcing_steps``; returns the last step."""
    from wmrl.worldmodel.model import FrameWorldModel

    cfg, out = job.cfg, RunLayout(job.run).wm_student(view)
    total = cfg.steps + cfg.self_forcing_steps
    if step >= total:
        return step
    starts = rollout_starts(train, cfg.rollout_chunks)
    critic = FrameWorldModel(dataclasses.replace(teacher.cfg, action_guidance=1.0)).to(device)
    critic.load_state_dict(teacher.state_dict())  # the fake score starts as the real one
    critic.train()
    copt = torch.optim.AdamW(critic.parameters(), lr=cfg.critic_lr, weight_decay=0.0)
    if state is not None and "critic" in state:
        critic.load_state_dict(state["critic"])
        copt.load_state_dict(state["critic_optimizer"])
    for group in opt.param_groups:  # the student's own rate in Stage 3 (a resumed state carries the last one)
        group["lr"] = cfg.self_forcing_lr
    shape = (3, student.cfg.image_size, student.cfg.image_size)
    norm = teacher.proprio_stats
    t0 = time.perf_counter()
    while step < total:
        step += 1
        g = torch.Generator().manual_seed((cfg.seed * 1_000_003 + step) * len(VIEWS) + VIEWS.index(view))
        idx = starts[torch.randint(len(starts), (cfg.batch,), generator=g).to(starts.device)]
        noises = torch.randn((cfg.rollout_chunks, cfg.batch, *shape), generator=g)
        main_noises = None if main_model is None else torch.randn(
            (main_frames_imagined(student.cfg, cfg.rollout_chunks), cfg.batch, 3, main_model.cfg.image_size,
             main_model.cfg.image_size), generator=g)
        i = step - cfg.steps - cfg.critic_warmup  # the warm-up's iterations are the critic's alone
        update_student = i > 0 and i % cfg.student_every == 0
        x, b = rollout(student, train, idx, view, norm, noises, cfg.student_steps, device, grad=update_student,
                       main_model=main_model, main_noises=main_noises)
        with _autocast(device):
            if update_student:
                loss, model, optim, kind = dmd_loss(x, b, teacher, critic, g), student, opt, "student"
            else:  # the critic learns the student's frames as its data (EDM loss, proprio left out)
                torch.manual_seed(int(torch.randint(2**31, (1,), generator=g)))  # its noise, fixed by the step
                loss, _ = critic.loss(x.detach(), b["frames"], b["actions"], b["proprio"], b["next_proprio"],
                                      proprio_weight=0.0)
                model, optim, kind = critic, copt, "critic"
        optim.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optim.step()
        bar.update(1)
        if step % cfg.log_interval == 0 or step == total:
            log.write({"step": step, "phase": "sf_dmd", "update": kind, "loss": round(loss.item(), 6),
                       "samples_per_s": round(cfg.batch * cfg.rollout_chunks * cfg.log_interval
                                              / (time.perf_counter() - t0), 1)})
            t0 = time.perf_counter()
        if step % cfg.save_interval == 0 or step == total:
            save(out, student, opt, step, teacher_info, cfg, critic=(critic, copt))
    return step


def save(out: Path, student, opt, step: int, teacher_info: dict, cfg: DistillConfig, critic=None) -> None:
    """The weights first, then ``state.pt`` naming them (each written atomically): a kill
    between the two resumes from the previous state, never from half of one. ``critic``:
    Stage 3's (model, optimizer), kept in the state."""
    name = step_name(step)
    student.save_pretrained(out / name, meta={
        "step": step, "distill": dataclasses.asdict(cfg), "self_forcing_steps": max(0, step - cfg.steps),
        "distilled_from": {"weights": str(teacher_info["weights"]), "config_sha256": teacher_info["config_sha256"],
                           "sample_steps": teacher_info["cfg"].sample_steps}})
    state = {"step": step, "weights": name, "optimizer": opt.state_dict(), "teacher_sha256": teacher_info["config_sha256"]}
    if critic is not None:
        state.update(critic=critic[0].state_dict(), critic_optimizer=critic[1].state_dict())
    with atomic_path(out / STATE_FILE) as tmp:
        torch.save(state, tmp)


@torch.no_grad()
def compare(student, teacher, val, view: str, n: int, device, chunks: int = 1, main_model=None) -> dict:
    """Student and teacher on the first ``n`` held-out transitions (one noise draw for both):
    PSNR to the real next frame, PSNR of student to teacher, and frames per second of each;
    with ``chunks`` > 1 also the PSNR of each one's own ``chunks``-chunk rollout at its end (a
    wrist model's on the main frames ``main_model`` imagines, the same for both)."""
    from wmrl.worldmodel.fidelity import psnr, ssim

    idx = torch.arange(min(n, val.size), device=device)
    b = val.batch(idx, view, student.cfg.main_condition, teacher.proprio_stats)
    noise = torch.randn(b["target"].shape, generator=torch.Generator().manual_seed(0)).to(device)
    out = {"transitions": int(len(idx))}
    frames = {}
    for name, model in (("student", student.eval()), ("teacher", teacher.eval())):
        with _autocast(device):
            # warm-up at the timed call's own shape: a new batch size sets off cuDNN's autotuning and, with
            # --compile, a recompilation, which a smaller warm-up left inside the timed call (seen on an H100:
            # the student timed at 0.94x its teacher here against 2.1x in closed-loop imagination)
            model.generate(b["frames"], b["actions"], b["proprio"], noise=noise)
            if device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            frames[name], _ = model.generate(b["frames"], b["actions"], b["proprio"], noise=noise)
            if device.type == "cuda":
                torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        out[name] = {"sample_steps": model.cfg.sample_steps, "frames_per_s": round(len(idx) / dt, 1),
                     "psnr": round(float(psnr(frames[name].float(), b["target"]).mean()), 2),
                     "ssim": round(float(ssim(frames[name].float(), b["target"]).mean()), 4)}
    out["student_vs_teacher_psnr"] = round(float(psnr(frames["student"].float(), frames["teacher"].float()).mean()), 2)
    out["speedup"] = float(f"{out['student']['frames_per_s'] / out['teacher']['frames_per_s']:.3g}")  # 3 significant figures
    starts = rollout_starts(val, chunks)[:n]
    if chunks > 1 and len(starts):  # where imagination lives: on the model's own frames
        g = torch.Generator().manual_seed(1)
        noises = torch.randn((chunks, len(starts), *b["target"].shape[1:]), generator=g)
        main_noises = torch.randn((main_frames_imagined(student.cfg, chunks), len(starts), *b["target"].shape[1:]),
                                  generator=g)
        real = val.batch(starts + chunks - 1, view, None, teacher.proprio_stats)["target"]
        out["open_loop"] = {"chunks": chunks, "rollouts": int(len(starts)),
                            "main_frames": "real" if main_model is None or view == "main" else "imagined"}
        for name, model in (("student", student), ("teacher", teacher)):
            x, _ = rollout(model, val, starts, view, teacher.proprio_stats, noises, model.cfg.sample_steps, device,
                           main_model=main_model, main_noises=main_noises)
            out["open_loop"][f"{name}_psnr"] = round(float(psnr(x.clamp(-1, 1), real).mean()), 2)
            out["open_loop"][f"{name}_ssim"] = round(float(ssim(x.clamp(-1, 1), real).mean()), 4)  # sharpness counts
    return out


def main(job: DistillJob) -> dict:
    from wmrl.device import pick_device
    from wmrl.procs import exclusive
    from wmrl.worldmodel.data import Transitions, load_split

    teachers = load_teachers(job)
    device = pick_device(job.device)
    layout = RunLayout(job.run)
    cfg0 = next(iter(teachers.values()))["cfg"]
    _, train_eps, val_eps = load_split(layout.manifest, cfg0.chunk_size)
    sizes = {e.main.shape[1] for e in train_eps + val_eps}
    if sizes != {cfg0.image_size}:
        raise DistillError(f"the manifest's frames are {sorted(sizes)} px, the world models {cfg0.image_size} px: "
                           "distil with the run whose update made them")
    if len({(t["cfg"].context, t["cfg"].action_history) for t in teachers.values()}) > 1:
        raise DistillError("the two views' world models read different histories (context, action_history): "
                           "distil each with its own run (--view)")
    train = Transitions(train_eps, cfg0.context, device, cfg0.action_history)
    if job.cfg.self_forcing_steps and not len(rollout_starts(train, job.cfg.rollout_chunks)):
        raise DistillError(f"no training episode has {job.cfg.rollout_chunks} chunks for a self-forcing rollout: "
                           "lower --rollout-chunks")
    val = Transitions(val_eps, cfg0.context, device, cfg0.action_history) if val_eps else None
    selection, reports = {}, {}
    # loaded once: a wrist model's rollouts (Stage 3, the report's open loop) start each chunk on its frames
    main_frames = main_teacher(job, device) if any(t["cfg"].condition_on_main for t in teachers.values()) else None
    with exclusive(layout.worldmodels, "make wm-distill"):
        for view, info in teachers.items():
            main_model = main_frames if info["cfg"].condition_on_main else None
            selection[view], student, teacher = distill_view(job, view, info, train, device, main_model)
            if val is not None and job.cfg.val_transitions:
                reports[view] = compare(student, teacher, val, view, job.cfg.val_transitions, device,
                                        job.cfg.rollout_chunks, main_model)
                write_json(layout.wm_student(view) / "report.json", reports[view])
        if set(selection) == set(VIEWS):
            write_json(layout.student_selection, selection)
    return {"selection": selection, "reports": reports}
