"""Train one world model (one view) with DeepSpeed: ``python python/wm_update.py --view main``.

Read top to bottom: ``init_state`` checks inputs (the DeepSpeed checkpoint's and the
manifest's hashes), decodes transitions, builds the DeepSpeed engine from the JSON config
(ZeRO stage and precision there; micro batch, accumulation 4, learning rate, clipping and
schedule filled in from ``WMTrainConfig``) and resumes the newest checkpoint if there is one;
``train_step`` is one optimizer update; ``validate``; ``save`` every ``save_interval`` updates
and at the end; ``main`` is the short loop with the stop rule.

Files (``V`` = main or wrist), all under ``RUN/worldmodels/V/``:

* ``deepspeed/global_stepN/``  DeepSpeed's checkpoint, written by every rank, with client
  state: step, data position, RNG states, config name, git commit, manifest hash;
* ``global_step_N/``           the weights for inference (``FrameWorldModel.save_pretrained``:
  ``model.safetensors`` with the proprio statistics, ``config.json`` with config, lineage, hashes);
* ``status.json``              step, target, whether it finished or stopped on request;
* ``STOP``                     written by the controller: save after the next complete
  optimizer update and stop (the seed's stop rule for the main model).

Logs: ``RUN/logs/wm_V.jsonl`` (loss, frame/proprio loss, lr, samples/s, validation).
Rerunning the same command continues from the newest checkpoint.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from wmrl import rng
from wmrl.config import ConfigError, WMTrainConfig, WorldModelConfig
from wmrl.device import before_process_group, free_port, pick_device
from wmrl.fileio import hash_tree, sha256_file, write_json
from wmrl.layout import RunLayout, step_name
from wmrl.logs import MetricsLog

STOP_FILE = "STOP"


@dataclass
class WMJob:
    view: str
    run: Path
    manifest: Path
    model: WorldModelConfig
    train: WMTrainConfig
    profile: str = "default"
    device: str = "auto"  # auto | cpu | cuda
    ds_config: str | None = None  # default: the train config's CPU or GPU file
    stop_after: int | None = None  # stop here with a checkpoint (the schedule still targets train.steps)
    progress: bool = True
    init_pair: Path | None = None  # a fresh start takes this model pair's weights of the view (a cycle's update)


class WMConfigError(ConfigError):
    """Bad input to a world-model training: said before any training step."""


def ds_config(path: str | os.PathLike, t: WMTrainConfig, on_gpu: bool, world: int, total_steps: int | None = None) -> dict:
    """The DeepSpeed JSON with micro batch, accumulation, clipping, optimizer and schedule
    filled in from ``t`` where the file leaves them out; inconsistent batch sizes refused."""
    from wmrl.fileio import read_json
    from wmrl.lineage import REPO

    path = Path(path)
    if not path.is_absolute() and not path.exists() and (REPO / path).exists():
        path = REPO / path  # the kit's own configs, from any working directory
    cfg = read_json(path, WMConfigError, "give a DeepSpeed JSON config with --ds-config (see data/worldmodel/)")
    cfg.setdefault("train_micro_batch_size_per_gpu", t.micro_batch)
    cfg.setdefault("gradient_accumulation_steps", t.grad_accum)
    cfg.setdefault("gradient_clipping", t.grad_clip)
    cfg.setdefault("optimizer", {"type": "AdamW", "params": {"lr": t.lr, "weight_decay": t.weight_decay,
                                                             "betas": [0.9, 0.999], "torch_adam": True}})
    cfg.setdefault("scheduler", {"type": "WarmupCosineLR", "params": {
        "total_num_steps": total_steps or t.steps, "warmup_num_steps": t.warmup, "warmup_min_ratio": 0.0,
        "cos_min_ratio": 0.1}})
    if not on_gpu and (cfg.get("bf16", {}).get("enabled") or cfg.get("fp16", {}).get("enabled")):
        raise WMConfigError(f"{path} enables bf16/fp16, which DeepSpeed's CPU path does not train; "
                            f"use {t.ds_config_cpu} on a machine without GPUs")
    product = cfg["train_micro_batch_size_per_gpu"] * cfg["gradient_accumulation_steps"] * world
    if "train_batch_size" in cfg and cfg["train_batch_size"] != product:
        raise WMConfigError(
            f"{path}: train_batch_size={cfg['train_batch_size']} but micro batch {cfg['train_micro_batch_size_per_gpu']} x "
            f"accumulation {cfg['gradient_accumulation_steps']} x {world} process(es) = {product}; fix one of them "
            "or drop train_batch_size (it is derived)")
    cfg["train_batch_size"] = product
    return cfg


def init_distributed(on_gpu: bool) -> tuple[int, int]:
    """DeepSpeed's process group; a plain ``python`` process becomes a world of one."""
    import deepspeed
    import torch.distributed as dist

    if "RANK" not in os.environ:
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=os.environ.get("MASTER_PORT") or str(free_port()))
    before_process_group()
    deepspeed.init_distributed(dist_backend="nccl" if on_gpu else "gloo")
    return dist.get_rank(), dist.get_world_size()


def check_resume(state_file: Path, world: int, model: WorldModelConfig) -> None:
    """A DeepSpeed checkpoint resumes only with the world size and the model architecture it
    was saved with, and only when every file of it is the one written (SHA-256 recorded at
    save; DeepSpeed's own load unpickles its client state, so nothing unverified reaches it)."""
    if not state_file.exists():
        return
    saved = json.loads(state_file.read_text())
    want = json.loads(json.dumps(asdict(model)))  # tuples as lists, as the record holds them
    if saved.get("model") is not None:  # (records from before the architecture was kept: unchecked)
        # a field added to the config since the record was written had its default then
        defaults = json.loads(json.dumps(asdict(type(model)(view=model.view))))
        saved["model"] = {**{k: v for k, v in defaults.items() if k not in saved["model"]}, **saved["model"]}
    if saved.get("model") not in (None, want):
        changed = ", ".join(f"{k} {saved['model'].get(k)} -> {v}" for k, v in want.items() if saved["model"].get(k) != v)
        raise WMConfigError(f"{state_file.parent} holds a {model.view} world model of another architecture ({changed}): "
                            "the profile's model changed since it was saved (a newer default?); use a new RUN, "
                            f"remove {state_file.parent} to start this view afresh, or train with the saved settings")
    if saved.get("world_size") != world:
        raise WMConfigError(f"{state_file.parent} was saved by {saved.get('world_size')} process(es), this run has "
                            f"{world}: resume with the same GPU group size, or start a new RUN")
    latest = state_file.parent / "latest"
    if saved.get("tag") and latest.exists() and latest.read_text().strip() != saved["tag"]:
        raise WMConfigError(f"{latest} names {latest.read_text().strip()}, the run's record {saved['tag']}: the "
                            f"folder was changed by hand; remove {state_file.parent} to start this view afresh")
    for rel, sha in saved.get("files", {}).items():
        f = state_file.parent / rel
        if not f.is_file() or sha256_file(f) != sha:
            raise WMConfigError(f"{f} is missing or changed since it was saved (SHA-256 differs): remove "
                                f"{state_file.parent} to start this view afresh, or put the original back")


class Objective(torch.nn.Module):
    """Wraps the model so DeepSpeed's forward returns the loss (bf16 autocast on a GPU; the
    loss is computed in float32)."""

    def __init__(self, model, proprio_weight: float):
        super().__init__()
        self.model, self.proprio_weight = model, proprio_weight

    def forward(self, frames, target, actions, proprio, next_proprio):
        # autocast as well: DeepSpeed's bf16 engine need not cast every submodule alike
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=frames.is_cuda):
            return self.model.loss(target, frames, actions, proprio, next_proprio, self.proprio_weight)


def own_context(model, data, idx: torch.Tensor, batch: dict, fraction: float, view: str, norm: dict) -> dict:
    """Train on the model's own frames as context, where imagination will put them: for about
    ``fraction`` of the batch (rows whose transition has a predecessor in its episode), the
    latest context frame and the proprio are replaced by the model's one-chunk prediction from
    the predecessor's real context (no gradient through it). Open loop every context frame after
    the first chunk is generated, and a model trained on real context alone never sees the
    errors it then builds on (drift); this is the one-step form of self-forcing / scheduled
    sampling. The older context frames stay real; the wrist model's main-view frame too."""
    prev = data.previous[idx]
    rows = torch.nonzero((prev >= 0) & (torch.rand(idx.shape, device=idx.device) < fraction)).flatten()
    if not len(rows):
        return batch
    pb = data.batch(prev[rows], view, model.cfg.main_condition, norm)
    from wmrl.worldmodel.model import own_actions

    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16, enabled=pb["frames"].is_cuda):
        frame, proprio = model.generate(pb["frames"], own_actions(model.cfg, pb["actions"]), pb["proprio"])
    frames, own = batch["frames"].clone(), batch["proprio"].clone()
    frames[rows, model.cfg.context - 1] = frame.to(frames.dtype)
    own[rows] = proprio.to(own.dtype)
    return {**batch, "frames": frames, "proprio": own}


def speed_up(objective: "Objective", t: WMTrainConfig) -> "Objective":
    """The training config's speed options, in place (parameter names, hence checkpoints and
    exported weights, stay as they are): NHWC layout, cuDNN's algorithm search, the model's
    fast kernels and ``torch.compile`` of the loss."""
    import torch

    torch.backends.cudnn.benchmark = t.cudnn_benchmark  # set either way, as the layout option below
    objective.model.use_fast_kernels(t.fast_kernels)
    if t.channels_last:
        objective.model.use_channels_last()
    if t.compile:
        import torch._inductor.config as inductor

        # read when the first update compiles; set either way, so one process's earlier choice
        # does not carry over (bench/wm_throughput.py compiles several variants in one process)
        inductor.force_layout_optimization = t.compile_nhwc
        objective.compile(mode=t.compile_mode)
    return objective


def _load_data(job: WMJob, device):
    """Manifest (hashes verified first) -> training and validation transitions."""
    from wmrl.data.manifest import load_manifest
    from wmrl.data.trajectory import TrajectoryError
    from wmrl.worldmodel.data import Transitions, load_split

    load_manifest(job.manifest, verify=True)
    # both views load at once, and every rank of a GPU group: share the cores among them
    local = os.environ.get("LOCAL_WORLD_SIZE") or os.environ.get("LOCAL_SIZE") or "1"  # torchrun / DeepSpeed
    per_rank = len(os.sched_getaffinity(0)) // (2 * int(local))
    try:  # every file validated by the worker that decodes it (one pass over the files, in parallel)
        manifest, train, val = load_split(job.manifest, job.model.chunk_size, verify=False, workers=max(1, per_rank),
                                          validate=True, phases=job.train.all_phases)
    except TrajectoryError as e:
        raise WMConfigError(str(e)) from None
    size = {e.main.shape[1] for e in train + val}
    if size != {job.model.image_size}:
        raise WMConfigError(f"trajectories have {sorted(size)} px frames, the {job.view} model is configured for "
                         f"{job.model.image_size} px: collect at that size or pick the matching --profile")
    tr = Transitions(train, job.model.context, device, job.model.action_history)
    va = Transitions(val, job.model.context, device, job.model.action_history) if val else None
    return manifest, tr, va


def export_weights(engine, out: Path, cfg: WorldModelConfig, stats: dict, meta: dict, is_rank0: bool) -> None:
    """Inference weights (float32, the proprio statistics in full precision) and config.json,
    written by rank 0 through ``FrameWorldModel.save_pretrained``."""
    from wmrl.worldmodel.model import FrameWorldModel

    if engine.zero_optimization_stage() == 3:
        state = engine._zero3_consolidated_16bit_state_dict()  # every rank takes part
    else:
        state = engine.module.model.state_dict()
    if not is_rank0:
        return
    with torch.random.fork_rng(devices=[]):  # building a module draws its init: keep training's RNG untouched
        model = FrameWorldModel(cfg)
    model.load_state_dict({k.removeprefix("model."): v.detach().float().cpu() for k, v in state.items()})
    model.set_proprio_stats({k: v.float().cpu() for k, v in stats.items()})
    model.save_pretrained(out, meta=meta)


def init_from_pair(model, pair_dir: Path, view: str) -> None:
    """Load the view's weights of a model pair (hashes verified) into ``model``; the
    architectures must match (same profile)."""
    from wmrl.release.pair import load_pair
    from wmrl.worldmodel.model import FrameWorldModel

    pair = load_pair(pair_dir)
    src = FrameWorldModel.from_pretrained(pair.part(view), verify=False)  # load_pair checked every hash
    if src.cfg != model.cfg:
        raise WMConfigError(f"--init-pair {pair_dir}: its {view} model has another architecture ({src.cfg}) than "
                            f"this profile's ({model.cfg}); update with the profile that trained it")
    model.load_state_dict(src.state_dict())


@dataclass
class WMState:
    """``init_state``'s result: what ``train_step``, ``validate``, ``save`` and the loop use."""

    job: WMJob
    engine: Any  # the DeepSpeed engine (model, optimizer, schedule, precision)
    train: Any  # Transitions
    val: Any  # Transitions or None
    sampler: Any  # MixedSampler (new data at the manifest's ratio), part of the client state
    stats: dict  # proprio statistics (saved with the inference weights)
    rank: int
    world: int
    device: Any
    out: Path  # RUN/worldmodels/VIEW
    ckpt_dir: Path  # its deepspeed/
    manifest_sha: str
    meta: dict  # config and lineage, recorded with every export
    step: int  # updates done


def init_state(job: WMJob) -> WMState:
    """Inputs checked (the DeepSpeed checkpoint's hashes, the manifest's), data decoded, the
    process group and engine built, and the newest checkpoint resumed if there is one."""
    import deepspeed

    from wmrl.lineage import git_commit
    from wmrl.worldmodel.data import MixedSampler, proprio_stats
    from wmrl.worldmodel.model import FrameWorldModel

    device = pick_device(job.device, int(os.environ.get("LOCAL_RANK", "0")))
    on_gpu = device.type == "cuda"
    if on_gpu:
        torch.cuda.set_device(device)
    out = RunLayout(job.run).wm_view(job.view)
    out.mkdir(parents=True, exist_ok=True)
    t = job.train
    world_env = int(os.environ.get("WORLD_SIZE", "1"))
    ckpt_dir = out / "deepspeed"
    check_resume(ckpt_dir / "wmrl_state.json", world_env, job.model)  # before anything loads
    manifest, train, val = _load_data(job, device)  # before the process group: bad input fails fast
    ds_cfg = ds_config(job.ds_config or (t.ds_config_gpu if on_gpu else t.ds_config_cpu), t, on_gpu, world_env)
    rank, world = init_distributed(on_gpu)
    torch.manual_seed(t.seed + rank)

    model = FrameWorldModel(job.model)
    if job.init_pair is not None and not (ckpt_dir / "latest").exists():
        init_from_pair(model, job.init_pair, job.view)  # the previous cycle's model, updated on the new data
    engine, _, _, _ = deepspeed.initialize(model=speed_up(Objective(model, t.proprio_loss_weight), t),
                                           model_parameters=model.parameters(), config=ds_cfg)
    stats = {k: v.to(device) for k, v in proprio_stats(train).items()}
    sampler = MixedSampler(train.is_new, manifest["new_ratio"], seed=t.seed * 1000 + rank)
    manifest_sha = sha256_file(job.manifest)

    step = 0
    if (ckpt_dir / "latest").exists():
        _, client = engine.load_checkpoint(str(ckpt_dir))
        if client.get("manifest_sha256") != manifest_sha:
            raise WMConfigError(f"{ckpt_dir} was trained on another manifest; use a new RUN or remove that folder")
        step = int(client["step"])
        sampler.load_state_dict(client["sampler"])
        rng.restore(client["rng"][rank] if rank < len(client["rng"]) else client["rng"][0])
    # The model reads the statistics in training as it will in imagination (proprio_motion's
    # targets, the wrist warp, the pose maps): the ones exported with its weights, set after
    # any checkpoint load (one saved before they were set would carry zeros and ones).
    engine.module.model.set_proprio_stats(stats)
    lineage = {"profile": job.profile, "view": job.view, "git_commit": git_commit(), "manifest": str(job.manifest),
               "manifest_sha256": manifest_sha, "ds_config": ds_cfg, "world_size": world}
    return WMState(job, engine, train, val, sampler, stats, rank, world, device, out, ckpt_dir, manifest_sha,
                   {"train": asdict(t), **lineage}, step)


def train_step(S: WMState) -> tuple[torch.Tensor, dict]:
    """One optimizer update (``grad_accum`` micro batches; DeepSpeed steps at the boundary);
    returns the last micro batch's loss and its parts."""
    E, job = S.engine, S.job
    parts = {}
    for _ in range(E.gradient_accumulation_steps()):
        idx = S.sampler.next(E.train_micro_batch_size_per_gpu()).to(S.device)
        b = S.train.batch(idx, job.view, job.model.main_condition, S.stats)
        if job.train.self_context > 0:
            b = own_context(E.module.model, S.train, idx, b, job.train.self_context, job.view, S.stats)
        loss, parts = E(**b)
        E.backward(loss)
        E.step()
    S.step += 1
    return loss, parts


def validate(S: WMState) -> float | None:
    """The same batches and noise at every validation, without touching training's RNG."""
    t = S.job.train
    if S.val is None or t.val_batches == 0:
        return None
    S.engine.eval()
    g = torch.Generator().manual_seed(12345)
    losses = []
    with torch.no_grad(), torch.random.fork_rng(devices=[S.device] if S.device.type == "cuda" else []):
        torch.manual_seed(54321)
        for _ in range(t.val_batches):
            idx = torch.randint(S.val.size, (t.micro_batch,), generator=g).to(S.device)
            b = S.val.batch(idx, S.job.view, S.job.model.main_condition, S.stats)
            losses.append(float(S.engine(**b)[0]))
    S.engine.train()
    return sum(losses) / len(losses)


def save(S: WMState, reason: str) -> None:
    """DeepSpeed checkpoint (every rank) with the client state, its files' hashes, and the
    inference weights (rank 0)."""
    import torch.distributed as dist

    rngs = [None] * S.world
    dist.all_gather_object(rngs, rng.capture())
    tag = f"global_step{S.step}"
    S.engine.save_checkpoint(str(S.ckpt_dir), tag=tag, client_state={
        "step": S.step, "sampler": S.sampler.state_dict(), "rng": rngs, "config_name": S.job.profile,
        "git_commit": S.meta["git_commit"], "manifest_sha256": S.manifest_sha})
    dist.barrier()  # every rank's shard is on disk before rank 0 hashes them
    export_weights(S.engine, S.out / step_name(S.step), S.job.model, S.stats, {**S.meta, "step": S.step}, S.rank == 0)
    if S.rank == 0:
        files = {f"{tag}/{rel}": sha for rel, sha in hash_tree(S.ckpt_dir / tag).items()}
        write_json(S.ckpt_dir / "wmrl_state.json", {"step": S.step, "world_size": S.world, "tag": tag, "files": files,
                                                    "model": asdict(S.job.model)})
        write_json(S.out / "status.json", {"view": S.job.view, "step": S.step, "target": S.job.train.steps,
                                           "reason": reason, "weights": str(S.out / step_name(S.step))})


def main(job: WMJob) -> dict:
    import torch.distributed as dist
    from tqdm import tqdm

    S = init_state(job)
    t = job.train
    if S.step >= t.steps:  # finished in an earlier run: nothing to do
        return {"view": job.view, "step": S.step, "reason": "already at target", "wall_s": 0.0,
                "weights": str(S.out / step_name(S.step)), "samples_per_s": 0.0}
    log = MetricsLog(RunLayout(job.run).log(f"wm_{job.view}"), tag=f"wm_{job.view}", enabled=S.rank == 0)
    bar = tqdm(total=t.steps, initial=S.step, desc=f"wm {job.view}", unit="update", disable=not job.progress or S.rank)
    reason = "target"
    per_update = S.engine.train_micro_batch_size_per_gpu() * S.engine.gradient_accumulation_steps() * S.world
    t0, seen = time.perf_counter(), 0
    while S.step < t.steps:
        loss, parts = train_step(S)
        seen += per_update
        step = S.step
        bar.update(1)
        # the seed's stop rule: the controller asks, we stop after this complete update
        flag = torch.tensor([float((S.out / STOP_FILE).exists())], device=S.device)  # NCCL reduces GPU tensors only
        dist.all_reduce(flag)
        stop_requested = bool(flag.item())
        if S.rank == 0 and (step % t.log_interval == 0 or step == 1):
            log.write({"step": step, "loss": float(loss.detach()), **{k: float(v) for k, v in parts.items()},
                       "lr": S.engine.get_lr()[0], "samples_per_s": round(seen / (time.perf_counter() - t0), 1),
                       "time": time.time()})
            bar.set_postfix(loss=f"{float(loss.detach()):.4f}")
        if step % t.eval_interval == 0 or step == t.steps:
            v = validate(S)
            if v is not None:
                log.write({"step": step, "val_loss": v, "time": time.time()})
        if stop_requested:
            reason = "stop requested"
            break
        if job.stop_after and step >= job.stop_after and step < t.steps:
            reason = f"--stop-after {job.stop_after}"
            break
        if step % t.save_interval == 0 and step < t.steps:
            save(S, "interval")
    bar.close()
    save(S, reason)
    log.close()
    wall = time.perf_counter() - t0
    dist.barrier()
    return {"view": job.view, "rank": S.rank, "step": S.step, "reason": reason, "wall_s": round(wall, 1),
            "weights": str(S.out / step_name(S.step)), "samples_per_s": round(seen / max(wall, 1e-9), 1)}
