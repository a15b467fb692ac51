"""The training bundle: a folder a stage can train from without any other input.

Layout::

    manifest.json              schema, action contract, statistics, sources, split, window,
                               sha256 of every other file
    samples.json               episodes (source, caption, split, files) and the windows cut
                               from them (episode, start, transitions, split)
    media/<episode>.npz        frames (T+1, H, W, 3) uint8: T+1 RGB observations
    actions/<episode>.npz      actions (T, 59) float32 raw values, mask (T, 59) bool,
                               space = "raw"
    resources/tokenizer/       tokenizer.json built from the bundle's captions

Episodes are split into train/val *before* windows are cut, so every window of an episode
is in the episode's split (no frame of a validation episode is ever trained on). Statistics
are computed from the valid train values of all sources together (fixed, global). Source
weights are declared relative numbers; the kit normalises them to sum to 1.

``validate`` checks all of this and reports every defect it finds, as JSON.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from wmrl import __version__
from wmrl.bimanual import contract
from wmrl.bimanual.tokenizer import CaptionTokenizer
from wmrl.fileio import read_json, sha256_file, write_json

SCHEMA = "wmrl-bimanual-bundle"
SCHEMA_VERSION = 1
TOKENIZER_DIR = "resources/tokenizer"
INFERENCE_SUFFIXES = (".jsonl",)
SIDECAR_SUFFIXES = (".npz", ".npy", ".json", ".csv", ".parquet")

# Domain IDs are part of the contract: a model learns one embedding per domain.
DOMAINS = {"aloha_sim": 0, "libero_panda": 1}


class BundleError(ValueError):
    """The input is not a usable training bundle; the message says what to do."""


def not_a_bundle(path: Path) -> BundleError | None:
    """A clear error for inputs that look like inference data rather than a bundle."""
    hint = ("a training bundle is a folder with manifest.json, samples.json, media/, actions/ and "
            "resources/tokenizer/ (make bimanual-bundle builds one)")
    if path.is_file():
        if path.suffix in INFERENCE_SUFFIXES:
            return BundleError(f"{path}: an inference-only JSONL is not a training bundle; {hint}")
        if path.suffix in SIDECAR_SUFFIXES:
            return BundleError(f"{path}: an action sidecar file is not a training bundle; {hint}")
        return BundleError(f"{path}: a file, not a training bundle; {hint}")
    if path.is_dir() and not (path / "manifest.json").is_file():
        if any(path.glob("*.jsonl")):
            return BundleError(f"{path}: holds inference JSONL files but no manifest.json; it is not a training bundle; {hint}")
        return BundleError(f"{path}: no manifest.json; {hint}")
    if not path.exists():
        return BundleError(f"{path}: no such bundle; {hint}")
    return None


@dataclass
class Episode:
    """One recorded episode in contract form (raw actions)."""

    frames: np.ndarray  # (T+1, H, W, 3) uint8
    actions: np.ndarray  # (T, 59) raw
    mask: np.ndarray  # (T, 59) bool
    caption: str
    success: bool
    meta: dict[str, Any] = field(default_factory=dict)

    def check(self) -> None:
        t = self.actions.shape[0]
        if self.frames.shape[0] != t + 1:
            raise BundleError(f"episode has {self.frames.shape[0]} frames for {t} transitions; the contract is T+1 frames for T")
        if self.actions.shape != (t, contract.SEMANTIC_DIM) or self.mask.shape != self.actions.shape:
            raise BundleError(f"actions {self.actions.shape} / mask {self.mask.shape}: expected (T, {contract.SEMANTIC_DIM})")


@dataclass(frozen=True)
class SourceSpec:
    name: str
    domain: str
    weight: float = 1.0  # relative; normalised over all sources by the kit

    def __post_init__(self) -> None:
        if self.domain not in DOMAINS:
            raise BundleError(f"source {self.name}: unknown domain {self.domain!r}; known: {sorted(DOMAINS)}")
        if not self.weight > 0:
            raise BundleError(f"source {self.name}: weight={self.weight}; give a positive relative weight")


def _episode_split(episode_ids: list[str], val_fraction: float, seed: int) -> dict[str, str]:
    """Deterministic episode-level split: order by a seeded hash, first ``n_val`` go to val."""
    if not episode_ids:
        return {}
    key = lambda e: hashlib.sha256(f"{seed}:{e}".encode()).hexdigest()  # noqa: E731
    ordered = sorted(episode_ids, key=key)
    n_val = int(round(len(ordered) * val_fraction))
    if val_fraction > 0 and len(ordered) >= 2:
        n_val = min(max(n_val, 1), len(ordered) - 1)  # both splits non-empty
    return {e: ("val" if i < n_val else "train") for i, e in enumerate(ordered)}


def cut_windows(transitions: int, window: int, stride: int) -> list[tuple[int, int]]:
    """(start, length) windows inside one episode; a short episode gives one short window."""
    if transitions <= window:
        return [(0, transitions)]
    starts = list(range(0, transitions - window + 1, stride))
    if starts[-1] != transitions - window:  # cover the end of the episode too
        starts.append(transitions - window)
    return [(s, window) for s in starts]


class BundleWriter:
    """Writes episodes into ``<out>.partial/``; ``finalize`` splits, cuts windows, computes
    statistics, builds the tokenizer and renames the folder into place.

    Rerunning with the same output keeps the episodes already written (each episode's
    ``episodes/<id>.json`` is written last, atomically), so generation resumes.
    """

    def __init__(self, out: str | os.PathLike, sources: Iterable[SourceSpec], *, window: int, stride: int,
                 val_fraction: float, seed: int, overwrite: bool = False, settings: dict | None = None):
        self.out = Path(out)
        self.partial = self.out.with_name(self.out.name + ".partial")
        if self.out.exists():
            if not overwrite:
                raise FileExistsError(f"{self.out} exists; pass --overwrite (OVERWRITE=1) to rebuild it or choose another OUT")
            shutil.rmtree(self.out)
        self.sources = {s.name: s for s in sources}
        if not self.sources:
            raise BundleError("no sources declared")
        if window < 1 or stride < 1:
            raise BundleError(f"window={window}, stride={stride}: both must be >= 1")
        if not 0 <= val_fraction < 1:
            raise BundleError(f"val_fraction={val_fraction}: use 0 <= f < 1 (0.2 is the kit's default)")
        self.window, self.stride, self.val_fraction, self.seed = window, stride, val_fraction, seed
        self.settings = settings or {}
        for sub in ("media", "actions", "episodes", TOKENIZER_DIR):
            (self.partial / sub).mkdir(parents=True, exist_ok=True)

    def has(self, episode_id: str) -> bool:
        return (self.partial / "episodes" / f"{episode_id}.json").is_file()

    def add(self, source: str, episode_id: str, ep: Episode) -> None:
        if source not in self.sources:
            raise BundleError(f"episode {episode_id}: undeclared source {source!r}")
        ep.check()
        if not np.isfinite(ep.actions[ep.mask]).all():
            raise BundleError(f"episode {episode_id}: non-finite raw action values")
        np.savez_compressed(self.partial / "media" / f"{episode_id}.npz", frames=ep.frames.astype(np.uint8))
        np.savez_compressed(self.partial / "actions" / f"{episode_id}.npz", actions=ep.actions.astype(np.float32),
                            mask=ep.mask.astype(bool), space=np.array("raw"))
        spec = self.sources[source]
        write_json(self.partial / "episodes" / f"{episode_id}.json", {
            "id": episode_id, "source": source, "domain": spec.domain, "domain_id": DOMAINS[spec.domain],
            "caption": ep.caption, "success": bool(ep.success), "transitions": int(ep.actions.shape[0]),
            "image_size": list(ep.frames.shape[1:3]), "media": f"media/{episode_id}.npz",
            "actions": f"actions/{episode_id}.npz", "meta": ep.meta,
        })

    def finalize(self) -> Path:
        episodes = [json.loads(p.read_text()) for p in sorted((self.partial / "episodes").glob("*.json"))]
        if not episodes:
            raise BundleError("no episodes were written; nothing to finalize")
        sizes = {tuple(e["image_size"]) for e in episodes}
        if len(sizes) != 1:
            raise BundleError(f"episodes have different image sizes {sorted(sizes)}; use one size per bundle")
        # 1. split by episode, per source (each source keeps its val share), before any window exists
        split: dict[str, str] = {}
        for name in self.sources:
            split.update(_episode_split([e["id"] for e in episodes if e["source"] == name], self.val_fraction, self.seed))
        for e in episodes:
            e["split"] = split[e["id"]]
        # 2. windows inside episodes; a window inherits its episode's split
        windows = []
        for e in episodes:
            for start, length in cut_windows(e["transitions"], self.window, self.stride):
                windows.append({"id": len(windows), "episode": e["id"], "source": e["source"], "split": e["split"],
                                "start": start, "transitions": length})
        # 3. fixed global statistics over valid train values of every source
        vals, masks = [], []
        for e in episodes:
            if e["split"] == "train":
                with np.load(self.partial / e["actions"]) as z:
                    vals.append(z["actions"].astype(np.float64))
                    masks.append(z["mask"])
        stats = contract.compute_statistics(np.concatenate(vals), np.concatenate(masks))
        # 4. tokenizer from the captions
        CaptionTokenizer.build([e["caption"] for e in episodes]).save(self.partial / TOKENIZER_DIR)
        # 5. samples.json and manifest.json (hashes of every other file)
        for e in episodes:
            (self.partial / "episodes" / f"{e['id']}.json").unlink()
        (self.partial / "episodes").rmdir()
        write_json(self.partial / "samples.json", {"episodes": episodes, "windows": windows})
        total = sum(s.weight for s in self.sources.values())
        present = {e["source"] for e in episodes}
        sources = [{"name": s.name, "domain": s.domain, "domain_id": DOMAINS[s.domain], "weight": s.weight,
                    "normalized_weight": s.weight / total,
                    "episodes": sum(e["source"] == s.name for e in episodes)} for s in self.sources.values()]
        missing = [s.name for s in self.sources.values() if s.name not in present]
        if missing:
            raise BundleError(f"declared sources without episodes: {missing}")
        files = {str(p.relative_to(self.partial)): sha256_file(p) for p in sorted(self.partial.rglob("*"))
                 if p.is_file() and p.name != "manifest.json"}
        h, w = sizes.pop()
        manifest = {
            "schema": SCHEMA, "schema_version": SCHEMA_VERSION, "kit_version": __version__,
            "action_contract": contract.describe(),
            "statistics": {"method": "asinh", "computed_on": "train split, valid slots, all sources", **stats},
            "domains": DOMAINS, "sources": sources,
            "image": {"height": h, "width": w, "channels": 3, "dtype": "uint8"},
            "window": {"transitions": self.window, "stride": self.stride},
            "split": {"unit": "episode", "val_fraction": self.val_fraction, "seed": self.seed,
                      "episodes": {s: sum(e["split"] == s for e in episodes) for s in ("train", "val")},
                      "windows": {s: sum(w_["split"] == s for w_ in windows) for s in ("train", "val")}},
            "tokenizer": f"{TOKENIZER_DIR}/tokenizer.json",
            "settings": self.settings,
            "files": files,
        }
        write_json(self.partial / "manifest.json", manifest)
        os.replace(self.partial, self.out)
        return self.out


# --------------------------------------------------------------------------------- reading
class Bundle:
    """A finished bundle opened for reading (no hashing: ``validate`` does that)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        err = not_a_bundle(self.path)
        if err:
            raise err
        self.manifest = read_json(self.path / "manifest.json", BundleError, "missing")
        if self.manifest.get("schema") != SCHEMA:
            raise BundleError(f"{self.path}: manifest schema {self.manifest.get('schema')!r} is not {SCHEMA!r}; not a training bundle")
        if self.manifest.get("schema_version") != SCHEMA_VERSION:
            raise BundleError(f"{self.path}: bundle schema version {self.manifest.get('schema_version')} unsupported (this kit reads {SCHEMA_VERSION}); rebuild it")
        samples = read_json(self.path / "samples.json", BundleError, "missing; the bundle is incomplete (rebuild it)")
        self.episodes: dict[str, dict] = {e["id"]: e for e in samples["episodes"]}
        self.windows: list[dict] = samples["windows"]
        st = self.manifest["statistics"]
        self.offset = np.asarray(st["offset"], np.float32)
        self.scale = np.asarray(st["scale"], np.float32)

    @property
    def fingerprint(self) -> str:
        """Identity of the bundle: sha256 of its manifest (which hashes every file)."""
        return sha256_file(self.path / "manifest.json")

    def tokenizer(self) -> CaptionTokenizer:
        return CaptionTokenizer.load(self.path / TOKENIZER_DIR)

    def source_weights(self) -> dict[str, float]:
        return {s["name"]: float(s["normalized_weight"]) for s in self.manifest["sources"]}

    def read_actions(self, episode_id: str) -> tuple[np.ndarray, np.ndarray]:
        with np.load(self.path / self.episodes[episode_id]["actions"]) as z:
            space = str(z["space"]) if "space" in z.files else "unknown"
            if space != "raw":
                raise BundleError(f"{episode_id}: action file holds {space!r} values; normalised values are not raw "
                                  "training actions (the kit applies the asinh transform itself)")
            return z["actions"], z["mask"]

    def read_frames(self, episode_id: str) -> np.ndarray:
        with np.load(self.path / self.episodes[episode_id]["media"]) as z:
            return z["frames"]


# ------------------------------------------------------------------------------ validation
def validate(path: str | os.PathLike, *, check_hashes: bool = True) -> dict[str, Any]:
    """Check files, hashes, schema, statistics and splits. Returns a JSON-able report with
    ``passed`` and a list of ``problems`` (each with a ``kind``); never raises for a defect
    inside a bundle, only for inputs that are not bundles at all."""
    path = Path(path)
    err = not_a_bundle(path)
    if err:
        raise err
    problems: list[dict[str, str]] = []

    def bad(kind: str, msg: str) -> None:
        problems.append({"kind": kind, "message": msg})

    try:
        b = Bundle(path)
    except (BundleError, KeyError, TypeError) as e:
        return {"passed": False, "bundle": str(path), "problems": [{"kind": "schema", "message": str(e)}]}
    m = b.manifest
    # files and hashes
    listed = m.get("files", {})
    on_disk = {str(p.relative_to(path)) for p in path.rglob("*") if p.is_file() and p.name != "manifest.json"}
    for rel in sorted(set(listed) - on_disk):
        bad("files", f"{rel}: listed in manifest.json but missing")
    for rel in sorted(on_disk - set(listed)):
        bad("files", f"{rel}: present but not listed in manifest.json (stray or edited bundle)")
    if check_hashes:
        for rel in sorted(set(listed) & on_disk):
            if sha256_file(path / rel) != listed[rel]:
                bad("hashes", f"{rel}: sha256 differs from manifest.json (file changed after the bundle was built)")
    if m.get("tokenizer") not in listed:
        bad("files", "resources/tokenizer/tokenizer.json is missing; captions cannot be tokenized")
    # contract
    if m.get("action_contract") != contract.describe():
        bad("schema", "action_contract differs from this kit's (59 values padded to 64, units, frames, rot6d); rebuild the bundle")
    # sources and weights
    weights = [s.get("normalized_weight", 0) for s in m.get("sources", [])]
    if not weights or any(w <= 0 for w in weights) or abs(sum(weights) - 1) > 1e-6:
        bad("schema", f"source weights {weights} must be positive and normalised to sum to 1")
    source_names = {s["name"] for s in m.get("sources", [])}
    # per-episode schema
    h, w = m["image"]["height"], m["image"]["width"]
    train_vals, train_masks = [], []
    for eid, e in b.episodes.items():
        if e.get("split") not in ("train", "val"):
            bad("splits", f"{eid}: split {e.get('split')!r} is neither train nor val")
        if e.get("source") not in source_names:
            bad("schema", f"{eid}: source {e.get('source')!r} is not declared in manifest.json")
        if e.get("domain_id") not in DOMAINS.values():
            bad("schema", f"{eid}: unknown domain_id {e.get('domain_id')!r}")
        if not (path / e["media"]).is_file() or not (path / e["actions"]).is_file():
            continue  # already reported as a missing file
        try:
            with np.load(path / e["actions"]) as z:
                acts, mask = z["actions"], z["mask"]
                space = str(z["space"]) if "space" in z.files else "unknown"
            frames = b.read_frames(eid)
        except Exception as ex:  # noqa: BLE001  (any unreadable file is a defect to report)
            bad("schema", f"{eid}: unreadable media/action file ({type(ex).__name__}: {ex})")
            continue
        t = e["transitions"]
        if space != "raw":
            bad("statistics", f"{eid}: actions are {space!r}, not raw; normalised values where raw actions are expected (the kit normalises)")
        if acts.shape != (t, contract.SEMANTIC_DIM) or mask.shape != acts.shape or mask.dtype != bool:
            bad("schema", f"{eid}: actions {acts.shape} mask {mask.shape}/{mask.dtype}, expected ({t}, {contract.SEMANTIC_DIM}) and bool")
            continue
        if not np.isfinite(acts[mask]).all():
            bad("schema", f"{eid}: non-finite values in valid action slots")
            continue
        if e["split"] == "train" and space == "raw":
            train_vals.append(acts.astype(np.float64))
            train_masks.append(mask)
        if frames.shape != (t + 1, h, w, 3) or frames.dtype != np.uint8:
            bad("schema", f"{eid}: frames {frames.shape} {frames.dtype}, expected ({t + 1}, {h}, {w}, 3) uint8 (T+1 observations for T transitions)")
    # statistics: recompute and compare; a normalised file would not reproduce them either
    st = m.get("statistics", {})
    scale = np.asarray(st.get("scale", []), np.float64)
    offset = np.asarray(st.get("offset", []), np.float64)
    if scale.shape != (contract.PADDED_DIM,) or offset.shape != (contract.PADDED_DIM,):
        bad("statistics", f"statistics offset/scale must have {contract.PADDED_DIM} values")
    elif not (np.isfinite(scale).all() and (scale > 0).all() and np.isfinite(offset).all()):
        bad("statistics", "statistics scale must be finite and > 0 and offset finite")
    elif train_vals:
        ref = contract.compute_statistics(np.concatenate(train_vals), np.concatenate(train_masks))
        if not (np.allclose(ref["offset"], offset, rtol=1e-4, atol=1e-6) and np.allclose(ref["scale"], scale, rtol=1e-4, atol=1e-6)):
            k = int(np.argmax(np.abs(np.asarray(ref["scale"]) - scale) + np.abs(np.asarray(ref["offset"]) - offset)))
            bad("statistics", f"stored statistics do not match the train actions (first at slot {k}, "
                              f"{contract.slot_names()[k] if k < contract.SEMANTIC_DIM else 'padding'}); rebuild the bundle")
    # splits: episode-level; every window inside its episode and in its episode's split
    by_split = {"train": 0, "val": 0}
    for win in b.windows:
        e = b.episodes.get(win["episode"])
        if e is None:
            bad("splits", f"window {win['id']}: unknown episode {win['episode']!r}")
            continue
        if win["split"] != e.get("split"):
            bad("splits", f"window {win['id']}: split {win['split']} but its episode {e['id']} is {e.get('split')}; windows must stay in their episode's split")
        if win["start"] < 0 or win["transitions"] < 1 or win["start"] + win["transitions"] > e["transitions"]:
            bad("splits", f"window {win['id']}: [{win['start']}, +{win['transitions']}) outside episode {e['id']} ({e['transitions']} transitions)")
        by_split[win["split"]] = by_split.get(win["split"], 0) + 1
    for s in ("train", "val"):
        if by_split.get(s, 0) == 0 and m.get("split", {}).get("val_fraction", 0) > 0:
            bad("splits", f"no {s} windows; add episodes or change val_fraction")
    return {
        "passed": not problems,
        "bundle": str(path),
        "fingerprint": b.fingerprint,
        "episodes": len(b.episodes),
        "windows": by_split,
        "sources": {s["name"]: {"domain_id": s["domain_id"], "normalized_weight": s["normalized_weight"],
                                "episodes": s["episodes"]} for s in m.get("sources", [])},
        "success_episodes": sum(bool(e.get("success")) for e in b.episodes.values()),
        "image": m.get("image"),
        "files_checked": len(listed),
        "problems": problems,
    }
