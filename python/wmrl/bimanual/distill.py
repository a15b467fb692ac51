"""Stages 2 and 3: distilling the causal teacher into a few-step student.

Both stages run in ``train.train``'s loop and write the same iteration roots; what differs
is the start, the step and two more files per root.

**Stage 2, TF-dCM** (teacher-forced consistency distillation). Student and frozen teacher
both start from the EMA weights of the exact Stage 1 iteration root (``checkpoint.load_path``);
the optimizer starts fresh. With the real frames as causal context (teacher forcing) every
block gets a level ``g_n`` of an ascending grid on [0, 1] (``distill.teacher_steps`` Euler
steps plus the levels of ``distill.schedule``). The teacher takes one Euler step of its
probability-flow ODE from ``x_{g_n}`` to ``x_{g_{n-1}}``; the student's prediction at
``(x_{g_n}, g_n)`` is pulled towards the EMA student's prediction at ``(x_{g_{n-1}}, g_{n-1})``
(at level 0 the ODE point itself). Every point of a teacher trajectory so maps to the same clean
block, which is what lets the student jump: it samples along the schedule, predicting the clean
block at each level and re-noising it to the next (``VideoWorldModel.jump_block``).

**Stage 3, SF-DMD** (self-forcing distribution matching distillation). The student starts
from the EMA of the Stage 2 root; the real score (frozen) and the critic (fake score,
trainable) from the EMA of the Stage 0 root named by ``checkpoint.reference``. A rollout
starts from one real frame and generates every later block with the student's own schedule,
attending through the KV cache only to what the student generated before (self forcing);
gradients pass through one random level of each block, as at the exit of self-forcing. Every
``distill.student_every`` = 6 iterations: iterations 1-5 update the critic (flow matching on
the student's detached rollouts, bidirectional like Stage 0), iteration 6 the student: DMD
moves each generated frame along ``fake_x0 - real_x0`` of the two scores at a random noise
level, normalised by the real score's distance to the frame. 12 iterations = 2 student + 10
critic updates; each has its own optimizer and learning-rate schedule, and both step counts
(read from the optimizers) go to log.jsonl and checkpoint.json.

Iteration roots add ``teacher.pt`` (the frozen teacher / real score) and, in Stage 3,
``critic.pt``; ``optim.pt`` holds the critic's optimizer and scheduler next to the student's.
They make a resume exact without the parent roots; the export never reads them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from wmrl.bimanual.config import PARENT_STAGE, REFERENCE_STAGE, StageConfig
from wmrl.bimanual.train import (Dist, StageState, TrainError, _torch_load, bind_root, build_model, check_architecture,
                                 describe_root,
                                 load_regular_weights, make_scheduler, read_root, resolve, run_meta, start_run,
                                 save_root)
from wmrl.fileio import sha256_file


# ----------------------------------------------------------------------------- the plan
def start_weights(meta: dict[str, Any]) -> str:
    """Which weights of a root a distillation stage starts from: the EMA, where it has one."""
    return "net_ema" if (meta.get("config") or {}).get("ema", {}).get("enabled", True) else "net"


def plan(cfg: StageConfig, parent: dict[str, Any]) -> dict[str, Any]:
    """Stage 2/3 part of ``train.resolve``: the reference, the architecture, the schedule;
    JSON only."""
    stage, lp = cfg.job.stage, cfg.checkpoint.load_path
    check_architecture(cfg, parent, f"checkpoint.load_path={lp}")
    d = cfg.distill
    load = {"kind": "stage", "path": lp, "parent_stage": parent.get("stage"), "parent_iteration": parent.get("iteration"),
            "student": f"{start_weights(parent)} of the Stage {PARENT_STAGE[stage]} root", "optimizer": "fresh",
            "strict": True}
    info: dict[str, Any] = {"schedule": list(d.schedule)}
    if stage == 2:
        load["teacher"] = f"{start_weights(parent)} of the same Stage 1 root, frozen"
        info["consistency_grid"] = len(consistency_grid(d.schedule, d.teacher_steps, cfg.model.time_shift))
        info["target"] = "the EMA student (ema.beta) one teacher ODE step earlier"
        restores = ["teacher"]
    else:
        ref_path = cfg.checkpoint.reference
        ref = bind_root(ref_path, "checkpoint.reference")
        if ref.get("kind") != "stage" or ref.get("stage") != REFERENCE_STAGE:
            raise TrainError(f"checkpoint.reference={ref_path} is {describe_root(ref)}; Stage 3's real score and critic "
                             f"start from the EMA of a completed Stage {REFERENCE_STAGE} iteration root")
        check_architecture(cfg, ref, f"checkpoint.reference={ref_path}")
        saved = parent.get("schedule")
        if saved is not None and [float(x) for x in saved] != list(d.schedule):
            raise TrainError(f"distill.schedule={list(d.schedule)} but the Stage 2 root {lp} was distilled for {saved}; "
                             f"Stage 3 keeps its parent's schedule: set distill.schedule = {saved}")
        load["reference"] = {"path": ref_path, "stage": ref.get("stage"), "iteration": ref.get("iteration")}
        load["real_score"] = f"{start_weights(ref)} of the Stage 0 root, frozen"
        load["critic"] = f"{start_weights(ref)} of the Stage 0 root, trainable, own optimizer"
        n = d.student_every
        info["update_cycle"] = {"student_every": n, "per_cycle": f"1 student + {n - 1} critic updates"}
        info["updates"] = {"student": cfg.trainer.max_iter // n, "critic": cfg.trainer.max_iter - cfg.trainer.max_iter // n}
        info["critic_lr"] = d.critic_lr
        info["dmd_t"] = [d.dmd_t_min, d.dmd_t_max]
        restores = ["teacher", "critic", "critic_optimizer", "critic_scheduler"]
    return {"load": load, "distill": info, "restores": restores}


def consistency_grid(schedule, teacher_steps: int, shift: float = 1.0) -> list[float]:
    """Ascending levels 0 = g_0 < ... < g_N = 1: the teacher's Euler grid (uniform, moved by
    ``model.time_shift`` as its sampler is) plus the schedule's levels, so the student is
    trained at exactly the levels it samples at."""
    from wmrl.bimanual.model import shift_t

    teacher = {round(shift_t(k / teacher_steps, shift), 6) for k in range(teacher_steps + 1)}
    return sorted(teacher | {round(float(x), 6) for x in schedule})


# ----------------------------------------------------------------------------- the losses
def tfdcm_loss(student, teacher, target, batch, grid):
    """Stage 2: consistency distillation along the teacher's ODE, real frames as context."""
    import torch

    from wmrl.bimanual.model import T_MIN

    x0 = batch["video"]
    b, f = x0.shape[:2]
    dev = x0.device
    blocks = student.frame_block(torch.arange(f, device=dev))
    n = torch.randint(1, len(grid), (b, int(blocks.max()) + 1), device=dev)
    t_hi, t_lo = grid[n][:, blocks], grid[n - 1][:, blocks]
    t_hi[:, 0] = 0
    t_lo[:, 0] = 0
    th, tl = t_hi[:, :, None, None, None], t_lo[:, 1:, None, None, None]
    x_hi = (1 - th) * x0 + th * torch.randn(x0.shape, device=dev)
    with torch.no_grad():
        x0_teacher = teacher.forward_teacher_forcing(x0, x_hi, t_hi, batch)
        v = (x_hi[:, 1:] - x0_teacher) / th[:, 1:].clamp(min=T_MIN)
        x_lo = x_hi[:, 1:] + (tl - th[:, 1:]) * v  # the same Euler step the teacher samples with
        aim = target.forward_teacher_forcing(x0, torch.cat([x0[:, :1], x_lo], 1), t_lo, batch)
        aim = torch.where(tl == 0, x_lo, aim)  # at level 0 the consistency function is the identity
    pred = student.forward_teacher_forcing(x0, x_hi, t_hi, batch)
    w = batch["frame_mask"][:, 1:].float()
    return (((pred - aim) ** 2).mean((2, 3, 4)) * w).sum() / w.sum().clamp(min=1)


def self_forcing_rollout(student, batch, schedule, grad_level: int | None):
    """The student's own video from the first real frame: each block along the schedule,
    attending through the KV cache to the student's earlier blocks (never the real ones).
    With ``grad_level`` the blocks carry gradients from that level (unclamped)."""
    import torch

    video = batch["video"]
    f, dev = video.shape[1], video.device
    act, am = student.frame_actions(batch["actions"], batch["action_mask"])
    cap = student.caption_vector(batch["caption_ids"], batch["caption_mask"])
    dom = batch["domain_id"]
    cache = student.new_cache()
    with torch.no_grad():
        student.push_clean(cache, video[:, :1], torch.arange(1, device=dev), act[:, :1], am[:, :1], dom, cap)
    out = [video[:, :1]]
    last = video[:, 0]  # the clean frame before the next block (model.residual's anchor)
    blocks = student.frame_block(torch.arange(f, device=dev))
    for blk in range(1, int(blocks[-1]) + 1):
        idx = torch.nonzero(blocks == blk).flatten()
        x = student.jump_block(cache, idx, act[:, idx], am[:, idx], dom, cap, schedule, grad_level=grad_level, last=last)
        out.append(x)
        clean = x.detach().clamp(-1, 1)
        with torch.no_grad():  # inference pushes clamped blocks: so does training
            student.push_clean(cache, clean, idx, act[:, idx], am[:, idx], dom, cap)
        last = clean[:, -1]
    return torch.cat(out, 1)


def dmd_loss(clip, batch, real, fake, t_min: float, t_max: float):
    """Stage 3's student loss: distribution matching between the real and the fake score."""
    import torch

    b, f = clip.shape[:2]
    dev = clip.device
    w = batch["frame_mask"][:, 1:].float()
    with torch.no_grad():
        t = (t_min + (t_max - t_min) * torch.rand(b, 1, device=dev)).expand(b, f).clone()
        t[:, 0] = 0  # the real first frame stays clean, as in Stage 0
        tt = t[:, :, None, None, None]
        x = clip.detach()
        xt = (1 - tt) * x + tt * torch.randn(x.shape, device=dev)
        real_x0 = real.forward_bidirectional(xt, t, batch)[:, 1:]
        fake_x0 = fake.forward_bidirectional(xt, t, batch)[:, 1:]
        gen = x[:, 1:]
        ww = w[:, :, None, None, None]
        # DMD's normaliser: the real score's mean distance to the sample keeps the step size
        # independent of how far the student is from the data
        norm = ((gen - real_x0).abs() * ww).sum((1, 2, 3, 4)) / (ww.sum((1, 2, 3, 4)) * gen[0, 0].numel()).clamp(min=1)
        grad = torch.nan_to_num((fake_x0 - real_x0) / norm.clamp(min=1e-6)[:, None, None, None, None])
        aim = gen - grad
    return 0.5 * (((clip[:, 1:] - aim) ** 2).mean((2, 3, 4)) * w).sum() / w.sum().clamp(min=1)


def optimizer_steps(opt) -> int:
    """Updates an optimizer has made, read from its own state (not from the iteration)."""
    return max((int(st["step"]) for st in opt.state.values() if "step" in st), default=0)


# ------------------------------------------------------------------------------ the state
@dataclass
class DistillState(StageState):
    teacher: Any = None  # Stage 2: the Stage 1 teacher; Stage 3: the real score (both frozen)
    critic: Any = None  # Stage 3: the fake score
    critic_opt: Any = None
    critic_sched: Any = None
    grid: Any = None  # Stage 2: the consistency grid as a tensor
    last: dict | None = None  # the last loss of each kind (Stage 3 alternates)

    def counts(self) -> dict[str, int]:
        out = {"student": optimizer_steps(self.opt)}
        if self.critic_opt is not None:
            out["critic"] = optimizer_steps(self.critic_opt)
        return out

    def _update(self, loss, params, opt, sched, iteration: int, what: str) -> float:
        import torch

        if not torch.isfinite(loss):
            raise TrainError(f"iteration {iteration}: non-finite {what} loss ({float(loss)}); lower "
                             f"{'distill.critic_lr' if what == 'critic' else 'trainer.lr'} or check the parent checkpoints")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(params, self.cfg.trainer.grad_clip)
        if not torch.isfinite(gnorm):
            raise TrainError(f"iteration {iteration}: non-finite {what} gradient norm; lower the learning rate")
        opt.step()
        sched.step()
        return float(gnorm)

    def step(self, iteration: int) -> dict[str, Any]:
        import torch

        from wmrl.bimanual.model import flow_loss

        batch = {k: v.to(self.device) for k, v in self.loader.next_batch()[0].items()}
        d = self.cfg.distill
        amp = torch.autocast("cuda", dtype=torch.bfloat16, enabled=self.amp)
        if self.cfg.job.stage == 2:
            with amp:
                loss = tfdcm_loss(self.net, self.teacher, self.ema.net, batch, self.grid)
            gnorm = self._update(loss, self.net.parameters(), self.opt, self.sched, iteration, "student")
            self.ema.update(self.net)
            return {"loss": float(loss.detach()), "grad_norm": gnorm, "student_steps": optimizer_steps(self.opt)}
        level = int(torch.randint(len(d.schedule), ()))  # the exit level of this rollout
        if iteration % d.student_every == 0:
            with amp:
                clip = self_forcing_rollout(self.net, batch, d.schedule, level)
                loss = dmd_loss(clip, batch, self.teacher, self.critic, d.dmd_t_min, d.dmd_t_max)
            gnorm = self._update(loss, self.net.parameters(), self.opt, self.sched, iteration, "student")
            self.ema.update(self.net)
            kind = "student"
        else:
            with amp:
                with torch.no_grad():
                    clip = self_forcing_rollout(self.net, batch, d.schedule, level)
                loss, _ = flow_loss(self.critic, {**batch, "video": clip}, "bidirectional")
            gnorm = self._update(loss, self.critic.parameters(), self.critic_opt, self.critic_sched, iteration, "critic")
            kind = "critic"
        self.last[kind] = float(loss.detach())
        c = self.counts()
        return {"loss": self.last[kind], "grad_norm": gnorm, "update": kind, "student_loss": self.last.get("student"),
                "critic_loss": self.last.get("critic"), "student_steps": c["student"], "critic_steps": c["critic"],
                "critic_lr": self.critic_sched.get_last_lr()[0]}

    def save(self, iteration: int) -> Path:
        files = {"teacher.pt": {"net": self.teacher.state_dict()}}
        optim = {}
        if self.critic is not None:
            files["critic.pt"] = {"net": self.critic.state_dict()}
            optim = {"critic_optimizer": self.critic_opt.state_dict(), "critic_scheduler": self.critic_sched.state_dict()}
        return save_root(self.cfg.run_dir, iteration, net=self.net, ema=self.ema, opt=self.opt, sched=self.sched,
                         loader=self.loader, meta={**self.meta, "optimizer_steps": self.counts(), "last_losses": self.last},
                         dist=self.dist,
                         files=files, optim=optim)

    def final(self) -> dict[str, Any]:
        out = {"ema_copies": self.ema.copies, "optimizer_steps": self.counts(), "schedule": list(self.cfg.distill.schedule)}
        if self.critic is not None:
            out.update(student_loss_last=self.last.get("student"), critic_loss_last=self.last.get("critic"))
        return out


def init_distill(cfg: StageConfig) -> DistillState:
    """Stage 2/3's start: the plan checked, the config recorded, student, EMA, teacher (and
    critic) from their roots, or everything from this run's newest root."""
    import torch

    from wmrl import rng
    from wmrl.bimanual.loader import make_bimanual_local_dataloader
    from wmrl.ema import EMA

    plan_ = resolve(cfg)
    stage, d = cfg.job.stage, cfg.distill
    dist = Dist(False)
    resolved, device, bundle = start_run(cfg, dist)
    net = build_model(cfg, bundle)
    teacher = build_model(cfg, bundle).requires_grad_(False)
    critic = build_model(cfg, bundle) if stage == 3 else None
    loader = make_bimanual_local_dataloader(bundle, stage=stage, split="train", batch_size=cfg.data.batch_size,
                                            seed=cfg.data.seed)
    adamw = dict(weight_decay=cfg.trainer.weight_decay, betas=(0.9, 0.99))
    student_updates = cfg.trainer.max_iter // d.student_every if stage == 3 else cfg.trainer.max_iter
    opt = torch.optim.AdamW(net.parameters(), lr=cfg.trainer.lr, **adamw)
    sched = make_scheduler(opt, cfg, total=max(1, student_updates))
    critic_opt = critic_sched = None
    if critic is not None:
        critic_opt = torch.optim.AdamW(critic.parameters(), lr=d.critic_lr, **adamw)
        critic_sched = make_scheduler(critic_opt, cfg, total=max(1, cfg.trainer.max_iter - student_updates))
    ema = EMA(net, cfg.ema.beta)

    lp, ref = cfg.checkpoint.load_path, cfg.checkpoint.reference
    resume = plan_["load"]["kind"] == "resume"
    if resume:
        root = Path(plan_["load"]["path"])
        state = _torch_load(root, "model.pt")
        net.load_state_dict(state["net"], strict=True)
        ema.net.load_state_dict(state["net_ema"], strict=True)
        o = _torch_load(root, "optim.pt")
        opt.load_state_dict(o["optimizer"])
        sched.load_state_dict(o["scheduler"])
        teacher.load_state_dict(_torch_load(root, "teacher.pt")["net"], strict=True)
        if critic is not None:
            critic.load_state_dict(_torch_load(root, "critic.pt")["net"], strict=True)
            critic_opt.load_state_dict(o["critic_optimizer"])
            critic_sched.load_state_dict(o["critic_scheduler"])
        ts = _torch_load(root, "trainer_state.pt")
        ema.copies = ts["ema_copies"]
        loader.load_state_dict(ts["loader"])
        rmeta = read_root(root)
        start, last = rmeta["iteration"], dict(rmeta.get("last_losses") or {})  # the log goes on as it would have
    else:
        student_w = _start_state(Path(lp))
        load_regular_weights(net, student_w, skip_prefixes=(), where=lp)
        if stage == 2:
            load_regular_weights(teacher, student_w, skip_prefixes=(), where=lp)
        else:
            ref_w = _start_state(Path(ref))
            load_regular_weights(teacher, ref_w, skip_prefixes=(), where=ref)
            load_regular_weights(critic, ref_w, skip_prefixes=(), where=ref)
        ema.copy_from(net)  # the one built-in EMA step
        start, last = 0, {}
    for m in (net, ema.net, teacher, critic):
        if m is not None:
            m.to(device)
    teacher.eval()
    for o_ in (opt, critic_opt):
        for st in (o_.state.values() if o_ is not None else ()):
            for k, v in st.items():
                if torch.is_tensor(v) and k != "step":
                    st[k] = v.to(device)
    if resume:
        rng.restore(ts["rng"])  # last: nothing after it may draw

    meta = run_meta(cfg, bundle, resolved, "plain", dist, net)
    # identities, not only paths: the export carries these hashes where it may carry no path
    meta.update(schedule=list(d.schedule), parent_checkpoint_sha256=sha256_file(Path(lp) / "checkpoint.json"),
                student_start=start_weights(read_root(Path(lp))),
                teacher={"root": "reference" if stage == 3 else "parent",
                         "weights": start_weights(read_root(Path(ref if stage == 3 else lp)))})
    if stage == 3:
        meta.update(reference=str(Path(ref).resolve()), reference_checkpoint_sha256=sha256_file(Path(ref) / "checkpoint.json"),
                    update_cycle={"student_every": d.student_every, "student_updates_per_cycle": 1,
                                  "critic_updates_per_cycle": d.student_every - 1})
    grid = (torch.tensor(consistency_grid(d.schedule, d.teacher_steps, cfg.model.time_shift), device=device)
            if stage == 2 else None)
    summary: dict[str, Any] = {"run_dir": str(cfg.run_dir), "start_iteration": start, "resumed": resume,
                               "ema_copies": ema.copies, "backend": "plain", "world_size": 1, "rank": 0}
    amp = device.type == "cuda" and cfg.trainer.precision == "bf16"
    return DistillState(cfg, dist, device, net, ema, opt, sched, loader, None, start, meta, summary, amp,
                        teacher=teacher, critic=critic, critic_opt=critic_opt, critic_sched=critic_sched, grid=grid, last=last)


def _start_state(root: Path) -> dict:
    """The weights a distillation stage starts from: the root's EMA (the model its stage is
    judged by), its regular weights where it kept none."""
    state = _torch_load(root, "model.pt")
    return state["net_ema"] if state.get("net_ema") is not None else state["net"]
