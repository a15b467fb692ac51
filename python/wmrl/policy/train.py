"""Supervised flow-matching training of the policy on demonstrations (``python/sft.py``).

One code path for CPU, one GPU and several (``torchrun``: DDP, the global batch split over
ranks, rank 0 writes). Rerunning the same command continues from the newest *full*
checkpoint in ``RUN/weights/sft``: weights, optimizer, schedule, RNG states, sampler
position and EMA all come back, so on one device an interrupted run ends with the same
parameters as an uninterrupted one.

Read top to bottom: ``init_state`` (process group, what we continue from, data, model,
optimizer, EMA), ``train_step`` (one optimizer step), ``validate``, ``save``, and ``main``:
the short loop with its logging and checkpoint cadence.

Writes ``RUN/weights/sft/global_step_N/`` (``checkpoint``; GRPO's steps live in ``weights/policy``), ``RUN/latest_policy.json``,
``RUN/logs/sft.jsonl`` (one JSON record per log/validation event) and TensorBoard events in
``RUN/logs/tensorboard/sft``.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from wmrl import rng
from wmrl.config import ConfigError, PolicyConfig, SFTConfig
from wmrl.device import pick_device
from wmrl.ema import EMA
from wmrl.layout import RunLayout
from wmrl.logs import MetricsLog
from wmrl.policy import checkpoint as ck

KIND = "sft"  # RUN/weights/sft/global_step_N: supervised checkpoints keep their own numbering
VAL_MAX_SAMPLES = 4096


@dataclass
class SFTJob:
    run: Path
    data: list[str]
    policy: PolicyConfig
    sft: SFTConfig
    profile: str = "default"
    tasks: tuple[int, ...] | None = None
    init: str | None = None  # checkpoint folder whose weights (and statistics) start a fresh run
    resume: str = "auto"  # "auto": newest full checkpoint if any; "N": that step (must be full)
    stop_after: int | None = None  # stop (with a full checkpoint) at this step; the schedule still targets sft.steps
    allow_new_data: bool = False  # resume even when the data files differ from those the run trained on
    device: str = "auto"  # auto | cpu | cuda
    progress: bool = True
    tensorboard: bool = True
    command: str | None = None  # how to rerun (recorded in latest_policy.json)
    extra: dict[str, Any] = field(default_factory=dict)


# ----------------------------------------------------------------------------------- plan
def check_same_data(loaded, files: list[Path]) -> None:
    """A resumed run continues on the data it was trained on: refuse other files, naming the
    first difference (``--allow-new-data`` resumes anyway)."""
    from wmrl.fileio import sha256_file

    before = {Path(d["path"]).name: d["sha256"] for d in loaded.meta.get("data", {}).get("files", [])}
    if not before:
        return  # an older checkpoint without the record
    now = {Path(f).name: f for f in files}
    for name in sorted(set(before) | set(now)):
        if name not in now:
            why = f"{name} was in the data of {loaded.path} and is not in this run's data"
        elif name not in before:
            why = f"{now[name]} is new: {loaded.path} was trained without it"
        elif sha256_file(now[name]) != before[name]:
            why = f"{now[name]} changed since {loaded.path} was trained on it (SHA-256 {before[name][:12]}...)"
        else:
            continue
        raise ck.CheckpointError(f"resume on other data: {why}; pass --allow-new-data to continue on it anyway, "
                                 "or start a new RUN")


def find_resume(job: SFTJob) -> ck.CheckpointInfo | None:
    """The checkpoint this job continues from, or None for a fresh start (cheap: no loading)."""
    cks = ck.list_checkpoints(job.run, KIND)
    if job.resume == "auto":
        full = [c for c in cks if c.full]
        if full:
            return full[-1]
        if cks:
            raise ck.CheckpointError(
                f"{ck.policy_dir(job.run, KIND)} holds only weights-only checkpoints ({', '.join(str(c.step) for c in cks)}); "
                "they cannot be resumed (no train_state.pt). Start a new RUN, with --init <checkpoint folder> to "
                "begin from those weights")
        return None
    if job.resume in ("no", "none", "fresh"):
        if cks:
            raise ck.CheckpointError(f"{ck.policy_dir(job.run, KIND)} already holds checkpoints; "
                                     "choose another RUN to start afresh")
        return None
    try:
        step = int(job.resume)
    except ValueError:
        raise ConfigError(f"--resume {job.resume!r}: use 'auto' or a step number") from None
    info = ck.resolve(job.run, step, KIND)
    if not info.full:
        ck.load_checkpoint(info.path, need_full=True)  # raises the weights-only message
    return info


def plan(job: SFTJob) -> dict:
    from wmrl.data.trajectory import count_episodes
    from wmrl.policy.data import find_files

    missing = [str(d) for d in job.data if not Path(d).exists()]
    files = [] if missing else find_files(job.data)  # a plan may come before `make demos` (make speedrun)
    resume = find_resume(job)
    return {"run": str(job.run), "profile": job.profile,
            "data": [str(f) for f in files] or f"{', '.join(missing)}: not there yet (make demos writes it)",
            "episodes": sum(count_episodes(f) for f in files), "tasks": job.tasks,
            "start": f"resume from {resume.path} (step {resume.step})" if resume else
                     (f"fresh, weights from {job.init}" if job.init else "fresh"),
            "steps": job.sft.steps, "stop_after": job.stop_after, "policy": asdict(job.policy), "sft": asdict(job.sft),
            "device": job.device, "world_size": int(os.environ.get("WORLD_SIZE", "1"))}


# ----------------------------------------------------------------------------------- helpers
def lr_factor(step: int, cfg: SFTConfig) -> float:
    """Linear warmup to 1, then cosine down to ``min_lr_ratio`` at ``cfg.steps``."""
    if cfg.warmup and step < cfg.warmup:
        return (step + 1) / cfg.warmup
    span = max(1, cfg.steps - cfg.warmup)
    progress = min(1.0, (step - cfg.warmup) / span)
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def _param_groups(model, weight_decay: float):
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (decay if p.ndim >= 2 and not name.endswith("pos") and "type_emb" not in name else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def _make_objective(model):
    """Batch -> flow-matching loss as a ``torch.nn.Module`` (what DDP wraps)."""
    import torch

    from wmrl.policy.model import flow_matching_loss

    class Objective(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.model = m

        def forward(self, main, wrist, lang, proprio, actions, mask):
            prefix = self.model.encode(main, wrist, lang, proprio)
            return flow_matching_loss(self.model, prefix, actions, mask)

    return Objective(model)


class Batcher:
    """Gathers a batch from the in-memory data, normalises, augments (training only)."""

    def __init__(self, data, lang_table, norm, cfg: PolicyConfig, device):
        self.data, self.lang_table, self.device = data, lang_table, device
        self.n = norm.tensors(device)
        self.pad = int(round(cfg.augment_shift * data.image_size))

    def __call__(self, split, idx, train: bool):
        from wmrl.augment import random_shift
        from wmrl.policy.model import images_to_input

        idx = idx.to(split.frame.device)
        frame = split.frame[idx]
        main = images_to_input(self.data.main[frame].to(self.device, non_blocking=True))
        wrist = images_to_input(self.data.wrist[frame].to(self.device, non_blocking=True))
        if train and self.pad:
            main, wrist = random_shift(main, self.pad), random_shift(wrist, self.pad)
        n = self.n
        lang = self.lang_table[split.lang[idx].to(self.device)]
        proprio = (self.data.proprio[frame].to(self.device) - n["p_m"]) / n["p_s"]
        actions = (split.actions[idx].to(self.device) - n["a_c"]) / n["a_s"]
        mask = split.mask[idx].to(self.device)
        return main, wrist, lang, proprio, actions, mask


# ----------------------------------------------------------------------------------- state
@dataclass
class Learner:
    """What a supervised step changes or reads (``train_step``, ``validate``, ``save``)."""

    model: Any  # FlowPolicy (trained)
    ema: EMA | None  # its EMA, the weights saved and evaluated (when sft.ema > 0)
    opt: Any
    sched: Any
    sampler: Any  # EpochSampler: the position in the data, part of the full state
    objective: Any  # batch -> loss (DDP-wrapped under torchrun)
    batcher: Batcher
    autocast: Any
    data: Any  # DemoData in memory
    sc: SFTConfig
    local_batch: int
    device: Any


@dataclass
class SFTState:
    """``init_state``'s result: the learner and what the loop, the logs and the saves need."""

    learner: Learner
    start: int
    stop: int
    world: int
    is_main: bool
    say: Any
    norm: Any
    lang: Any
    source: Any  # the checkpoint resumed or initialised from (its statistics and language cache), or None
    data_meta: dict
    nparams: int


def init_state(job: SFTJob) -> SFTState | dict:
    """Process group, what we continue from, data, model, optimizer, EMA; a dict (the final
    result) when there is nothing to train."""
    import torch

    from wmrl.fileio import sha256_file
    from wmrl.policy.data import DemoData, EpochSampler, find_files, read_episodes
    from wmrl.policy.language import builtin_cache
    from wmrl.policy.model import FlowPolicy
    from wmrl.policy.normalize import NormStats

    cfg, sc = job.policy, job.sft
    run = Path(job.run)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = pick_device(job.device, local_rank)
    use_cuda = device.type == "cuda"
    if world > 1:
        import torch.distributed as dist

        from wmrl.device import before_process_group

        if use_cuda:
            torch.cuda.set_device(device)
        before_process_group()
        dist.init_process_group("nccl" if use_cuda else "gloo")
    if sc.batch_size % world:
        raise ConfigError(f"batch size {sc.batch_size} must be divisible by the number of processes ({world})")
    local_batch = sc.batch_size // world
    is_main = rank == 0
    say = (lambda *a: print(*a, flush=True)) if is_main else (lambda *a: None)

    # 1. what we continue from: checked fully before anything is read or written
    resume = find_resume(job)
    loaded = ck.load_checkpoint(resume.path, expect=cfg, need_full=True) if resume else None
    init = None
    if loaded is None and job.init:
        init = ck.load_checkpoint(_init_path(job.init, run), expect=cfg)
    start = loaded.step if loaded else 0
    if start >= sc.steps:
        say(f"[sft] {resume.path} is at step {start} >= steps={sc.steps}: nothing to do")
        ck.update_latest(run, resume_command=job.command) if is_main else None
        return {"step": start, "checkpoint": str(resume.path), "trained_steps": 0}
    stop = min(sc.steps, job.stop_after) if job.stop_after else sc.steps
    if stop <= start:
        say(f"[sft] already at step {start} (stop_after={job.stop_after}): nothing to do")
        return {"step": start, "checkpoint": str(resume.path), "trained_steps": 0}

    # 2. data, decoded once into memory (on the GPU when training there)
    t0 = time.perf_counter()
    files = find_files(job.data)
    if loaded is not None and is_main and not job.allow_new_data:
        check_same_data(loaded, files)
    episodes = read_episodes(files, sc.num_workers)
    data = DemoData(episodes, chunk=cfg.chunk_size, val_ratio=sc.val_ratio, seed=sc.seed,
                    device=device, tasks=job.tasks)
    del episodes
    source = loaded or init
    if source is not None and source.image_size and source.image_size != data.image_size:
        raise ck.CheckpointError(f"{source.path} was trained on {source.image_size} px images, the data has "
                                 f"{data.image_size} px; use data of the same image size")
    norm = source.norm if source is not None else NormStats.compute(data.train_actions, data.train_proprio)
    lang = builtin_cache()
    if source is not None:
        lang.merge(source.lang)
    lang.ensure(data.instructions)
    lang_table = torch.from_numpy(lang.lookup(data.instructions)).to(device)
    summary = data.summary()
    say(f"[sft] data: {summary['episodes']} episodes ({summary['train_episodes']} train / {summary['val_episodes']} val), "
        f"{summary['train_samples']} training samples, {summary['image_size']} px, {summary['memory_mb']} MB of frames "
        f"on {device} ({time.perf_counter() - t0:.1f} s)")
    if lang.encoded_now:
        say(f"[sft] encoded {len(lang.encoded_now)} new instruction(s) with {lang.encoder}")
    data_meta = {"files": [{"path": str(f), "sha256": sha256_file(f)} for f in files] if is_main else [],
                 "tasks": list(job.tasks) if job.tasks else None, **{k: summary[k] for k in (
                     "episodes", "train_episodes", "val_episodes", "train_samples", "val_samples", "image_size")}}

    # 3. model, optimizer, schedule, EMA
    torch.manual_seed(sc.seed)
    model = FlowPolicy(cfg).to(device)
    opt = torch.optim.AdamW(_param_groups(model, sc.weight_decay), lr=sc.lr, betas=(0.9, 0.95), eps=1e-8,
                            **({"fused": True} if use_cuda else {}))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, sc))
    sampler = EpochSampler(data.train.size, sc.seed, rank)
    if loaded is not None:
        st = loaded.train_state
        raw = st.get("model") if sc.ema > 0 else None
        if sc.ema > 0 and raw is None:
            raise ck.CheckpointError(f"{loaded.path} was trained without EMA; resume with the same --ema (0)")
        if sc.ema == 0 and st.get("model") is not None:
            raise ck.CheckpointError(f"{loaded.path} was trained with EMA; resume with the same --ema")
        model.load_state_dict(raw if raw is not None else loaded.weights)
        ema = EMA(model, sc.ema) if sc.ema > 0 else None
        if ema is not None:
            ema.net.load_state_dict(loaded.weights)
        try:
            opt.load_state_dict(st["optimizer"])
            sched.load_state_dict(st["scheduler"])
            sampler.load_state_dict(st["sampler"])
        except (KeyError, ValueError, RuntimeError) as e:
            raise ck.CheckpointError(f"{loaded.path}/train_state.pt does not fit this run ({e}); resume with the "
                                     "same data and settings, or start a new RUN") from None
        rng.restore(st["rng"])
        if world > 1:  # each rank continues its own stream; rank offsets keep them apart
            torch.manual_seed(int(torch.randint(0, 2**31, (1,)).item()) + rank)
        say(f"[sft] resuming from {loaded.path} (step {start})")
    else:
        if init is not None:
            model.load_state_dict(init.weights)
            say(f"[sft] weights from {init.path}")
        ema = EMA(model, sc.ema) if sc.ema > 0 else None
        torch.manual_seed(sc.seed * 7919 + rank)
    nparams = model.num_parameters
    say(f"[sft] policy: {nparams / 1e6:.2f} M parameters; {sc.steps} steps of batch {sc.batch_size} "
        f"({world} process(es), {device}); start at step {start}, stop at {stop}")

    objective = _make_objective(model)
    if world > 1:
        from torch.nn.parallel import DistributedDataParallel as DDP

        objective = DDP(objective, device_ids=[local_rank] if use_cuda else None)
    learner = Learner(model, ema, opt, sched, sampler, objective, Batcher(data, lang_table, norm, cfg, device),
                      torch.autocast("cuda", dtype=torch.bfloat16, enabled=use_cuda and sc.bf16), data, sc,
                      local_batch, device)
    return SFTState(learner, start, stop, world, is_main, say, norm, lang, source, data_meta, nparams)


# ----------------------------------------------------------------------------------- one step
def train_step(L: Learner, step: int):
    """One optimizer step on the next batch; returns the loss (on the device: no host sync)
    and the gradient norm."""
    import torch

    batch = L.batcher(L.data.train, L.sampler.next(L.local_batch), train=True)
    with L.autocast:
        loss = L.objective(*batch)
    L.opt.zero_grad(set_to_none=True)
    loss.backward()
    gnorm = torch.nn.utils.clip_grad_norm_(L.model.parameters(), L.sc.grad_clip if L.sc.grad_clip > 0 else float("inf"))
    L.opt.step()
    L.sched.step()
    if L.ema is not None:
        L.ema.update(L.model, min(L.sc.ema, (1 + step) / (10 + step)))  # a short warm-up of the decay
    return loss.detach().float(), gnorm


def validate(L: Learner) -> float | None:
    """Flow-matching loss of the saved weights (the EMA's) on the validation episodes, with
    fixed noise and times, without touching training's RNG."""
    import torch

    from wmrl.policy.model import flow_matching_loss

    if L.data.val.size == 0:
        return None
    net = L.ema.net if L.ema is not None else L.model
    net.eval()
    total, count = 0.0, 0
    n = min(L.data.val.size, VAL_MAX_SAMPLES)
    devices = [L.device] if L.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices), torch.no_grad(), L.autocast:
        torch.manual_seed(L.sc.seed + 12345)
        for s in range(0, n, L.local_batch):
            idx = torch.arange(s, min(n, s + L.local_batch))
            main_, wrist_, lang_, prop_, act_, mask_ = L.batcher(L.data.val, idx, train=False)
            loss = flow_matching_loss(net, net.encode(main_, wrist_, lang_, prop_), act_, mask_)
            total += float(loss) * len(idx)
            count += len(idx)
    net.train()
    return total / max(1, count)


def save(S: SFTState, job: SFTJob, step: int, full: bool, last_losses: dict) -> Path:
    """Weights (the EMA's), statistics, language cache; with ``full`` the training state too."""
    L, sc = S.learner, job.sft
    state = None
    if full:
        state = {"step": step, "optimizer": L.opt.state_dict(), "scheduler": L.sched.state_dict(),
                 "rng": rng.capture(), "sampler": L.sampler.state_dict(),
                 "model": L.model.state_dict() if L.ema is not None else None,
                 "world_size": S.world, "sft": asdict(sc)}
    extra = {"sft": asdict(sc), "profile": job.profile, "ema": sc.ema > 0, "data": S.data_meta,
             "losses": last_losses, "norm_from": str(S.source.path) if S.source is not None else "training episodes",
             "command": job.command, **job.extra}
    path = ck.save_checkpoint(ck.step_dir(job.run, step, KIND), L.ema.net if L.ema is not None else L.model,
                              step=step, image_size=L.data.image_size, norm=S.norm, lang=S.lang, train_state=state,
                              extra=extra)
    ck.update_latest(job.run, resume_command=job.command)
    return path


# ----------------------------------------------------------------------------------- the loop
def main(job: SFTJob) -> dict:
    from tqdm import tqdm

    S = init_state(job)
    if isinstance(S, dict):
        return S  # nothing to train
    L, sc, say = S.learner, job.sft, S.say
    layout = RunLayout(job.run)
    metrics = MetricsLog(layout.log("sft"), tag="sft", tensorboard=layout.tensorboard("sft") if job.tensorboard else None,
                         start_step=S.start, enabled=S.is_main, say=say)
    bar = tqdm(total=sc.steps, initial=S.start, desc="sft", unit="step", disable=not (job.progress and S.is_main),
               dynamic_ncols=True)
    L.model.train()
    last = {"loss": float("nan"), "val_loss": None}
    saved: list[str] = []
    t_log, n_log, t_start, trained = time.perf_counter(), 0, time.perf_counter(), 0
    loss_sum = 0.0
    try:
        for step in range(S.start + 1, S.stop + 1):
            loss, gnorm = train_step(L, step)
            loss_sum = loss_sum + loss  # summed on the device, read at log time
            n_log += 1
            trained += 1
            if step % sc.log_interval == 0 or step == S.stop:
                mean_loss = float(loss_sum) / n_log
                if not math.isfinite(mean_loss):
                    raise FloatingPointError(f"loss is {mean_loss} near step {step}; lower --lr (rerunning resumes "
                                             "from the last full checkpoint)")
                now = time.perf_counter()
                sps = n_log * sc.batch_size / max(1e-9, now - t_log)
                last["loss"] = mean_loss
                metrics.write({"step": step, "loss": mean_loss, "lr": L.sched.get_last_lr()[0], "grad_norm": float(gnorm),
                               "samples_per_s": round(sps, 1), "epoch": L.sampler.epoch, "time": time.time()})
                bar.set_postfix(loss=f"{mean_loss:.4f}", sps=f"{sps:.0f}")
                t_log, n_log, loss_sum = now, 0, 0.0
            if step % sc.eval_interval == 0 or step == S.stop:
                v = validate(L) if S.is_main else None
                if v is not None:
                    last["val_loss"] = v
                    metrics.write({"step": step, "val_loss": v, "time": time.time()})
            if S.is_main and (step % sc.save_interval == 0 or step == S.stop):
                full = step % sc.full_interval == 0 or step == S.stop
                saved.append(str(save(S, job, step, full, dict(last))))
            bar.update(1)
        if S.world > 1:  # rank 0 saved last: leave together (see wmrl.rl.ranks.close), not on an error
            import torch.distributed as dist

            dist.barrier()
    finally:
        bar.close()
        metrics.close()
        if S.world > 1:
            import torch.distributed as dist

            dist.destroy_process_group()
    elapsed = time.perf_counter() - t_start
    sps = trained * sc.batch_size / max(1e-9, elapsed)
    say(f"[sft] {trained} steps in {elapsed:.1f} s ({sps:.1f} samples/s); last loss {last['loss']:.4f}"
        + (f", val {last['val_loss']:.4f}" if last["val_loss"] is not None else ""))
    if saved:
        say(f"[sft] newest checkpoint: {saved[-1]}")
    if S.is_main and metrics.path.exists():
        from wmrl.plots import loss_curve

        if (png := loss_curve(metrics.path, layout.logs / "sft_loss.png")) is not None:
            say(f"[sft] loss curve: {png}")
    return {"step": S.stop, "trained_steps": trained, "checkpoints": saved, "samples_per_s": sps, **last,
            "parameters": S.nparams}


def _init_path(init: str, run: Path) -> Path:
    p = Path(init)
    if p.is_dir():
        return p
    if init.isdigit():
        return ck.resolve(run, int(init), KIND).path
    raise ck.CheckpointError(f"--init {init}: no such checkpoint folder (give RUN/weights/sft/global_step_N)")
