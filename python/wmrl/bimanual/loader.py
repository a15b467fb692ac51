"""The native loader: ``make_bimanual_local_dataloader`` and the ``materialize`` check.

The loader reads raw windows from a bundle and packs them for a stage:

- frames -> ``video`` (B, T+1, 3, H, W) float32 in [-1, 1], with ``frame_mask`` (B, T+1)
  (a window shorter than the bundle's T is padded by repeating its last frame, masked)
- raw actions -> asinh-normalised ``actions`` (B, T, 64) with ``action_mask`` (B, T, 64)
  (slot validity) and ``step_mask`` (B, T) (transition validity)
- ``domain_id`` (B,), ``caption_ids``/``caption_mask`` (B, L) from the bundle's tokenizer

Training draws sample i from a generator seeded by (seed, i): first a source by its
normalised weight, then one of that source's train windows uniformly. The loader's whole
state is the number of samples drawn, so a resumed run continues with exactly the samples
it would have seen (``state_dict``/``load_state_dict``). Validation iterates the val windows
in order. Stages 0 and 1 read the same stream; their packing differs inside the model
(bidirectional vs teacher forcing), not here.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from wmrl.bimanual import contract
from wmrl.bimanual.bundle import Bundle, BundleError

TENSOR_KEYS = ("video", "frame_mask", "actions", "action_mask", "step_mask", "domain_id", "caption_ids", "caption_mask")


class BimanualLoader:
    def __init__(self, bundle: Bundle, *, split: str, batch_size: int, seed: int = 0, cache: int = 64):
        if split not in ("train", "val"):
            raise ValueError(f"split={split!r}: train or val")
        self.bundle, self.split, self.batch_size, self.seed = bundle, split, batch_size, seed
        self.window = int(bundle.manifest["window"]["transitions"])
        self.tokenizer = bundle.tokenizer()
        self.windows = [w for w in bundle.windows if w["split"] == split]
        if not self.windows:
            raise BundleError(f"{bundle.path}: no {split} windows in this bundle")
        weights = bundle.source_weights()
        self.by_source = {s: [w for w in self.windows if w["source"] == s] for s in weights}
        self.sources = [s for s in weights if self.by_source[s]]
        p = np.array([weights[s] for s in self.sources])
        self.source_p = p / p.sum()  # renormalised over the sources present in this split
        self.position = 0  # samples drawn so far by all ranks together
        self.rank, self.world = 0, 1  # set by the trainer under torch.distributed
        self._cache: OrderedDict[str, tuple] = OrderedDict()
        self._cache_size = cache

    # -- state (resume) -------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"position": self.position, "split": self.split, "seed": self.seed, "fingerprint": self.bundle.fingerprint}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("fingerprint") not in (None, self.bundle.fingerprint):
            raise BundleError("the saved loader state belongs to another bundle; resume with the bundle the run started with")
        self.position = int(state["position"])

    # -- reading ----------------------------------------------------------------------------
    def _episode(self, eid: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if eid not in self._cache:
            acts, mask = self.bundle.read_actions(eid)
            frames = self.bundle.read_frames(eid)
            self._cache[eid] = (frames, acts, mask)
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        self._cache.move_to_end(eid)
        return self._cache[eid]

    def pack(self, window: dict) -> dict[str, np.ndarray]:
        """One window -> one packed sample (numpy)."""
        e = self.bundle.episodes[window["episode"]]
        frames, acts, mask = self._episode(e["id"])
        s, n, t = window["start"], window["transitions"], self.window
        video = np.empty((t + 1,) + frames.shape[1:], np.uint8)
        video[: n + 1] = frames[s : s + n + 1]
        video[n + 1 :] = frames[s + n]
        raw, valid = contract.pad(acts[s : s + n].astype(np.float64), mask[s : s + n])
        norm = contract.normalize(raw, self.bundle.offset, self.bundle.scale)
        actions = np.zeros((t, contract.PADDED_DIM), np.float32)
        amask = np.zeros((t, contract.PADDED_DIM), bool)
        actions[:n] = np.where(valid, norm, 0.0)
        amask[:n] = valid
        ids, cmask = self.tokenizer.encode(e["caption"])
        return {
            "video": (video.transpose(0, 3, 1, 2).astype(np.float32) / 127.5 - 1.0),
            "frame_mask": np.arange(t + 1) <= n,
            "actions": actions,
            "action_mask": amask,
            "step_mask": np.arange(t) < n,
            "domain_id": np.int64(e["domain_id"]),
            "caption_ids": np.asarray(ids, np.int64),
            "caption_mask": np.asarray(cmask, bool),
        }

    def _draw(self, i: int) -> dict:
        rng = np.random.default_rng([self.seed, i])
        src = self.sources[int(rng.choice(len(self.sources), p=self.source_p))]
        pool = self.by_source[src]
        return pool[int(rng.integers(len(pool)))]

    def next_batch(self):
        """The next training batch as torch tensors (and advances the position)."""
        base = self.position + self.rank * self.batch_size  # rank r takes its own slice of the step
        wins = [self._draw(base + k) for k in range(self.batch_size)]
        self.position += self.batch_size * self.world
        return collate([self.pack(w) for w in wins]), wins

    def __iter__(self) -> Iterator:
        while True:
            yield self.next_batch()[0]

    def iter_val(self, limit: int | None = None) -> Iterator:
        """Validation windows in order, batched (no state)."""
        wins = self.windows[:limit] if limit else self.windows
        for k in range(0, len(wins), self.batch_size):
            chunk = wins[k : k + self.batch_size]
            yield collate([self.pack(w) for w in chunk]), chunk


def collate(samples: list[dict[str, np.ndarray]]):
    import torch

    return {k: torch.from_numpy(np.stack([s[k] for s in samples])) for k in TENSOR_KEYS}


def make_bimanual_local_dataloader(bundle: str | os.PathLike | Bundle, *, stage: int, split: str = "train",
                                   batch_size: int = 8, seed: int = 0) -> BimanualLoader:
    """The one loader every stage uses; ``stage`` selects the stream (0..3 share windows)."""
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"stage={stage}: 0..3")
    b = bundle if isinstance(bundle, Bundle) else Bundle(bundle)
    return BimanualLoader(b, split=split, batch_size=batch_size, seed=seed)


# ------------------------------------------------------------------------------ previews
def _upscale(frames: np.ndarray, factor: int) -> np.ndarray:
    return frames.repeat(factor, axis=-3).repeat(factor, axis=-2)


def write_video(path: Path, frames: np.ndarray, fps: int = 6) -> Path:
    """(N, H, W, 3) uint8 -> MP4 (upscaled so a person can see it)."""
    from wmrl.fileio import write_video as write_clip

    return write_clip(path, _upscale(frames, max(1, 256 // frames.shape[1])), fps)


def write_sheet(path: Path, rows: list[np.ndarray]) -> Path:
    """Rows of (N, H, W, 3) frames -> one PNG contact sheet."""
    import imageio.v2 as imageio

    n = max(len(r) for r in rows)
    h, w = rows[0].shape[1:3]
    sheet = np.full((len(rows) * (h + 2), n * (w + 2), 3), 255, np.uint8)
    for i, r in enumerate(rows):
        for j, fr in enumerate(r):
            sheet[i * (h + 2) : i * (h + 2) + h, j * (w + 2) : j * (w + 2) + w] = fr
    imageio.imwrite(path, _upscale(sheet, max(1, 128 // h)))
    return path


def preview_episodes(bundle: Bundle, out: Path, count: int = 4) -> list[str]:
    """Decode a few episodes (both splits, every source) to a contact sheet and videos."""
    out.mkdir(parents=True, exist_ok=True)
    chosen, seen = [], set()
    for e in bundle.episodes.values():  # one per (source, split, caption) first, then fill up
        key = (e["source"], e["split"], e["caption"])
        if key not in seen:
            seen.add(key)
            chosen.append(e)
    chosen += [e for e in bundle.episodes.values() if e not in chosen]
    chosen = chosen[:count]
    rows, files = [], []
    for e in chosen:
        frames = bundle.read_frames(e["id"])
        idx = np.linspace(0, len(frames) - 1, min(8, len(frames))).round().astype(int)
        rows.append(frames[idx])
        files.append(str(write_video(out / f"{e['id']}.mp4", frames)))
    files.insert(0, str(write_sheet(out / "episodes.png", rows)))
    return files


def materialize(bundle_path: str | os.PathLike, *, batch_size: int = 2, patch: int = 8, seed: int = 0,
                out: str | os.PathLike | None = None) -> dict[str, Any]:
    """Read one packed Stage 0 batch through the real loader, check it, describe it."""
    import torch

    b = Bundle(bundle_path)
    loader = make_bimanual_local_dataloader(b, stage=0, split="train", batch_size=batch_size, seed=seed)
    batch, wins = loader.next_batch()
    problems = []
    for k, v in batch.items():
        if v.dtype.is_floating_point and not torch.isfinite(v).all():
            problems.append(f"{k}: non-finite values")
    if batch["action_mask"][..., contract.SEMANTIC_DIM:].any():
        problems.append("padding slots 59..63 marked valid")
    if (batch["actions"][~batch["action_mask"]] != 0).any():
        problems.append("masked action slots hold non-zero values")
    if batch["actions"].abs().max() > 10:
        problems.append(f"normalised actions reach {float(batch['actions'].abs().max()):.1f}; statistics do not fit the data")
    if batch["video"].min() < -1 or batch["video"].max() > 1:
        problems.append("video outside [-1, 1]")
    _, f, _, h, w = batch["video"].shape
    if h % patch or w % patch:
        problems.append(f"frames {h}x{w} are not divisible by the model's patch {patch}")
    frame_tokens = (h // patch) * (w // patch)
    valid_frames = int(batch["frame_mask"].sum())
    report = {
        "passed": not problems,
        "materialized": True,
        "stage": 0,
        "bundle": str(b.path),
        "batch": {
            "samples": int(batch["video"].shape[0]),
            "windows": [{"episode": w_["episode"], "start": w_["start"], "transitions": w_["transitions"],
                         "source": w_["source"]} for w_ in wins],
            "tokens": {
                "video_per_frame": frame_tokens,
                "video": int(batch["video"].shape[0] * f * frame_tokens),
                "video_valid": valid_frames * frame_tokens,
                "actions": int(batch["step_mask"].sum()),
                "caption": int(batch["caption_mask"].sum()),
            },
            "action_values": {"semantic": contract.SEMANTIC_DIM, "padded": contract.PADDED_DIM,
                              "valid_slots_per_step": sorted({int(x) for x in batch["action_mask"].sum(-1)[batch["step_mask"]]})},
        },
        "tensors": {k: {"shape": list(v.shape), "dtype": str(v.dtype).replace("torch.", "")} for k, v in batch.items()},
        "problems": problems,
    }
    if out is not None:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        frames = ((batch["video"].clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).permute(0, 1, 3, 4, 2).numpy()
        files = [str(write_sheet(out / "batch.png", list(frames)))]
        files.append(str(write_video(out / "batch_sample0.mp4", frames[0])))
        # the first transition of sample 0, slot by slot: name, unit, validity, raw and normalised
        e = wins[0]
        raw, valid = b.read_actions(e["episode"])
        names, units = contract.slot_names(), contract.slot_units()
        rows = [{"slot": k, "name": names[k], "unit": units[k], "valid": bool(valid[e["start"], k]),
                 "raw": float(raw[e["start"], k]), "normalized": float(batch["actions"][0, 0, k])}
                for k in range(contract.SEMANTIC_DIM)]
        rows += [{"slot": k, "name": "padding", "unit": "", "valid": bool(batch["action_mask"][0, 0, k]),
                  "raw": 0.0, "normalized": float(batch["actions"][0, 0, k])} for k in range(contract.SEMANTIC_DIM, contract.PADDED_DIM)]
        from wmrl.fileio import write_json

        write_json(out / "actions_sample0_step0.json", {"caption": b.episodes[e["episode"]]["caption"],
                                                         "domain_id": int(batch["domain_id"][0]), "slots": rows})
        files.append(str(out / "actions_sample0_step0.json"))
        report["preview"] = files
    return report
