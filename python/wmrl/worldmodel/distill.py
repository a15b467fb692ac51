"""Few-step students of the world models: ``python python/wm_distill.py --run RUN``.

Imagination spends its time in the world models' samplers: ``sample_steps`` (3) network calls
per frame and per view. A student makes the frame in fewer calls (``student_steps``, 1): for a
noise draw, the teacher's Euler sample is the target of the student's sample from the same draw
(Luhman & Luhman 2021, knowledge distillation of an iterative sampler). The student starts as a
copy of the teacher; real training transitions condition both (the wrist model sees the real
main view, as in its training). The loss is the mean squared error of the two frames in
[-1, 1]. The proprio head is the teacher's, unchanged.

Read top to bottom: ``load_teachers`` checks the inputs, ``distill_view`` is the loop for one
view (resumed from ``state.pt`` if there is one), ``compare`` measures student against teacher
on held-out transitions, ``main`` runs both views and writes the selection.

Files, ``V`` = main or wrist:

* ``RUN/worldmodels/V_student/global_step_N/``  inference weights (``FrameWorldModel`` format; its
  config says ``sample_steps = student_steps``; the meta names the teacher and its hash);
* ``RUN/worldmodels/V_student/state.pt``        optimizer and step (each step's batch and noise come
  from a generator seeded by the step, so a rerun continues bit for bit);
* ``RUN/worldmodels/V_student/report.json``     student vs teacher on held-out transitions;
* ``RUN/train/selected_students.json``          both students (``make package STUDENTS=1`` packs them);
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


def distill_view(job: DistillJob, view: str, teacher_info: dict, train, device) -> tuple[dict, object, object]:
    """Distil one view to ``job.cfg.steps`` updates; returns the selection entry, the student
    and the teacher."""
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
    bar = tqdm(total=cfg.steps, initial=step, desc=f"distil {view}", disable=not job.progress)
    t0 = time.perf_counter()
    while step < cfg.steps:
        step += 1
        idx, noise = _draw(cfg, step, VIEWS.index(view), train.size, shape)
        b = train.batch(idx.to(device), view, student_cfg.condition_on_main, norm)
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
    bar.close()
    entry = {"weights": str(out / step_name(step)), "step": step, "reason": "finished",
             "teacher": str(teacher_info["weights"]), "sample_steps": cfg.student_steps}
    return entry, student, teacher


def save(out: Path, student, opt, step: int, teacher_info: dict, cfg: DistillConfig) -> None:
    """The weights first, then ``state.pt`` naming them (each written atomically): a kill
    between the two resumes from the previous state, never from half of one."""
    name = step_name(step)
    student.save_pretrained(out / name, meta={
        "step": step, "distill": dataclasses.asdict(cfg),
        "distilled_from": {"weights": str(teacher_info["weights"]), "config_sha256": teacher_info["config_sha256"],
                           "sample_steps": teacher_info["cfg"].sample_steps}})
    with atomic_path(out / STATE_FILE) as tmp:
        torch.save({"step": step, "weights": name, "optimizer": opt.state_dict(),
                    "teacher_sha256": teacher_info["config_sha256"]}, tmp)


@torch.no_grad()
def compare(student, teacher, val, view: str, n: int, device) -> dict:
    """Student and teacher on the first ``n`` held-out transitions (one noise draw for both):
    PSNR to the real next frame, PSNR of student to teacher, and frames per second of each."""
    from wmrl.worldmodel.fidelity import psnr

    idx = torch.arange(min(n, val.size), device=device)
    b = val.batch(idx, view, student.cfg.condition_on_main, teacher.proprio_stats)
    noise = torch.randn(b["target"].shape, generator=torch.Generator().manual_seed(0)).to(device)
    out = {"transitions": int(len(idx))}
    frames = {}
    for name, model in (("student", student.eval()), ("teacher", teacher.eval())):
        with _autocast(device):
            model.generate(b["frames"][:2], b["actions"][:2], b["proprio"][:2], noise=noise[:2])  # warm-up
            if device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            frames[name], _ = model.generate(b["frames"], b["actions"], b["proprio"], noise=noise)
            if device.type == "cuda":
                torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        out[name] = {"sample_steps": model.cfg.sample_steps, "frames_per_s": round(len(idx) / dt, 1),
                     "psnr": round(float(psnr(frames[name].float(), b["target"]).mean()), 2)}
    out["student_vs_teacher_psnr"] = round(float(psnr(frames["student"].float(), frames["teacher"].float()).mean()), 2)
    out["speedup"] = float(f"{out['student']['frames_per_s'] / out['teacher']['frames_per_s']:.3g}")  # 3 significant figures
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
    val = Transitions(val_eps, cfg0.context, device, cfg0.action_history) if val_eps else None
    selection, reports = {}, {}
    with exclusive(layout.worldmodels, "make wm-distill"):
        for view, info in teachers.items():
            selection[view], student, teacher = distill_view(job, view, info, train, device)
            if val is not None and job.cfg.val_transitions:
                reports[view] = compare(student, teacher, val, view, job.cfg.val_transitions, device)
                write_json(layout.wm_student(view) / "report.json", reports[view])
        if set(selection) == set(VIEWS):
            write_json(layout.student_selection, selection)
    return {"selection": selection, "reports": reports}
