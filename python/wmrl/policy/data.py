"""Demonstrations for supervised training, decoded once into memory.

Datasets are small (50 episodes x 10 tasks x ~30 frames x 2 cameras of 128 px is ~1.5 GB of
uint8), so every frame is decoded once at start into uint8 tensors - on the GPU when training
there - and a step only gathers rows: no data-loader processes, no per-step decoding.

A *sample* is one (episode, frame) pair whose frame has actions after it; its target is the
chunk of ``chunk`` actions that follow the frame, ``actions[frame_step[k] : frame_step[k] +
chunk]``, padded by repeating the last action (mask 0) where the episode ends first.

Episodes (not frames) are split into training and validation, per task, with a seeded
shuffle. The statistics (``NormStats``) come from the training episodes only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from wmrl.data.trajectory import TrajectoryError


def find_files(data: str | os.PathLike | list) -> list[Path]:
    """A folder (its ``*.hdf5``, never ``.partial`` files), a file, or a list of either."""
    from wmrl.data.trajectory import find_trajectory_files

    return find_trajectory_files(data)


def _read_file(path: str) -> list[dict]:
    """Everything training needs from one file (runs in a worker process when parallel)."""
    from wmrl.data.trajectory import open_trajectories

    out = []
    with open_trajectories(path) as f:
        data = f["data"]
        for i in range(int(data.attrs["num_episodes"])):
            g = data[f"demo_{i}"]
            obs = g["obs"]
            out.append({
                "file": str(path), "index": i,
                "task": int(g.attrs["task_index"]), "instruction": str(g.attrs["instruction"]),
                "main": obs["agentview_rgb"][()], "wrist": obs["eye_in_hand_rgb"][()],
                "proprio": obs["proprio"][()].astype(np.float32),
                "frame_step": g["frame_step"][()].astype(np.int64),
                # DART demonstrations: learn the expert's clean actions, not the perturbed ones
                "actions": (g["action_labels"] if "action_labels" in g else g["actions"])[()].astype(np.float32),
            })
    return out


def read_episodes(files: list[Path], workers: int = 0) -> list[dict]:
    from wmrl.data.parallel import map_files

    return [ep for part in map_files(_read_file, [str(f) for f in files], workers) for ep in part]


def split_episodes(episodes: list[dict], val_ratio: float, seed: int) -> tuple[list[int], list[int]]:
    """Indices of training and validation episodes: per task, a seeded shuffle, then
    round(val_ratio * n) (at least one where a task has two or more) held out."""
    rng = np.random.default_rng(seed)
    by_task: dict[int, list[int]] = {}
    for i, ep in enumerate(episodes):
        by_task.setdefault(ep["task"], []).append(i)
    train, val = [], []
    for task in sorted(by_task):
        idx = list(by_task[task])
        rng.shuffle(idx)
        n_val = 0
        if val_ratio > 0 and len(idx) >= 2:
            n_val = min(len(idx) - 1, max(1, int(round(val_ratio * len(idx)))))
        val.extend(idx[:n_val])
        train.extend(idx[n_val:])
    return sorted(train), sorted(val)


def chunk_targets(actions: np.ndarray, frame_step: np.ndarray, chunk: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Frames with at least one following action, their (chunk, A) targets and masks."""
    t_total = len(actions)
    frames = np.nonzero(frame_step < t_total)[0]
    targets = np.zeros((len(frames), chunk, actions.shape[1]), np.float32)
    masks = np.zeros((len(frames), chunk), np.float32)
    for j, k in enumerate(frames):
        s = int(frame_step[k])
        seg = actions[s:s + chunk]
        targets[j, :len(seg)] = seg
        targets[j, len(seg):] = seg[-1]
        masks[j, :len(seg)] = 1.0
    return frames, targets, masks


@dataclass
class Split:
    """One side of the split, as tensors: sample -> frame row, target, mask, instruction."""

    frame: object  # LongTensor (S,) rows into DemoData.main / wrist / proprio
    actions: object  # (S, chunk, A) raw actions
    mask: object  # (S, chunk)
    lang: object  # LongTensor (S,) index into DemoData.instructions
    episodes: list[int]

    @property
    def size(self) -> int:
        return int(self.frame.shape[0])


class DemoData:
    def __init__(self, episodes: list[dict], *, chunk: int, val_ratio: float, seed: int, device="cpu",
                 tasks: tuple[int, ...] | None = None):
        import torch

        if tasks is not None:
            episodes = [e for e in episodes if e["task"] in tasks]
        if not episodes:
            raise TrajectoryError("no demonstration episodes to train on (check DATA and TASKS)")
        sizes = {e["main"].shape[1:] for e in episodes} | {e["wrist"].shape[1:] for e in episodes}
        if len(sizes) != 1 or len(next(iter(sizes))) != 3 or next(iter(sizes))[0] != next(iter(sizes))[1]:
            raise TrajectoryError(f"demonstrations mix image shapes {sorted(sizes)}; train on files of one image size")
        self.image_size = int(next(iter(sizes))[0])
        self.files = sorted({e["file"] for e in episodes})
        self.instructions = sorted({e["instruction"] for e in episodes})
        lang_of = {s: i for i, s in enumerate(self.instructions)}
        self.episodes = [{k: e[k] for k in ("file", "index", "task", "instruction")} | {"frames": len(e["frame_step"])}
                         for e in episodes]

        offsets = np.cumsum([0] + [len(e["frame_step"]) for e in episodes])
        self.main = torch.from_numpy(np.concatenate([e["main"] for e in episodes])).to(device)
        self.wrist = torch.from_numpy(np.concatenate([e["wrist"] for e in episodes])).to(device)
        self.proprio = torch.from_numpy(np.concatenate([e["proprio"] for e in episodes])).to(device)

        per_ep = []
        for i, e in enumerate(episodes):
            frames, targets, masks = chunk_targets(e["actions"], e["frame_step"], chunk)
            per_ep.append((frames + offsets[i], targets, masks, np.full(len(frames), lang_of[e["instruction"]])))
        train_eps, val_eps = split_episodes(episodes, val_ratio, seed)

        def make(ids: list[int]) -> Split:
            parts = [per_ep[i] for i in ids]
            cat = lambda j, dt: torch.from_numpy(np.concatenate([p[j] for p in parts]).astype(dt)).to(device)  # noqa: E731
            if not parts:
                return Split(torch.zeros(0, dtype=torch.long, device=device), torch.zeros(0, chunk, 7, device=device),
                             torch.zeros(0, chunk, device=device), torch.zeros(0, dtype=torch.long, device=device), [])
            return Split(cat(0, np.int64), cat(1, np.float32), cat(2, np.float32), cat(3, np.int64), ids)

        self.train, self.val = make(train_eps), make(val_eps)
        if self.train.size == 0:
            raise TrajectoryError("the training episodes hold no frame with actions after it; record longer episodes")
        # statistics from training episodes only: their actions and frames
        self.train_actions = np.concatenate([episodes[i]["actions"] for i in train_eps])
        self.train_proprio = np.concatenate([episodes[i]["proprio"] for i in train_eps])

    @property
    def num_frames(self) -> int:
        return int(self.main.shape[0])

    def summary(self) -> dict:
        return {"files": self.files, "episodes": len(self.episodes), "frames": self.num_frames,
                "image_size": self.image_size, "train_episodes": len(self.train.episodes),
                "val_episodes": len(self.val.episodes), "train_samples": self.train.size,
                "val_samples": self.val.size, "instructions": len(self.instructions),
                "memory_mb": round((self.main.numel() + self.wrist.numel()) / 2**20, 1)}


class EpochSampler:
    """Seeded shuffles, epoch after epoch; the state is (epoch, position), so a resumed run
    draws exactly the batches the uninterrupted one would have."""

    def __init__(self, n: int, seed: int, rank: int = 0):
        self.n, self.seed, self.rank = n, seed, rank
        self.epoch, self.pos = 0, 0
        self._perm = None

    def _permutation(self):
        import torch

        if self._perm is None:
            g = torch.Generator().manual_seed((self.seed * 1_000_003 + self.rank) * 100_003 + self.epoch)
            self._perm = torch.randperm(self.n, generator=g)
        return self._perm

    def next(self, batch: int):
        import torch

        out = []
        need = batch
        while need > 0:
            perm = self._permutation()
            take = perm[self.pos:self.pos + need]
            out.append(take)
            need -= len(take)
            self.pos += len(take)
            if self.pos >= self.n:
                self.epoch, self.pos, self._perm = self.epoch + 1, 0, None
        return torch.cat(out)

    def state_dict(self) -> dict:
        return {"n": self.n, "seed": self.seed, "rank": self.rank, "epoch": self.epoch, "pos": self.pos}

    def load_state_dict(self, s: dict) -> None:
        if s.get("n") != self.n:
            raise ValueError(f"sampler state is for {s.get('n')} samples, this data has {self.n}")
        self.epoch, self.pos, self._perm = int(s["epoch"]), int(s["pos"]), None
