"""The staged trainer: Stage 0 (bidirectional) and Stage 1 (teacher forcing); the same loop,
checkpoints and resume drive Stages 2 and 3 (``wmrl.bimanual.distill``).

Read top to bottom: ``resolve`` (the plan; reads JSON only, loads no weights) ->
``train`` (build model, load the start point, train, save iteration roots).

Run folder (``<job.output_root>/<job.name>/``)::

    config.json                      the resolved config of the run (a rerun must match)
    log.jsonl                        one line per logged iteration (loss, grad norm, lr, it/s)
    checkpoints/iter_000000012/      one *iteration root* per save:
        model.pt                     {"net": ..., "net_ema": ...}
        optim.pt                     optimizer and scheduler state
        trainer_state.pt             RNG states, loader state
        teacher.pt, critic.pt        Stages 2 and 3 only: the frozen teacher and the critic
                                     (training-only; never exported)
        checkpoint.json              stage, iteration, bundle fingerprint, parent, sha256 of
                                     the files above; written last: its presence = complete
    checkpoints/latest.txt           name of the newest complete iteration root

An iteration root is written under a temporary name and renamed into place when complete,
so a killed run leaves no half-written root a later stage could bind to.

Start points:

- Stage 0 from a *base checkpoint* (``bimanual.py base``) or fresh weights. The new
  action modules and ``net_ema.`` are not loaded from the base; every other weight loads
  strictly (missing or unexpected keys are errors). The built-in EMA step then copies the
  loaded/fresh weights into the EMA once.
- Stage 1 from the exact completed iteration root of a Stage 0 run: all regular weights load
  strictly, optimizer and scheduler start fresh, EMA copied once from the loaded weights.
- A rerun with the same run name, output root, bundle and parent resumes: iteration,
  weights, EMA, optimizer, scheduler, RNG and loader position come from the newest root
  (the EMA is restored, never re-copied).
"""

from __future__ import annotations

import math
import os
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from wmrl import __version__, rng
from wmrl.bimanual.bundle import Bundle, BundleError
from wmrl.bimanual.config import (DISTILL_STAGES, NEW_ACTION_MODULES, NON_ARCH_MODEL_KEYS, PARENT_STAGE, ModelConfig,
                                  StageConfig)
from wmrl.device import pick_device
from wmrl.ema import EMA
from wmrl.fileio import atomic_path, hash_tree, read_json, sha256_file, write_json
from wmrl.lineage import git_commit
from wmrl.logs import MetricsLog


class TrainError(ValueError):
    """The run cannot start or continue as asked; the message says what to do."""


def iter_name(iteration: int) -> str:
    return f"iter_{iteration:09d}"


# ----------------------------------------------------------------------- start points
def read_root(path: Path) -> dict[str, Any]:
    """checkpoint.json of a completed iteration root or base checkpoint (JSON only)."""
    return read_json(path / "checkpoint.json", TrainError, "no checkpoint.json: not a completed iteration root")


def bind_root(lp: str, field: str = "checkpoint.load_path") -> dict[str, Any]:
    """checkpoint.json of the exact completed iteration root that ``field`` names (JSON only)."""
    path = Path(lp)
    if not path.is_dir():
        raise TrainError(f"{field}={lp}: no such folder")
    if not (path / "checkpoint.json").is_file():
        roots = sorted(path.glob("iter_*")) or sorted(path.glob("checkpoints/iter_*"))
        hint = f"; bind its exact completed iteration root, e.g. {roots[-1]}" if roots else ""
        raise TrainError(f"{field}={lp} is not an iteration root (no checkpoint.json){hint}")
    meta = read_root(path)
    if not meta.get("complete"):
        raise TrainError(f"{lp}: the iteration root is incomplete (the save did not finish); use an earlier root")
    return meta


def describe_root(meta: dict[str, Any]) -> str:
    return "a base checkpoint" if meta.get("kind") == "base" else f"a Stage {meta.get('stage')} root"


def check_architecture(cfg: StageConfig, meta: dict[str, Any], where: str) -> None:
    """[model] must equal the one a root was trained with (all but the sampling steps). A key
    that root does not record has its default (roots made before the key existed)."""
    theirs = (meta.get("config") or {}).get("model") or meta.get("model")
    if not theirs:
        return  # a hand-made root records none: the strict weight load still checks every shape
    mine, default = cfg.to_dict()["model"], ModelConfig().__dict__
    diff = [f"{k} {mine[k]} vs {theirs.get(k, default[k])}" for k in mine
            if k not in NON_ARCH_MODEL_KEYS and mine[k] != theirs.get(k, default[k])]
    if diff:
        raise TrainError(f"{where}: [model] differs from that root's ({', '.join(diff)}); use the values its run was trained with")


def check_parent(cfg: StageConfig) -> dict[str, Any] | None:
    """The start point named by ``checkpoint.load_path``, checked before any weights load."""
    lp = cfg.checkpoint.load_path
    stage = cfg.job.stage
    if not lp:
        if stage == 0:
            return None  # fresh weights
        raise TrainError(f"stage {stage} needs checkpoint.load_path (its Stage {PARENT_STAGE[stage]} iteration root)")
    meta = bind_root(lp)
    if stage == 0:
        if meta.get("kind") not in ("base", "stage"):
            raise TrainError(f"{lp}: not a base checkpoint (kind={meta.get('kind')!r})")
    else:
        want = PARENT_STAGE[stage]
        if meta.get("kind") != "stage" or meta.get("stage") != want:
            raise TrainError(f"stage {stage} must start from a completed Stage {want} iteration root; {lp} is {describe_root(meta)}")
        check_architecture(cfg, meta, f"checkpoint.load_path={lp}")  # e.g. model.residual changes what the weights mean
    return meta


def latest_root(run_dir: Path) -> Path | None:
    ck = run_dir / "checkpoints"
    roots = sorted(p for p in ck.glob("iter_*") if p.is_dir() and (p / "checkpoint.json").is_file()) if ck.is_dir() else []
    return roots[-1] if roots else None


def resolve(cfg: StageConfig) -> dict[str, Any]:
    """The full plan of a run: config, data, load paths, EMA, parallelism, logging, resume.

    Reads only JSON files (bundle manifest, checkpoint.json): safe for ``--dry-run``."""
    try:
        bundle = Bundle(cfg.data.bundle)
    except BundleError as e:
        raise TrainError(str(e)) from None
    parent = check_parent(cfg)
    distill_plan = None
    if cfg.job.stage in DISTILL_STAGES:
        from wmrl.bimanual.distill import plan as plan_distill

        distill_plan = plan_distill(cfg, parent)
    resume = latest_root(cfg.run_dir)
    if resume is not None:
        meta = read_root(resume)
        if meta.get("bundle_fingerprint") != bundle.fingerprint:
            raise TrainError(f"run {cfg.run_dir} was trained on another bundle; rerun with the same bundle or choose a new job.name")
        if meta.get("stage") != cfg.job.stage:
            raise TrainError(f"run {cfg.run_dir} holds a Stage {meta.get('stage')} run; choose a new job.name for Stage {cfg.job.stage}")
        if (meta.get("parent") or "") != (str(Path(cfg.checkpoint.load_path).resolve()) if cfg.checkpoint.load_path else ""):
            raise TrainError(f"run {cfg.run_dir} started from parent {meta.get('parent') or 'fresh weights'}; rerun with that "
                             "checkpoint.load_path or choose a new job.name")
        ref = str(Path(cfg.checkpoint.reference).resolve()) if cfg.job.stage == 3 and cfg.checkpoint.reference else ""
        if (meta.get("reference") or "") != ref:
            raise TrainError(f"run {cfg.run_dir} started from reference {meta.get('reference')}; rerun with that "
                             "checkpoint.reference or choose a new job.name")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    backend = cfg.parallelism.backend
    if cfg.job.stage in DISTILL_STAGES and (world > 1 or backend == "deepspeed"):
        raise TrainError(f"stage {cfg.job.stage} runs in one process (parallelism.backend = plain or auto, one GPU): "
                         "launch it without several GPUS")
    if backend == "auto":
        backend = "deepspeed" if world > 1 else "plain"
    if backend == "plain" and world > 1:
        raise TrainError(f"{world} processes with parallelism.backend=plain would train {world} separate copies; "
                         "use backend auto or deepspeed")
    return {
        "stage": cfg.job.stage,
        "mode": cfg.mode,
        "run_dir": str(cfg.run_dir),
        "config": cfg.to_dict(),
        "data": {"bundle": str(bundle.path), "fingerprint": bundle.fingerprint,
                 "tokenizer": str(bundle.path / bundle.manifest["tokenizer"]),
                 "window_transitions": bundle.manifest["window"]["transitions"],
                 "image": bundle.manifest["image"], "sources": bundle.source_weights(),
                 "train_windows": sum(w["split"] == "train" for w in bundle.windows)},
        "load": ({"kind": "resume", "path": str(resume), "restores": ["iteration", "net", "net_ema", "optimizer",
                                                                      "scheduler", "rng", "loader"]
                  + (distill_plan["restores"] if distill_plan else [])}
                 if resume else distill_plan["load"] if distill_plan else
                 {"kind": "fresh" if parent is None else parent.get("kind"), "path": cfg.checkpoint.load_path or None,
                  "parent_stage": None if parent is None else parent.get("stage"),
                  "parent_iteration": None if parent is None else parent.get("iteration"),
                  "skipped_keys": (["net_ema.", *[f"{m}." for m in NEW_ACTION_MODULES]] if cfg.job.stage == 0 and parent else ["net_ema."]),
                  "strict": True}),
        "ema": {"enabled": cfg.ema.enabled, "beta": cfg.ema.beta,
                "callback": "built-in copy_once (fresh start) / restore (resume); no second EMA callback"},
        "parallelism": {"backend": backend, "world_size": world, "zero_stage": cfg.parallelism.zero_stage},
        "logging": {"wandb_mode": cfg.job.wandb_mode, "log": str(cfg.run_dir / "log.jsonl")},
        "schedule": {"max_iter": cfg.trainer.max_iter, "save_iter": cfg.checkpoint.save_iter,
                     "batch_size": cfg.data.batch_size},
        **({"distill": distill_plan["distill"]} if distill_plan else {}),
    }


# ------------------------------------------------------------------------------ helpers
def build_model(cfg: StageConfig, bundle: Bundle):
    from wmrl.bimanual.model import VideoWorldModel

    img = bundle.manifest["image"]
    if img["height"] != img["width"]:
        raise TrainError(f"bundle frames are {img['height']}x{img['width']}; the model expects square frames")
    if bundle.manifest["window"]["transitions"] + 1 > cfg.model.max_frames:
        raise TrainError(f"bundle windows have {bundle.manifest['window']['transitions'] + 1} frames > model.max_frames={cfg.model.max_frames}")
    if img["height"] % cfg.model.patch:
        raise TrainError(f"bundle frames {img['height']} px are not divisible by model.patch={cfg.model.patch}")
    return VideoWorldModel(cfg.model, image_size=img["height"], vocab_size=bundle.tokenizer().vocab_size)


def load_regular_weights(net, state: dict, *, skip_prefixes: tuple[str, ...], where: str) -> None:
    """Strict load of every weight except ``skip_prefixes`` (which keep their fresh values)."""
    own = net.state_dict()
    keep = {k: v for k, v in state.items() if not k.startswith(skip_prefixes)}
    expected = {k for k in own if not k.startswith(skip_prefixes)}
    missing, unexpected = sorted(expected - set(keep)), sorted(set(keep) - expected)
    if missing or unexpected:
        raise TrainError(f"{where}: weights do not match this model (missing {missing[:4]}{'...' if len(missing) > 4 else ''}, "
                         f"unexpected {unexpected[:4]}{'...' if len(unexpected) > 4 else ''}); check [model] against the checkpoint's config")
    bad = [k for k in keep if keep[k].shape != own[k].shape]
    if bad:
        raise TrainError(f"{where}: shape mismatch for {bad[:4]} (e.g. {tuple(keep[bad[0]].shape)} vs {tuple(own[bad[0]].shape)}); "
                         "the [model] section differs from the checkpoint's")
    own.update(keep)
    net.load_state_dict(own, strict=True)


def make_scheduler(opt, cfg: StageConfig, total: int | None = None):
    """Linear warmup, then cosine decay to 10% of the learning rate at ``total`` optimizer
    steps (default max_iter; Stage 3's two optimizers each count their own updates)."""
    import torch

    warm, total = cfg.trainer.warmup_iter, total or cfg.trainer.max_iter

    def factor(i: int) -> float:
        if i < warm:
            return (i + 1) / warm
        frac = (i - warm) / max(1, total - warm)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0)))

    return torch.optim.lr_scheduler.LambdaLR(opt, factor)


class Dist:
    """Rank, world size and barriers; one process without torch.distributed."""

    def __init__(self, enabled: bool):
        import torch

        self.enabled = enabled and torch.distributed.is_initialized()
        self.rank = torch.distributed.get_rank() if self.enabled else 0
        self.world = torch.distributed.get_world_size() if self.enabled else 1

    def barrier(self) -> None:
        if self.enabled:
            import torch

            torch.distributed.barrier()

    def state_file(self) -> str:
        return "trainer_state.pt" if self.world == 1 else f"trainer_state_rank{self.rank}.pt"


def save_root(run_dir: Path, iteration: int, *, net, ema, opt, sched, loader, meta: dict,
              engine=None, dist: Dist | None = None, files: dict | None = None, optim: dict | None = None) -> Path:
    """Write one complete iteration root atomically (temporary folder, then rename).

    With DeepSpeed every rank writes its ZeRO shards (``deepspeed/``) and its own RNG state;
    rank 0 writes the full weights and EMA (``model.pt``), ``checkpoint.json`` and renames.
    ``files``: more states to save by name (Stages 2/3: ``teacher.pt``, ``critic.pt``);
    ``optim``: more optimizer/scheduler states for ``optim.pt`` (Stage 3's critic)."""
    import shutil

    import torch

    dist = dist or Dist(False)
    ck = run_dir / "checkpoints"
    final = ck / iter_name(iteration)
    tmp = ck / f".{iter_name(iteration)}.partial"
    if dist.rank == 0:
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
    dist.barrier()
    if engine is not None:  # every rank must call it (rank-0-only saves hang)
        engine.save_checkpoint(str(tmp), tag="deepspeed")
    torch.save({"rng": rng.capture(), "loader": loader.state_dict(), "ema_copies": ema.copies if ema else 0},
               tmp / dist.state_file())
    if dist.rank == 0:
        torch.save({"net": net.state_dict(), "net_ema": ema.net.state_dict() if ema else None}, tmp / "model.pt")
        if engine is None:
            torch.save({"optimizer": opt.state_dict(), "scheduler": sched.state_dict(), **(optim or {})}, tmp / "optim.pt")
        for name, state in (files or {}).items():
            torch.save(state, tmp / name)
    dist.barrier()
    if dist.rank == 0:
        files = hash_tree(tmp)
        write_json(tmp / "checkpoint.json", {**meta, "iteration": iteration, "files": files, "complete": True})
        if final.exists():  # a root of the same iteration from an earlier attempt: replace it
            shutil.rmtree(final)
        os.replace(tmp, final)
        with atomic_path(ck / "latest.txt") as p:
            p.write_text(final.name + "\n")
    dist.barrier()
    return final


def _torch_load(root: Path, name: str):
    """A file of an iteration root, its SHA-256 checked against checkpoint.json first (where
    listed: a hand-made base may list none), then loaded as tensors and plain containers only
    (no pickled code)."""
    import torch

    digest = read_root(root).get("files", {}).get(name)
    if digest is not None and (not (root / name).is_file() or sha256_file(root / name) != digest):
        raise TrainError(f"{root / name}: missing or its SHA-256 differs from checkpoint.json; the checkpoint is damaged")
    return torch.load(root / name, map_location="cpu", weights_only=True)


def load_net_state(root: Path, *, use_ema: bool = False) -> dict:
    state = _torch_load(root, "model.pt")
    return state["net_ema"] if use_ema and state.get("net_ema") is not None else state["net"]


# --------------------------------------------------------------------------------- train
def _init_deepspeed(cfg: StageConfig):
    """torch.distributed through DeepSpeed; a plain ``python`` call becomes a world of one."""
    import torch

    if not torch.cuda.is_available():  # DeepSpeed picks its accelerator at import
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed

    if "MASTER_PORT" not in os.environ:  # a plain one-process call: any free local port
        from wmrl.device import free_port

        os.environ["MASTER_PORT"] = str(free_port())
    for k, v in (("MASTER_ADDR", "127.0.0.1"), ("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1")):
        os.environ.setdefault(k, v)
    if not torch.distributed.is_initialized():
        from wmrl.device import before_process_group

        before_process_group()
        deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo")
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    return deepspeed


def record_config(cfg: StageConfig, dist: Dist) -> dict[str, Any]:
    """Write the run's resolved config.json, or check a rerun against it (what may change on a
    resume: trainer, checkpoint, parallelism)."""
    saved_cfg = cfg.run_dir / "config.json"
    resolved = {k: v for k, v in cfg.to_dict().items() if k != "source"}
    # Stages 0/1 never read [distill]: runs started before it existed still resume
    free = ("trainer", "checkpoint", "parallelism") + (("distill",) if cfg.job.stage not in DISTILL_STAGES else ())
    if saved_cfg.exists():
        prev = read_json(saved_cfg, TrainError, "missing")
        prev_cmp = {k: v for k, v in prev.items() if k not in free}
        cur_cmp = {k: v for k, v in resolved.items() if k not in free}
        if prev_cmp != cur_cmp:
            raise TrainError(f"{saved_cfg}: this run was started with a different config (model/data/ema/job/distill); "
                             "rerun with the same TOML or choose a new job.name")
    dist.barrier()
    if dist.rank == 0:
        cfg.run_dir.mkdir(parents=True, exist_ok=True)
        write_json(saved_cfg, resolved)
    return resolved


def start_run(cfg: StageConfig, dist: Dist) -> tuple[dict, Any, Bundle]:
    """What every stage does first: record (or check) the run's config, pick the device, seed
    torch, numpy and random from ``trainer.seed``, open the bundle."""
    import numpy as np
    import torch

    resolved = record_config(cfg, dist)
    device = pick_device(cfg.trainer.device, int(os.environ.get("LOCAL_RANK", "0")))
    torch.manual_seed(cfg.trainer.seed)
    np.random.seed(cfg.trainer.seed)
    random.seed(cfg.trainer.seed)
    return resolved, device, Bundle(cfg.data.bundle)


def run_meta(cfg: StageConfig, bundle: Bundle, resolved: dict, backend: str, dist: Dist, net) -> dict[str, Any]:
    """What every iteration root of a run records in checkpoint.json."""
    import torch

    return {"kind": "stage", "stage": cfg.job.stage, "mode": cfg.mode, "run_name": cfg.job.name,
            "bundle": str(bundle.path), "bundle_fingerprint": bundle.fingerprint,
            "parent": str(Path(cfg.checkpoint.load_path).resolve()) if cfg.checkpoint.load_path else "",
            "parallelism": {"backend": backend, "world_size": dist.world,
                            "zero_stage": cfg.parallelism.zero_stage if backend == "deepspeed" else None},
            "config": resolved, "kit_version": __version__, "git_commit": git_commit(),
            "torch": torch.__version__, "model_params": sum(p.numel() for p in net.parameters())}


@dataclass
class StageState:
    """``init_state``'s result: the network, its optimizer, schedule, EMA, loader and (with
    DeepSpeed) engine, where training starts, and what every saved root records."""

    cfg: StageConfig
    dist: Dist
    device: Any
    net: Any
    ema: EMA | None
    opt: Any
    sched: Any
    loader: Any
    engine: Any  # DeepSpeed's engine, or None (plain PyTorch)
    start: int
    meta: dict
    summary: dict
    amp: bool

    def step(self, iteration: int) -> dict[str, Any]:
        """One trainer iteration; the record logged for it (``loss`` and ``grad_norm`` at least)."""
        loss, gnorm = train_step(self, iteration)
        return {"loss": float(loss), "grad_norm": float(gnorm)}

    def save(self, iteration: int) -> Path:
        return save_root(self.cfg.run_dir, iteration, net=self.net, ema=self.ema, opt=self.opt, sched=self.sched,
                         loader=self.loader, meta=self.meta, engine=self.engine, dist=self.dist)

    def final(self) -> dict[str, Any]:
        """What the run's summary adds at the end."""
        return {"ema_copies": self.ema.copies if self.ema else 0}


def init_state(cfg: StageConfig) -> StageState:
    """The plan checked, the run's config recorded (or compared), the model built, and the
    newest root of this run resumed or the parent checkpoint loaded."""
    import torch

    from wmrl.bimanual.loader import make_bimanual_local_dataloader

    plan = resolve(cfg)
    use_ds = plan["parallelism"]["backend"] == "deepspeed"
    deepspeed = _init_deepspeed(cfg) if use_ds else None
    dist = Dist(use_ds)
    run_dir = cfg.run_dir
    resolved, device, bundle = start_run(cfg, dist)
    net = build_model(cfg, bundle)
    loader = make_bimanual_local_dataloader(bundle, stage=cfg.job.stage, split="train",
                                            batch_size=cfg.data.batch_size, seed=cfg.data.seed)
    loader.rank, loader.world = dist.rank, dist.world  # each rank draws its own share of every step
    opt = torch.optim.AdamW(net.parameters(), lr=cfg.trainer.lr, weight_decay=cfg.trainer.weight_decay, betas=(0.9, 0.99))
    sched = make_scheduler(opt, cfg)
    ema = EMA(net, cfg.ema.beta) if cfg.ema.enabled else None

    resume = plan["load"]["kind"] == "resume"
    root = Path(plan["load"]["path"]) if resume else None
    if resume:
        rmeta = read_root(root)
        if rmeta.get("parallelism", {}).get("backend", "plain") != plan["parallelism"]["backend"] or \
                rmeta.get("parallelism", {}).get("world_size", 1) != dist.world:
            raise TrainError(f"{root} was saved with {rmeta.get('parallelism')}; resume with the same parallelism and "
                             f"number of processes (now {plan['parallelism']['backend']}, {dist.world})")
        state = _torch_load(root, "model.pt")
        net.load_state_dict(state["net"], strict=True)
        if not use_ds:
            o = _torch_load(root, "optim.pt")
            opt.load_state_dict(o["optimizer"])
            sched.load_state_dict(o["scheduler"])
        ts = _torch_load(root, dist.state_file())
        if ema:
            ema.net.load_state_dict(state["net_ema"], strict=True)  # restored, not re-copied
            ema.copies = ts["ema_copies"]
        loader.load_state_dict(ts["loader"])
        start = rmeta["iteration"]
    else:
        lp = cfg.checkpoint.load_path
        if lp:
            skip = ("net_ema.",) + tuple(f"{m}." for m in NEW_ACTION_MODULES) if cfg.job.stage == 0 else ("net_ema.",)
            load_regular_weights(net, load_net_state(Path(lp)), skip_prefixes=skip, where=lp)
        if ema:
            ema.copy_from(net)  # the one built-in EMA step
        start = 0
    net.to(device)
    if ema:
        ema.net.to(device)
    for st in opt.state.values():  # optimizer state follows the weights' device
        for k, v in st.items():
            if torch.is_tensor(v) and k != "step":
                st[k] = v.to(device)
    engine = None
    if use_ds:
        ds_config = {"train_micro_batch_size_per_gpu": cfg.data.batch_size, "gradient_accumulation_steps": 1,
                     "gradient_clipping": cfg.trainer.grad_clip, "steps_per_print": 10**9,
                     "zero_optimization": {"stage": cfg.parallelism.zero_stage}}
        engine, _, _, _ = deepspeed.initialize(model=net, optimizer=opt, lr_scheduler=sched, config=ds_config)
        if resume:  # ZeRO optimizer shards and scheduler (weights come from model.pt as well)
            engine.load_checkpoint(str(root), tag="deepspeed", load_optimizer_states=True, load_lr_scheduler_states=True)
    if resume:
        rng.restore(ts["rng"])  # last: building the engine must not shift the random stream

    meta = run_meta(cfg, bundle, resolved, plan["parallelism"]["backend"], dist, net)
    summary: dict[str, Any] = {"run_dir": str(run_dir), "start_iteration": start, "resumed": resume,
                               "ema_copies": ema.copies if ema else 0, "backend": plan["parallelism"]["backend"],
                               "world_size": dist.world, "rank": dist.rank}
    return StageState(cfg, dist, device, net, ema, opt, sched, loader, engine, start, meta, summary,
                      device.type == "cuda" and cfg.trainer.precision == "bf16")


def train_step(S: StageState, iteration: int):
    """One optimizer step on the next batch: (loss, gradient norm); non-finite values stop
    training with what to do."""
    import torch

    from wmrl.bimanual.model import flow_loss

    batch = {k: v.to(S.device) for k, v in S.loader.next_batch()[0].items()}
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=S.amp):
        loss, _ = flow_loss(S.net, batch, S.cfg.mode)
    if not torch.isfinite(loss):
        raise TrainError(f"iteration {iteration}: non-finite loss ({float(loss)}); lower trainer.lr or check the bundle "
                         "(make bimanual-materialize)")
    if S.engine is not None:  # clipping, optimizer, scheduler and zero_grad inside step()
        S.engine.backward(loss)
        S.engine.step()
        gnorm = torch.as_tensor(float(S.engine.get_global_grad_norm() or 0.0))
    else:
        S.opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(S.net.parameters(), S.cfg.trainer.grad_clip)
        if not torch.isfinite(gnorm):
            raise TrainError(f"iteration {iteration}: non-finite gradient norm; lower trainer.lr or check the bundle")
        S.opt.step()
        S.sched.step()
    if not torch.isfinite(gnorm):
        raise TrainError(f"iteration {iteration}: non-finite gradient norm; lower trainer.lr or check the bundle")
    if S.ema:
        S.ema.update(S.net)
    return loss.detach(), gnorm


def train(cfg: StageConfig, *, progress: bool = True, stop_after: int | None = None) -> dict[str, Any]:
    """Train (or resume) one stage. ``stop_after``: stop after that many iterations of this
    process without a final save (tests use it to simulate a kill)."""
    from tqdm import tqdm

    if cfg.job.stage in DISTILL_STAGES:
        from wmrl.bimanual.distill import init_distill

        S = init_distill(cfg)
    else:
        S = init_state(cfg)
    start, summary, dist, run_dir = S.start, S.summary, S.dist, cfg.run_dir
    if start >= cfg.trainer.max_iter:
        summary.update(final_iteration=start, iterations_run=0, checkpoint=str(latest_root(run_dir)), finished=True)
        return summary
    # the kit's JSONL log: a resumed run drops the records past its root and writes them again
    log = MetricsLog(run_dir / "log.jsonl", tag=f"bimanual_stage{cfg.job.stage}", start_step=start,
                     enabled=dist.rank == 0)
    S.net.train()
    t0, losses, it = time.time(), [], start
    bar = tqdm(range(start, cfg.trainer.max_iter), desc=f"stage {cfg.job.stage}", disable=not progress or dist.rank != 0,
               file=sys.stderr, initial=start, total=cfg.trainer.max_iter)
    last_save = None
    for it0 in bar:
        it = it0 + 1
        rec = S.step(it)
        losses.append(rec["loss"])
        if dist.rank == 0 and (it % cfg.trainer.log_iter == 0 or it == cfg.trainer.max_iter):
            log.write({"step": it, "iteration": it, **rec,
                       "lr": S.sched.get_last_lr()[0], "it_per_s": (it - start) / max(time.time() - t0, 1e-9)})
            bar.set_postfix(loss=f"{rec['loss']:.4f}")
        if it % cfg.checkpoint.save_iter == 0 or it == cfg.trainer.max_iter:
            last_save = S.save(it)
            if cfg.checkpoint.keep_last and dist.rank == 0:
                import shutil

                for old in sorted((run_dir / "checkpoints").glob("iter_*"))[: -cfg.checkpoint.keep_last]:
                    shutil.rmtree(old)
        if stop_after is not None and it - start >= stop_after:
            break
    log.close()
    elapsed = time.time() - t0
    summary.update(final_iteration=it, iterations_run=it - start, loss_first=losses[0], loss_last=losses[-1],
                   grad_norm_last=rec["grad_norm"], finite=True, it_per_s=(it - start) / max(elapsed, 1e-9),
                   checkpoint=str(last_save) if last_save else None, finished=it >= cfg.trainer.max_iter,
                   device=str(S.device), **S.final())
    return summary


def write_base(cfg: StageConfig, out: str | os.PathLike, *, from_root: str | None = None) -> Path:
    """A base checkpoint for Stage 0: regular weights only (no action modules, no EMA).

    ``from_root``: take the weights of an existing iteration root (its ``net``), otherwise
    fresh weights from ``trainer.seed``. The kit has no upstream base model to convert."""
    import torch

    out = Path(out)
    if (out / "checkpoint.json").exists():
        raise FileExistsError(f"{out} already holds a checkpoint; choose another OUT")
    bundle = Bundle(cfg.data.bundle)
    torch.manual_seed(cfg.trainer.seed)
    net = build_model(cfg, bundle)
    if from_root:
        load_regular_weights(net, load_net_state(Path(from_root)), skip_prefixes=(), where=from_root)
    state = {k: v for k, v in net.state_dict().items() if not k.startswith(tuple(f"{m}." for m in NEW_ACTION_MODULES))}
    out.mkdir(parents=True, exist_ok=True)
    torch.save({"net": state, "net_ema": None}, out / "model.pt")
    write_json(out / "checkpoint.json", {"kind": "base", "stage": None, "iteration": 0, "complete": True,
                                         "source": from_root or f"fresh (seed {cfg.trainer.seed})",
                                         "model": cfg.to_dict()["model"], "files": {"model.pt": sha256_file(out / "model.pt")}})
    return out


# ------------------------------------------------------------------------------ evaluate
def next_frame_scores(gen, real, copy, valid, gen_control=None) -> dict[str, float]:
    """Scores of predicted frames against the real ones, beside the copy-last baseline.

    ``gen``, ``real``, ``copy`` (and ``gen_control``): (B, F, 3, H, W) in [-1, 1]; ``valid``
    (B, F). Per-frame PSNR averaged over frames rewards the nearly still frames most (copying
    a still frame scores 40-80 dB), so the report also gives the PSNR of the frames' mean
    squared error ("pooled", where the frames that move weigh as their error does), SSIM, and
    the share of frames the model predicts better than copy-last. ``gen_control``: the same
    model given another window's actions; a model that reads its actions loses PSNR there."""
    import torch

    from wmrl.bimanual.model import psnr
    from wmrl.worldmodel.fidelity import ssim

    def pooled(a):  # the PSNR of the valid frames' mean squared error
        mse = (((a - real) / 2) ** 2).flatten(2).mean(-1)[valid]
        return float(10 * torch.log10(1 / mse.mean().clamp(min=1e-10)))

    def ssim_of(a):
        return ssim(a[valid].float(), real[valid].float())

    pm, pc = psnr(gen, real)[valid], psnr(copy, real)[valid]
    out = {"psnr_model_db": float(pm.mean()), "psnr_copy_last_db": float(pc.mean()),
           "psnr_model_pooled_db": pooled(gen), "psnr_copy_last_pooled_db": pooled(copy),
           "ssim_model": float(ssim_of(gen).mean()), "ssim_copy_last": float(ssim_of(copy).mean()),
           "frames_better_than_copy_last": float((pm > pc + 1e-6).float().mean())}
    if gen_control is not None:
        out["psnr_model_other_actions_db"] = float(psnr(gen_control, real)[valid].mean())
        out["psnr_model_other_actions_pooled_db"] = pooled(gen_control)
    return out


def evaluate(cfg: StageConfig, root: str | os.PathLike, *, max_windows: int = 64, steps: int | None = None,
             use_ema: bool = True, seed: int = 0, action_control: bool = True) -> dict[str, Any]:
    """Held-out next-chunk prediction: from true history (KV cache), generate the next block and
    compare with the real frames (``next_frame_scores``); the baseline copies the last real
    frame. A distilled root (Stages 2, 3) samples with its saved schedule unless ``steps`` asks
    for Euler steps. ``action_control``: also roll out each window with the actions of another
    window of its batch (a window alone in its batch: its own reversed in time), same noise."""
    import torch

    from wmrl.bimanual.loader import make_bimanual_local_dataloader

    root = Path(root)
    meta = read_root(root)
    bundle = Bundle(cfg.data.bundle)
    net = build_model(cfg, bundle)
    net.load_state_dict(load_net_state(root, use_ema=use_ema), strict=True)
    device = pick_device("auto")
    net.to(device).eval()
    loader = make_bimanual_local_dataloader(bundle, stage=cfg.job.stage, split="val", batch_size=cfg.data.batch_size)
    schedule = meta.get("schedule") if steps is None else None
    gens, reals, copies, valids, controls, n = [], [], [], [], [], 0
    t0 = time.time()
    for j, (batch, wins) in enumerate(loader.iter_val(limit=max_windows)):
        batch = {k: v.to(device) for k, v in batch.items()}
        g = torch.Generator(device=device).manual_seed(seed + j)  # the control draws the same noise
        gens.append(net.rollout(batch, context_frames=1, teacher_forced=True, steps=steps, generator=g,
                                schedule=schedule)[:, 1:])
        real = batch["video"]
        # baseline: every frame of a block predicted by the last real frame before the block
        f = real.shape[1]
        blocks = net.frame_block(torch.arange(f))
        first = torch.tensor([int(torch.nonzero(blocks == blocks[i])[0]) for i in range(f)], device=device)
        copies.append(real[:, (first - 1).clamp(min=0)][:, 1:])
        reals.append(real[:, 1:])
        valids.append(batch["frame_mask"][:, 1:])
        if action_control:
            other = dict(batch)
            if len(wins) > 1:
                other["actions"], other["action_mask"] = batch["actions"].roll(1, 0), batch["action_mask"].roll(1, 0)
            else:
                other["actions"], other["action_mask"] = batch["actions"].flip(1), batch["action_mask"].flip(1)
            g = torch.Generator(device=device).manual_seed(seed + j)
            controls.append(net.rollout(other, context_frames=1, teacher_forced=True, steps=steps, generator=g,
                                        schedule=schedule)[:, 1:])
        n += len(wins)
    valid = torch.cat(valids)
    scores = next_frame_scores(torch.cat(gens), torch.cat(reals), torch.cat(copies), valid,
                               torch.cat(controls) if controls else None)
    return {"checkpoint": str(root), "stage": meta.get("stage"), "iteration": meta.get("iteration"), "weights": "ema" if use_ema else "net",
            "val_windows": n, "frames": int(valid.sum()), **scores,
            "denoise_steps": len(schedule) if schedule else steps or cfg.model.denoise_steps, "schedule": schedule,
            "block_frames": cfg.model.block_frames,
            "seconds": round(time.time() - t0, 2), "device": str(device)}
