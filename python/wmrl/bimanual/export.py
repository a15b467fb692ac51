"""The portable student: export a finished Stage 3 run, then generate video with it.

Export folder (relative names only; it can be moved or copied anywhere)::

    student.safetensors   the student's EMA weights (``net_ema``, chosen explicitly; never the
                          raw weights, the frozen real score or the critic)
    tokenizer.json        the caption tokenizer of the bundle the student was trained on
    export.json           format, [model], image size, the exact step schedule the Stage 3
                          root saved, the action metadata (contract, asinh statistics, domain
                          IDs, sources), the source checkpoint's identity as hashes (no paths),
                          and the SHA-256 of both files above

``export_student`` refuses a root that is not the last of a finished Stage 3 run and weights
that are not finite, writes into a temporary folder beside the target, reads that folder back
in a fresh Python process (hashes, strict load, one generated block) and only then renames it
into place: a folder with that name is always a complete, verified export.

``generate`` rolls the student out from a context clip (its first frame or frames), an action
sequence and a domain, block by block with the KV cache and the saved schedule, optionally next
to a teacher root sampled with its own Euler steps; one MP4 (real | student | teacher) and one
``.npz`` of the frames per clip, and a JSON report with PSNR and frames per second.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from wmrl import __version__
from wmrl.bimanual import contract
from wmrl.bimanual.bundle import Bundle
from wmrl.bimanual.config import ModelConfig, StageConfig
from wmrl.bimanual.tokenizer import CaptionTokenizer
from wmrl.bimanual.train import _torch_load, bind_root, describe_root
from wmrl.fileio import atomic_path, sha256_file, write_json

FORMAT = "wmrl-bimanual-student"
FORMAT_VERSION = 1
WEIGHTS, TOKENIZER, META = "student.safetensors", "tokenizer.json", "export.json"


class ExportError(ValueError):
    """The export or the generation cannot go ahead as asked; the message says what to do."""


# ------------------------------------------------------------------------------ the student
@dataclass
class Student:
    """A student ready to generate: network, schedule and what turns a clip into its inputs."""

    net: Any
    schedule: list[float]
    tokenizer: CaptionTokenizer
    offset: np.ndarray  # asinh statistics (float32, 64 slots), as the loader uses them
    scale: np.ndarray
    domains: dict[str, int]
    image_size: int
    window: int  # transitions per training window: the default length of a generated clip
    meta: dict[str, Any]  # export.json (or what it will be)


def check_exportable(root: Path) -> dict[str, Any]:
    """checkpoint.json of the last root of a finished Stage 3 run; anything else is refused."""
    meta = bind_root(str(root), "--checkpoint")
    if meta.get("kind") != "stage" or meta.get("stage") != 3:
        raise ExportError(f"{root} is {describe_root(meta)}; export takes the last iteration root of a finished Stage 3 (SF-DMD) run")
    max_iter = int(meta["config"]["trainer"]["max_iter"])
    if int(meta["iteration"]) < max_iter:
        raise ExportError(f"{root}: Stage 3 is unfinished (iteration {meta['iteration']} of {max_iter}); rerun its training "
                          "command to finish it, then export its last iteration root")
    if not meta.get("schedule"):
        raise ExportError(f"{root}: checkpoint.json records no step schedule; it was not written by this kit's Stage 3")
    return meta


def _finite_or_refuse(state: dict, where: str) -> None:
    import torch

    for k, v in state.items():
        if v.is_floating_point() and not torch.isfinite(v).all():
            raise ExportError(f"{where}: {k} holds non-finite values (the run diverged); nothing exported")


def student_from_root(cfg: StageConfig, root: str | os.PathLike) -> Student:
    """The EMA student of a finished Stage 3 root with the bundle's action metadata: exactly
    what ``export_student`` writes (and what generates "before export")."""
    from wmrl.bimanual.distill import check_architecture
    from wmrl.bimanual.train import build_model, load_regular_weights

    root = Path(root)
    meta = check_exportable(root)
    check_architecture(cfg, meta, str(root))
    bundle = Bundle(cfg.data.bundle)
    if bundle.fingerprint != meta.get("bundle_fingerprint"):
        raise ExportError(f"{root} was trained on another bundle than {bundle.path}; give the run's bundle "
                          "(DATA=... or data.bundle=...): its statistics and domain IDs go into the export")
    state = _torch_load(root, "model.pt").get("net_ema")
    if state is None:
        raise ExportError(f"{root}: holds no EMA weights (net_ema); the student is exported from its EMA only")
    _finite_or_refuse(state, f"{root}/model.pt net_ema")
    net = build_model(cfg, bundle)
    load_regular_weights(net, state, skip_prefixes=(), where=str(root))
    m = bundle.manifest
    export_meta = {
        "format": FORMAT, "format_version": FORMAT_VERSION,
        "weights": {"file": WEIGHTS, "variant": "net_ema", "tensors": len(state)},
        "schedule": [float(x) for x in meta["schedule"]],
        "model": meta["config"]["model"],
        "image_size": int(m["image"]["height"]), "vocab_size": bundle.tokenizer().vocab_size, "tokenizer": TOKENIZER,
        "window_transitions": int(m["window"]["transitions"]),
        "action": {"input": "raw actions (T, 59) and their validity mask; normalised here with these statistics",
                   "contract": m["action_contract"], "statistics": m["statistics"], "domains": m["domains"],
                   "sources": [{k: s[k] for k in ("name", "domain", "domain_id", "normalized_weight")} for s in m["sources"]]},
        "source": {"stage": 3, "iteration": meta["iteration"], "run_name": meta.get("run_name"),
                   "checkpoint_sha256": sha256_file(root / "checkpoint.json"),
                   "parent_checkpoint_sha256": meta.get("parent_checkpoint_sha256"),
                   "reference_checkpoint_sha256": meta.get("reference_checkpoint_sha256"),
                   "bundle_fingerprint": meta.get("bundle_fingerprint"), "optimizer_steps": meta.get("optimizer_steps"),
                   "git_commit": meta.get("git_commit"), "kit_version": meta.get("kit_version")},
        "exported_by": {"kit_version": __version__},
    }
    return Student(net.eval(), export_meta["schedule"], bundle.tokenizer(), bundle.offset, bundle.scale, dict(m["domains"]),
                   export_meta["image_size"], export_meta["window_transitions"], export_meta)


def weights_digest(state: dict) -> str:
    """One SHA-256 over names, dtypes, shapes and bytes of every tensor: the same weights give
    the same digest whichever file format carried them."""
    import hashlib

    import torch

    h = hashlib.sha256()
    for k in sorted(state):
        v = state[k].detach().cpu().contiguous()
        h.update(f"{k}|{v.dtype}|{tuple(v.shape)}|".encode())
        h.update(v.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


_ABSOLUTE = re.compile(r"^(/|~|[A-Za-z]:[\\/])")


def _absolute_strings(obj, where: str = "") -> list[str]:
    if isinstance(obj, str):
        return [f"{where}={obj}"] if _ABSOLUTE.match(obj) else []
    if isinstance(obj, dict):
        return [x for k, v in obj.items() for x in _absolute_strings(v, f"{where}.{k}" if where else str(k))]
    if isinstance(obj, (list, tuple)):
        return [x for i, v in enumerate(obj) for x in _absolute_strings(v, f"{where}[{i}]")]
    return []


def _local_paths(folder: Path, also: tuple[str, ...] = ()) -> list[str]:
    """Local absolute paths an export must not carry: in export.json's values, and this
    machine's home, working folder and the given paths anywhere in its text parts."""
    found = [f"{META}: {x}" for x in _absolute_strings(json.loads((folder / META).read_text()))]
    needles = {str(Path.home()), os.getcwd(), *also} - {"", "/"}
    with open(folder / WEIGHTS, "rb") as f:  # safetensors: 8-byte length, then a JSON header
        header = f.read(int.from_bytes(f.read(8), "little")).decode("utf-8", "replace")
    for name, text in ((META, (folder / META).read_text()), (TOKENIZER, (folder / TOKENIZER).read_text()), (WEIGHTS, header)):
        found += [f"{name} holds {n}" for n in needles if n in text]
    return found


def load_student(path: str | os.PathLike, device: str = "cpu") -> Student:
    """An export folder, checked (format, SHA-256 of both files, finite weights, strict load)."""
    import torch
    from safetensors.torch import load_file

    from wmrl.bimanual.model import VideoWorldModel

    path = Path(path)
    if not (path / META).is_file():
        raise ExportError(f"{path}: no {META}; not a student export (make wm-export writes one)")
    try:
        meta = json.loads((path / META).read_text())
    except ValueError as e:
        raise ExportError(f"{path / META}: not valid JSON ({e}); the export is damaged") from None
    if meta.get("format") != FORMAT or meta.get("format_version") != FORMAT_VERSION:
        raise ExportError(f"{path}: format {meta.get('format')!r} v{meta.get('format_version')} is not {FORMAT!r} v{FORMAT_VERSION}")
    for name, digest in meta.get("files", {}).items():
        if not (path / name).is_file() or sha256_file(path / name) != digest:
            raise ExportError(f"{path / name}: missing or its SHA-256 differs from {META}; the export is damaged")
    state = load_file(str(path / WEIGHTS))
    _finite_or_refuse(state, str(path / WEIGHTS))
    net = VideoWorldModel(ModelConfig(**meta["model"]), image_size=meta["image_size"], vocab_size=meta["vocab_size"])
    net.load_state_dict(state, strict=True)
    st = meta["action"]["statistics"]
    dev = torch.device(device)
    return Student(net.to(dev).eval(), [float(x) for x in meta["schedule"]], CaptionTokenizer.load(path),
                   np.asarray(st["offset"], np.float32), np.asarray(st["scale"], np.float32),
                   {k: int(v) for k, v in meta["action"]["domains"].items()}, int(meta["image_size"]),
                   int(meta["window_transitions"]), meta)


def verify_export(path: str | os.PathLike) -> dict[str, Any]:
    """What the fresh process of the read-back reports: loads, generates one block, digests."""
    import torch

    s = load_student(path)
    problems = _local_paths(Path(path))
    n = s.image_size
    ctx = Clip("check", np.zeros((1, n, n, 3), np.uint8), np.zeros((1, contract.SEMANTIC_DIM), np.float32),
               np.zeros((1, contract.SEMANTIC_DIM), bool), min(s.domains.values()), "")
    frames, _, _ = rollout(s.net, clip_batch(s, ctx, context_frames=1, length=1), context_frames=1, schedule=s.schedule, seed=0)
    if not np.isfinite(frames).all():
        problems.append("a generated block is not finite")
    return {"passed": not problems, "problems": problems, "weights_digest": weights_digest(s.net.state_dict()),
            "schedule": s.schedule, "tensors": len(s.net.state_dict()), "torch": torch.__version__}


def export_student(cfg: StageConfig, root: str | os.PathLike, out: str | os.PathLike) -> dict[str, Any]:
    """Write the portable student of a finished Stage 3 root to ``out`` (see the module doc)."""
    from safetensors.torch import save_file

    root, out = Path(root), Path(out)
    check_exportable(root)
    if (out / META).is_file():  # a rerun of the same export: nothing to do
        prev = json.loads((out / META).read_text())
        if prev.get("source", {}).get("checkpoint_sha256") == sha256_file(root / "checkpoint.json"):
            return {"exported": str(out), "already": True, "schedule": prev["schedule"], "source": prev["source"]}
    if out.exists():
        raise FileExistsError(f"{out} already exists and is not an export of {root}; choose another STUDENT_EXPORT (--out)")
    s = student_from_root(cfg, root)
    state = {k: v.detach().cpu().contiguous() for k, v in s.net.state_dict().items()}
    digest = weights_digest(state)
    tmp = out.parent / f".{out.name}.partial"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    try:
        save_file(state, str(tmp / WEIGHTS), metadata={"format": "pt", "variant": "net_ema"})
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp / WEIGHTS, 0o666 & ~umask)  # readable like every other file, not the writer's private 0600
        s.tokenizer.save(tmp)
        meta = {**s.meta, "weights": {**s.meta["weights"], "digest": digest},
                "files": {WEIGHTS: sha256_file(tmp / WEIGHTS), TOKENIZER: sha256_file(tmp / TOKENIZER)}}
        write_json(tmp / META, meta)
        bad = _local_paths(tmp, (str(root.resolve()), str(Path(cfg.data.bundle).resolve()), str(out.resolve())))
        if bad:
            raise ExportError(f"the export would carry local paths ({'; '.join(bad[:3])}); nothing exported")
        back = read_back(tmp)
        if not back["passed"] or back["weights_digest"] != digest:
            raise ExportError(f"the fresh-process read-back of {tmp} disagrees ({back['problems'] or 'weights digest differs'}); "
                              "nothing exported")
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return {"exported": str(out), "already": False, "weights": WEIGHTS, "variant": "net_ema", "weights_digest": digest,
            "schedule": meta["schedule"], "source": meta["source"], "read_back": back}


def read_back(folder: Path) -> dict[str, Any]:
    """``verify_export`` in a new Python process: nothing of this process's state can help."""
    python_dir = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [python_dir, os.environ.get("PYTHONPATH")])))
    code = ("import json, sys\nfrom wmrl.bimanual.export import verify_export\n"
            "print('READBACK ' + json.dumps(verify_export(sys.argv[1])))")
    r = subprocess.run([sys.executable, "-c", code, str(folder)], env=env, capture_output=True, text=True, timeout=1800)
    line = next((x for x in r.stdout.splitlines() if x.startswith("READBACK ")), None)
    if r.returncode != 0 or line is None:
        last = (r.stderr.strip().splitlines() or ["no output"])[-1]
        raise ExportError(f"the fresh-process read-back of {folder} failed ({last}); nothing exported")
    return json.loads(line[len("READBACK "):])


# -------------------------------------------------------------------------------- contexts
@dataclass
class Clip:
    """What generation starts from: context frame(s) (and real frames to compare with, where
    there are more), the raw action sequence, a domain and a caption."""

    name: str
    frames: np.ndarray  # (K, H, W, 3) uint8
    actions: np.ndarray  # (T, 59) raw
    mask: np.ndarray  # (T, 59) bool
    domain_id: int
    caption: str


def _bundle_clip(bundle: Bundle, eid: str) -> Clip:
    if eid not in bundle.episodes:
        some = ", ".join(sorted(bundle.episodes)[:4])
        raise ExportError(f"{bundle.path}: no episode {eid!r} (e.g. {some})")
    e = bundle.episodes[eid]
    acts, mask = bundle.read_actions(eid)
    return Clip(eid, bundle.read_frames(eid), acts, mask, int(e["domain_id"]), e["caption"])


def _npz_clip(path: Path, domains: dict[str, int]) -> Clip:
    need = ("frames", "actions", "mask", "domain", "caption")
    with np.load(path, allow_pickle=False) as z:
        missing = [k for k in need if k not in z.files]
        if missing:
            raise ExportError(f"{path}: a context clip needs {list(need)}; missing {missing} (frames (K,H,W,3) uint8, "
                              "raw actions (T,59), mask (T,59) bool, domain name or ID, caption)")
        dom = z["domain"].item()
        caption = str(z["caption"])
        frames, acts, mask = z["frames"], z["actions"], z["mask"].astype(bool)
    if isinstance(dom, str):
        if dom not in domains:
            raise ExportError(f"{path}: unknown domain {dom!r}; the student knows {domains}")
        dom = domains[dom]
    if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[-1] != 3:
        raise ExportError(f"{path}: frames must be (K, H, W, 3) uint8, not {frames.shape} {frames.dtype}")
    if acts.ndim != 2 or acts.shape[1] != contract.SEMANTIC_DIM or mask.shape != acts.shape:
        raise ExportError(f"{path}: actions and mask must be (T, {contract.SEMANTIC_DIM}) each, not {acts.shape} / {mask.shape}")
    return Clip(path.stem, frames, acts, mask, int(dom), caption)


def read_contexts(specs: list[str], domains: dict[str, int], *, limit: int | None = None) -> list[Clip]:
    """``--context`` values: a clip file (.npz), a bundle episode (BUNDLE:EPISODE_ID) or a
    bundle folder (its validation episodes, at most ``limit``)."""
    clips: list[Clip] = []
    for spec in specs:
        p = Path(spec)
        if p.is_file() and p.suffix == ".npz":
            clips.append(_npz_clip(p, domains))
        elif p.is_dir():
            b = Bundle(p)
            eids = [e for e, m in b.episodes.items() if m["split"] == "val"][:limit]
            clips += [_bundle_clip(b, e) for e in eids]
        elif ":" in spec and Path(spec.rsplit(":", 1)[0]).is_dir():
            folder, eid = spec.rsplit(":", 1)
            clips.append(_bundle_clip(Bundle(folder), eid))
        else:
            raise ExportError(f"--context {spec}: give a clip (.npz), a bundle episode BUNDLE:EPISODE_ID or a bundle "
                              "folder (its validation episodes)")
    if not clips:
        raise ExportError("no context clips: the bundle has no validation episodes; name episodes as BUNDLE:EPISODE_ID")
    names: dict[str, int] = {}
    for c in clips:  # unique output names
        names[c.name] = names.get(c.name, 0) + 1
        if names[c.name] > 1:
            c.name = f"{c.name}_{names[c.name]}"
    for c in clips:
        if int(c.domain_id) not in domains.values():
            raise ExportError(f"{c.name}: domain ID {c.domain_id} is unknown to the student ({domains})")
    return clips


def clip_batch(s: Student, clip: Clip, *, context_frames: int, length: int | None) -> dict[str, np.ndarray]:
    """One clip packed as the loader packs a window (same normalisation, masks, tokens)."""
    t = len(clip.actions)
    n = length or min(t, s.window)
    if n > t:
        raise ExportError(f"{clip.name}: {t} actions; --frames {n} asks for more")
    if n + 1 > s.net.cfg.max_frames:
        raise ExportError(f"{clip.name}: {n + 1} frames exceed the model's {s.net.cfg.max_frames} temporal positions; lower --frames")
    if not 1 <= context_frames <= min(len(clip.frames), n):
        raise ExportError(f"{clip.name}: --context-frames {context_frames} must be between 1 and "
                          f"{min(len(clip.frames), n)} (frames in the clip, frames to generate)")
    if clip.frames.shape[1:3] != (s.image_size, s.image_size):
        raise ExportError(f"{clip.name}: frames are {clip.frames.shape[1]}x{clip.frames.shape[2]}; the student makes "
                          f"{s.image_size}x{s.image_size} (resize the clip)")
    raw, valid = contract.pad(clip.actions[:n].astype(np.float64), clip.mask[:n].astype(bool))
    actions = np.where(valid, contract.normalize(raw, s.offset, s.scale), 0.0).astype(np.float32)
    k = min(len(clip.frames), n + 1)
    video = np.zeros((n + 1, s.image_size, s.image_size, 3), np.uint8)
    video[:k] = clip.frames[:k]
    ids, cmask = s.tokenizer.encode(clip.caption)
    one = {"video": video.transpose(0, 3, 1, 2).astype(np.float32) / 127.5 - 1.0, "frame_mask": np.ones(n + 1, bool),
           "actions": actions, "action_mask": valid, "step_mask": np.ones(n, bool), "domain_id": np.int64(clip.domain_id),
           "caption_ids": np.asarray(ids, np.int64), "caption_mask": np.asarray(cmask, bool)}
    return {k_: np.asarray(v)[None] for k_, v in one.items()} | {"real_frames": np.int64(k)}


def rollout(net, batch: dict, *, context_frames: int, schedule=None, steps: int | None = None, seed: int = 0):
    """(frames (F, H, W, 3) uint8, the same in [-1, 1], seconds): an autoregressive rollout
    from the context with a generator seeded by ``seed`` alone (a clip's frames do not depend
    on the other clips of a batch run)."""
    import torch

    dev = next(net.parameters()).device
    b = {k: torch.from_numpy(np.asarray(v)).to(dev) for k, v in batch.items() if k != "real_frames"}
    g = torch.Generator(device=dev).manual_seed(seed)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    t0 = time.perf_counter()
    out = net.rollout(b, context_frames=context_frames, teacher_forced=False, steps=steps, schedule=schedule, generator=g)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    secs = time.perf_counter() - t0
    x = out[0].float().cpu()
    return ((x.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).permute(0, 2, 3, 1).numpy(), x, secs


# ------------------------------------------------------------------------------ generation
def load_teacher(root: str | os.PathLike, s: Student, cfg: StageConfig | None = None, device: str = "cpu",
                 steps: int | None = None):
    """A comparison model from an iteration root (its EMA), with its own sampler: the saved
    schedule of a distilled root, else ``steps`` Euler steps (default ``model.denoise_steps`` of
    ``cfg`` where given, else of the run's recorded config)."""
    import torch

    from wmrl.bimanual.distill import check_architecture
    from wmrl.bimanual.model import VideoWorldModel

    root = Path(root)
    meta = bind_root(str(root), "--teacher")
    if meta.get("kind") != "stage":
        raise ExportError(f"--teacher {root} is {describe_root(meta)}; give an iteration root of a Stage 1 run")
    if cfg is not None:
        check_architecture(cfg, meta, f"--teacher {root}")
        mcfg = cfg.model
    else:
        mcfg = ModelConfig(**meta["config"]["model"])
    net = VideoWorldModel(mcfg, image_size=s.image_size, vocab_size=s.tokenizer.vocab_size)
    state = _torch_load(root, "model.pt")
    try:
        net.load_state_dict(state["net_ema"] if state.get("net_ema") is not None else state["net"], strict=True)
    except RuntimeError as e:
        raise ExportError(f"--teacher {root}: its weights do not fit the student's image size/tokenizer or [model] "
                          f"({str(e).splitlines()[0]})") from None
    sampler = {"schedule": meta["schedule"]} if meta.get("schedule") else {"steps": steps or mcfg.denoise_steps}
    return net.to(torch.device(device)).eval(), sampler, meta


def _side_by_side(panels: list[np.ndarray]) -> np.ndarray:
    f, h = panels[0].shape[:2]
    gap = np.full((f, h, 2, 3), 255, np.uint8)
    out = [panels[0]]
    for p in panels[1:]:
        out += [gap, p]
    return np.concatenate(out, 2)


def generate(student_dir: str | os.PathLike, contexts: list[str], out: str | os.PathLike, *, teacher: str | None = None,
             teacher_cfg: StageConfig | None = None, context_frames: int = 1, length: int | None = None, seed: int = 0,
             limit: int | None = None, fps: int = 6, device: str = "auto", teacher_steps: int | None = None
             ) -> dict[str, Any]:
    """Videos of the exported student (and a teacher) from each context; see the module doc.
    ``teacher_steps``: the teacher's Euler steps (default: its config's ``model.denoise_steps``)."""
    import torch

    from wmrl.bimanual.loader import write_video
    from wmrl.bimanual.model import psnr
    from wmrl.device import pick_device
    from wmrl.worldmodel.fidelity import ssim

    dev = str(pick_device(device))
    s = load_student(student_dir, dev)
    clips = read_contexts(contexts, s.domains, limit=limit)
    out = Path(out)
    single = out.suffix == ".mp4"
    if single and len(clips) != 1:
        raise ExportError(f"--out {out} is one video but there are {len(clips)} contexts; give a folder for several")
    t_net, t_sampler, t_meta = load_teacher(teacher, s, teacher_cfg, dev, teacher_steps) if teacher else (None, None, None)
    report: dict[str, Any] = {"student": str(student_dir), "schedule": s.schedule, "device": dev, "seed": seed,
                              "teacher": None if teacher is None else {"root": str(teacher), "stage": t_meta.get("stage"),
                                                                        "iteration": t_meta.get("iteration"), **t_sampler},
                              "clips": []}
    for clip in clips:
        batch = clip_batch(s, clip, context_frames=context_frames, length=length)
        k = int(batch["real_frames"])
        real = torch.from_numpy(batch["video"][0])
        gen, gen_x, secs = rollout(s.net, batch, context_frames=context_frames, schedule=s.schedule, seed=seed)
        made = gen.shape[0] - context_frames

        def score(x, secs_):
            q = {"seconds": round(secs_, 4), "frames_per_s": made / max(secs_, 1e-9)}
            if k > context_frames:  # real frames to compare with
                per_frame = psnr(x[None, context_frames:k], real[None, context_frames:k])[0]
                q["psnr_db"] = float(per_frame.mean())
                q["psnr_db_by_frame"] = [round(float(v), 3) for v in per_frame]  # where an open loop falls off
                if min(x.shape[-2:]) >= 11:  # SSIM's 11-pixel window must fit
                    q["ssim"] = float(ssim(x[context_frames:k].float(), real[context_frames:k].float()).mean())
            return q

        rec = {"name": clip.name, "frames": int(gen.shape[0]), "context_frames": context_frames, "real_frames": k,
               "domain_id": clip.domain_id, "caption": clip.caption, "student": score(gen_x, secs)}
        if k > context_frames:  # the baseline to beat: the last context frame held still
            held = score(real[context_frames - 1:context_frames].expand_as(gen_x), 0.0)
            rec["hold"] = {key: v for key, v in held.items() if key in ("psnr_db", "ssim", "psnr_db_by_frame")}
        arrays = {"generated": gen, "real": ((real[:k].clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()}
        panels = [gen]
        if t_net is not None:
            tg, tg_x, tsecs = rollout(t_net, batch, context_frames=context_frames, seed=seed, **t_sampler)
            rec["teacher"] = score(tg_x, tsecs)
            arrays["teacher"] = tg
            panels.append(tg)
        if k == gen.shape[0]:
            panels.insert(0, arrays["real"])
        rec["panels"] = (["real"] if k == gen.shape[0] else []) + ["student"] + (["teacher"] if t_net is not None else [])
        video = out if single else out / f"{clip.name}.mp4"
        video.parent.mkdir(parents=True, exist_ok=True)
        rec["video"] = str(write_video(video, _side_by_side(panels), fps))
        with atomic_path(video.with_suffix(".npz"), suffix=".npz") as tmp:
            np.savez_compressed(tmp, **arrays)
        rec["arrays"] = str(video.with_suffix(".npz"))
        report["clips"].append(rec)
    report["summary"] = summarize(report["clips"])
    write_json(out.with_suffix(".json") if single else out / "generate.json", report)
    return report


def summarize(clips: list[dict]) -> dict[str, Any]:
    """Means over the clips per model (PSNR, SSIM, frames/s) and the student's speed-up over
    the teacher: the two figures distillation is for; ``hold``: the last context frame held
    still, the baseline a rollout has to beat."""
    out: dict[str, Any] = {"clips": len(clips)}
    for who in ("student", "teacher", "hold"):
        rows = [c[who] for c in clips if who in c]
        for key in ("psnr_db", "ssim", "frames_per_s"):
            vals = [r[key] for r in rows if key in r]
            if vals:
                out[f"{who}_{key}"] = round(float(np.mean(vals)), 4)
        curves = [r["psnr_db_by_frame"] for r in rows if "psnr_db_by_frame" in r]
        if curves:  # the mean PSNR n frames into the rollout, over the clips that reach n
            out[f"{who}_psnr_db_by_frame"] = [round(float(np.mean([c[i] for c in curves if len(c) > i])), 3)
                                              for i in range(max(map(len, curves)))]
    if out.get("teacher_frames_per_s"):
        # three significant figures: two decimals alone lose up to 1.3% of a speed-up under 0.4 (a loaded CPU)
        out["speedup"] = float(f"{out['student_frames_per_s'] / out['teacher_frames_per_s']:.3g}")
    return out
