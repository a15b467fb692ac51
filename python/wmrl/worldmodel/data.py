"""World-model training data: chunk-to-chunk transitions from HDF5 trajectories.

A trajectory may hold frames at every step (demonstrations) or at chunk boundaries only
(rollouts); the world models work at chunk boundaries, so only frames whose ``frame_step``
is a multiple of the chunk size are used. A *transition* is (context frames ending at
boundary k, the chunk's actions, proprio at k) -> (frame and proprio at boundary k + 1).
History before the first frame repeats the first frame (the policy starts there too).

A recording with a frame at every step holds ``chunk`` interleaved chunk-boundary streams:
steps 0, 8, 16, ..., then 1, 9, 17, ..., and so on. ``load_split(..., phases=True)`` gives
training every such stream (``Episode.phase``), 8x the transitions of the same episodes;
validation keeps phase 0 only, so held-out figures compare with and without.

Frames are decoded once into uint8 tensors; a batch gathers rows. The split into training
and validation episodes, and the mixing of new and replay data, come from the manifest
(``wmrl.data.manifest``): each batch draws a sample from the new data with probability
``new_ratio`` and from the replay data otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from wmrl.data.trajectory import TrajectoryError


def boundary_frames(frame_step: np.ndarray, chunk: int, phase: int = 0) -> np.ndarray:
    """Indices of the frames at chunk boundaries shifted by ``phase`` steps (step phase,
    phase + chunk, phase + 2 chunk, ...), in order."""
    idx = np.nonzero((frame_step >= phase) & ((frame_step - phase) % chunk == 0))[0]
    steps = frame_step[idx]
    if len(idx) == 0 or steps[0] != phase or np.any(np.diff(steps) != chunk):
        raise TrajectoryError(f"frames at chunk boundaries are missing (steps {steps[:6].tolist()}...); "
                              f"the world models need a frame every {chunk} steps from step 0")
    return idx


@dataclass
class Episode:
    main: np.ndarray  # (N, H, W, 3) uint8 at chunk boundaries
    wrist: np.ndarray
    proprio: np.ndarray  # (N, P)
    actions: np.ndarray  # (N - 1, chunk, A): the chunk executed after boundary k
    success: np.ndarray  # (N,) the goal holds at boundary k
    source: str  # "new" or "replay"
    key: str  # "folder/file.hdf5:demo_i", the file relative to the manifest's folder: unique in a manifest
    task: int = -1
    instruction: str = ""
    init_mode: str = "train"  # "eval": started from a fixed evaluation state (never a GRPO start)
    file_sha256: str = ""  # of the trajectory file it came from
    phase: int = 0  # steps from the episode's start to its first frame (every-step recordings only)
    # The simulator's success-once for the whole recorded episode (its ``success`` attribute). It
    # can be true with no success frame here: the goal held after some step inside a chunk but
    # no longer at the chunk's end (an object that bounced off). None: unknown (use ``success``)
    outcome: bool | None = None
    policy: str = ""  # the ``policy_id`` that recorded it (e.g. flow-policy@step4000-sde-K10-T1)

    @property
    def succeeded(self) -> bool:
        """The simulator's success-once: ``outcome`` where recorded, else whether a frame is labelled
        success. The truth that agreement with the simulator is scored against."""
        return bool(self.success.any()) if self.outcome is None else bool(self.outcome)


def _frames(dataset, idx: np.ndarray) -> np.ndarray:
    """Rows ``idx`` of an HDF5 image dataset, one read each (h5py's fancy indexing is several
    times slower than decoding the chunk)."""
    return np.stack([dataset[int(i)] for i in idx])


def episode_arrays(group) -> dict[str, np.ndarray]:
    """An episode's small per-step arrays, read once for all its phases (the images are not)."""
    return {"frame_step": group["frame_step"][()].astype(np.int64), "actions": group["actions"][()].astype(np.float32),
            "rewards": group["rewards"][()], "proprio": group["obs"]["proprio"][()].astype(np.float32)}


def read_episode(group, chunk: int, source: str, key: str, file_sha256: str = "", phase: int = 0,
                 arrays: dict[str, np.ndarray] | None = None) -> Episode | None:
    """The episode's frames every ``chunk`` steps from step ``phase`` (None where fewer than
    two such frames exist, e.g. a phase > 0 of a recording made at chunk boundaries only).
    ``arrays``: ``episode_arrays(group)`` when the caller reads several phases."""
    a = arrays if arrays is not None else episode_arrays(group)
    fs = a["frame_step"]
    if phase and not np.isin([phase, phase + chunk], fs).all():
        return None
    idx = boundary_frames(fs, chunk, phase)
    actions = a["actions"][phase:]
    n = int(min(len(idx), len(actions) // chunk + 1))  # a last, shorter chunk has no boundary after it
    if n < 2:
        return None
    idx = idx[:n]
    obs = group["obs"]
    # Only the boundary frames are decoded (images are stored one frame per HDF5 chunk): a
    # demonstration recorded at every step decodes 1/chunk of its frames.
    return Episode(
        main=_frames(obs["agentview_rgb"], idx), wrist=_frames(obs["eye_in_hand_rgb"], idx),
        proprio=a["proprio"][idx],
        actions=actions[: (n - 1) * chunk].reshape(n - 1, chunk, actions.shape[1]),
        success=a["rewards"][idx] > 0, source=source, key=key,
        task=int(group.attrs.get("task_index", -1)), instruction=str(group.attrs.get("instruction", "")),
        init_mode=str(group.attrs.get("init_mode", "train")), file_sha256=file_sha256, phase=phase,
        outcome=bool(group.attrs["success"]) if "success" in group.attrs else None,
        policy=str(group.attrs.get("policy_id", "")))


def episodes_under(data: Path, chunk: int, limit: int, source: str = "recorded") -> list[Episode]:
    """Up to ``limit`` episodes of the HDF5 files under ``data`` (no manifest: a folder ``make
    collect`` wrote), one task after another in turn (the first episode of every file, then the
    second, ...) so a few cover every task."""
    import h5py

    from wmrl.config import ConfigError

    files = sorted(Path(data).rglob("*.hdf5"))
    if not files:
        raise ConfigError(f"no .hdf5 files under {data}: record some first (make collect RUN=...)")
    per_file = []
    for path in files:
        with h5py.File(path, "r") as h:
            eps = [read_episode(h["data"][k], chunk, source, f"{file_label(path, data)}:{k}") for k in sorted(h["data"])]
        per_file.append([e for e in eps if e is not None])
    if not any(per_file):
        raise ConfigError(f"the files under {data} hold no episode of two chunks or more")
    out = []
    for i in range(max(map(len, per_file))):
        out += [eps[i] for eps in per_file if i < len(eps)]
    return out[:limit]


def load_split(manifest_path, chunk: int, verify: bool = True, workers: int = 0, validate: bool = False,
               phases: bool = False) -> tuple[dict, list[Episode], list[Episode]]:
    """The manifest (every file's hash checked first) and its training / validation episodes,
    files read in parallel by ``workers`` processes (0: one per core). ``validate``: each file
    also passes the schema validator first, in the worker that reads it (a file that fails
    raises ``TrajectoryError``, naming the problems). ``phases``: training episodes recorded
    at every step come once per phase (module docstring); validation episodes at phase 0."""
    from wmrl.data.manifest import load_manifest

    manifest, files = load_manifest(manifest_path, verify=verify)
    from wmrl.data.parallel import map_files

    jobs = [(str(f.path), f.episodes, chunk, f.source, f.sha256, validate, set(f.val_episodes) if phases else None,
             file_label(f.path, Path(manifest_path).parent)) for f in files]
    train, val = [], []
    for f, episodes in zip(files, map_files(_read_file, jobs, workers)):
        for i, ep in episodes:
            (val if i in f.val_episodes else train).append(ep)
    return manifest, train, val


def held_out_halves(val: list[Episode]) -> tuple[list[Episode], list[Episode]]:
    """The validation episodes in two disjoint halves, every other one: the reward model
    calibrates its threshold on the first (``make wm-reward``), agreement with the simulator is
    measured on the second (``make wm-eval``). A threshold chosen on the episodes it is then
    scored on flatters the agreement, the more so the fewer they are. Alternating keeps both
    halves a mix of the manifest's sources and tasks. With a single episode there is nothing
    to split: both halves are that episode (``wm_eval`` records it)."""
    return (val[0::2], val[1::2]) if len(val) > 1 else (val, val)


def file_label(path: Path, root: Path) -> str:
    """How episode keys name a file: relative to ``root`` (the manifest's folder), so the same
    file name in two folders (every collection writes task_00.hdf5 ...) stays two files; a file
    outside ``root`` by its absolute path."""
    path, root = Path(path).resolve(), Path(root).resolve()
    return path.relative_to(root).as_posix() if path.is_relative_to(root) else path.as_posix()


def _read_file(job: tuple) -> list[tuple[int, Episode]]:
    import h5py

    path, n, chunk, source, sha, validate, phase_val, label = job  # phase_val: None, or the episodes kept at phase 0
    if validate:
        from wmrl.data.validate import validate_file

        report = validate_file(path)
        if not report.ok:
            raise TrajectoryError(f"{path} fails validation ({'; '.join(report.problems[:3])}); see `make validate "
                                  f"DATA={path}`, then rebuild the manifest without it")
    out = []
    with h5py.File(path, "r") as h:
        for i in range(n):
            group, key = h["data"][f"demo_{i}"], f"{label}:demo_{i}"
            arrays = episode_arrays(group)
            for phase in range(1 if phase_val is None or i in phase_val else chunk):
                ep = read_episode(group, chunk, source, key + (f"@{phase}" if phase else ""), sha, phase, arrays)
                if ep is not None:
                    out.append((i, ep))
    return out


class Transitions:
    """All transitions of a list of episodes, as tensors (on ``device``)."""

    def __init__(self, episodes: list[Episode], context: int, device="cpu", action_history: int = 0):
        """``action_history``: past chunks of actions each batch carries before the current one
        (``WorldModelConfig.action_history``; zeros before an episode's first chunk)."""
        import torch

        if not episodes:
            raise TrajectoryError("no episodes with at least one full chunk")
        offsets = np.cumsum([0] + [len(e.proprio) for e in episodes])
        cat = lambda xs: torch.from_numpy(np.concatenate(xs)).to(device)  # noqa: E731
        self.main, self.wrist = cat([e.main for e in episodes]), cat([e.wrist for e in episodes])
        self.proprio = cat([e.proprio for e in episodes])
        self.success = cat([e.success for e in episodes])
        ctx, nxt, acts, src, prev = [], [], [], [], []
        for e, off in zip(episodes, offsets):
            for k in range(len(e.actions)):
                ctx.append([off + max(0, k - j) for j in range(context - 1, -1, -1)])  # oldest first
                nxt.append(off + k + 1)
                src.append(e.source == "new")
                prev.append(len(nxt) - 2 if k > 0 else -1)  # the episode's previous transition
            acts.append(e.actions)
        self.context = torch.tensor(ctx, dtype=torch.long, device=device)  # (S, context) frame rows
        self.next = torch.tensor(nxt, dtype=torch.long, device=device)
        self.actions = cat(acts)  # (S, chunk, A)
        self.is_new = torch.tensor(src, dtype=torch.bool, device=device)
        self.previous = torch.tensor(prev, dtype=torch.long, device=device)  # (S,) -1 at an episode's start
        self.action_history = action_history
        self.image_size = int(self.main.shape[1])

    @property
    def size(self) -> int:
        return int(self.next.shape[0])

    def batch(self, idx, view: str, main: str | None, norm) -> dict:
        """Model inputs for transitions ``idx``: frames in [-1, 1], normalised proprio. ``main``
        (``WorldModelConfig.main_condition``): which main-view frame follows the view's own
        history, the chunk's "start" or its "end"; None: none."""
        import torch

        from wmrl.worldmodel.model import images_to_unit

        if main not in (None, "start", "end"):
            raise ValueError(f"main={main!r}: None, 'start' or 'end' (WorldModelConfig.main_condition)")
        images = self.main if view == "main" else self.wrist
        ctx = self.context[idx]
        frames = images_to_unit(images[ctx])  # (B, context, 3, H, W)
        if main:
            row = self.next[idx] if main == "end" else ctx[:, -1]
            frames = torch.cat([frames, images_to_unit(self.main[row])[:, None]], dim=1)
        p = (self.proprio - norm["mean"]) / norm["std"]
        return {"frames": frames, "target": images_to_unit(images[self.next[idx]]), "actions": self.actions_of(idx),
                "proprio": p[ctx[:, -1]], "next_proprio": p[self.next[idx]]}

    def actions_of(self, idx):
        """(B, (1 + action_history) x chunk, A): the past chunks (oldest first, zeros before the
        episode's start), then transition ``idx``'s own."""
        import torch

        chunks, j = [self.actions[idx]], idx
        for _ in range(self.action_history):
            j = torch.where(j >= 0, self.previous[j.clamp_min(0)], j)
            past = self.actions[j.clamp_min(0)]
            chunks.insert(0, torch.where((j >= 0)[:, None, None], past, torch.zeros_like(past)))
        return torch.cat(chunks, dim=1)


class MixedSampler:
    """Seeded draws that take a new-data transition with probability ``new_ratio`` (the
    seed's 0.5) and a replay one otherwise; falls back to whichever exists. The state is
    the number of batches drawn, so a resumed run draws the same batches."""

    def __init__(self, is_new, new_ratio: float, seed: int):
        import torch

        self.new = torch.nonzero(is_new.cpu()).flatten()
        self.old = torch.nonzero(~is_new.cpu()).flatten()
        self.ratio = new_ratio if len(self.new) and len(self.old) else (1.0 if len(self.new) else 0.0)
        self.seed, self.drawn = seed, 0

    def next(self, batch: int):
        import torch

        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.drawn)
        self.drawn += 1
        take_new = torch.rand(batch, generator=g) < self.ratio
        pick = lambda pool: pool[torch.randint(len(pool), (batch,), generator=g)] if len(pool) else None  # noqa: E731
        a, b = pick(self.new), pick(self.old)
        if a is None:
            return b
        if b is None:
            return a
        return torch.where(take_new, a, b)

    def state_dict(self) -> dict:
        return {"drawn": self.drawn, "seed": self.seed}

    def load_state_dict(self, s: dict) -> None:
        self.drawn = int(s["drawn"])


def proprio_stats(t: Transitions) -> dict:
    p = t.proprio.float()
    return {"mean": p.mean(0), "std": p.std(0).clamp_min(1e-3)}
