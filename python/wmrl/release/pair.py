"""``model_pair/``: the two world models, the frozen reward model and the keyframes that GRPO
imagines from, as one verified unit (the seed's ``pair.json``).

    model_pair/
      pair.json                 contract, names, SHA-256 and size of every file, steps, lineage
      main/  model.safetensors config.json      (main-view world model)
      wrist/ model.safetensors config.json      (wrist-view world model)
      reward/ model.safetensors config.json     (success classifier, calibrated threshold)
      init_observations.safetensors             keyframes: both views' frame history, proprio, task
      init_observations.json                    their episodes, chunk indices, source file hashes

A *keyframe* is a chunk boundary of a real training trajectory (never one started from a
fixed evaluation state, never one where the goal already holds) with the ``context`` frames
of both views that lead to it: imagined rollouts start there (keyframe-initialised rollouts,
as in RLinf's world-model environments). The contract (image size, chunk size, action and
proprio dimensions, views) lets GRPO refuse a pair of another kind before any weight loads.

Files are copied, not linked, so a pair can be moved or shipped on its own. ``load_pair``
verifies every hash before anything is used; ``--model-pair DIR`` on GRPO switches both world
models (and the reward model that judged with them) at once. ``make wm-eval`` writes
``fidelity.json`` beside ``pair.json``, bound to it by its SHA-256: GRPO reads the agreement
with the simulator from there (``check_agreement``).
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from wmrl.config import ACTION_DIM, PROPRIO_DIM, VIEWS, ConfigError
from wmrl.fileio import atomic_path, read_json, sha256_file, write_json
from wmrl.layout import RunLayout

FORMAT = "wmrl-model-pair/1"
PARTS = ("main", "wrist", "reward")
INIT_FILE = "init_observations.safetensors"
INIT_INDEX = "init_observations.json"
FIDELITY_FILE = "fidelity.json"  # `make wm-eval`'s figures, written beside pair.json
CLOSED_LOOP_FILE = "closed_loop.json"  # `make wm-calibrate`'s threshold, written beside pair.json


class PairError(ConfigError):
    """A model pair is missing, incomplete, of another kind or does not match its hashes."""


def _file_entry(path: Path, root: Path) -> dict:
    return {"path": str(path.relative_to(root)), "sha256": sha256_file(path), "bytes": path.stat().st_size}


def _copy(src_dir: Path, dst_dir: Path) -> None:
    dst_dir.mkdir(parents=True, exist_ok=True)
    for name in ("model.safetensors", "config.json"):
        src = src_dir / name
        if not src.is_file():
            raise PairError(f"{src} is missing: train that model first (make wm-update / make wm-reward)")
        with atomic_path(dst_dir / name) as tmp:
            shutil.copyfile(src, tmp)


def select_keyframes(episodes, *, max_chunk: int, per_task: int, seed: int) -> list[tuple[object, int]]:
    """(episode, boundary index) pairs: boundaries 0..max_chunk where the goal does not hold yet
    (and a chunk of actions follows), up to ``per_task`` per task drawn with ``seed``; every
    episode's first boundary is taken before any later one. Episodes started from a fixed
    evaluation state are refused: those states are for evaluation only."""
    import numpy as np

    bad = [e.key for e in episodes if e.init_mode == "eval"]
    if bad:
        raise PairError(f"{bad[0]} started from a fixed evaluation state (init_mode=eval): evaluation states never "
                        "train or start GRPO; rebuild the manifest from demonstrations and `make collect` data")
    rng = np.random.default_rng(seed)
    by_task: dict[int, list] = {}
    for e in episodes:
        ks = [k for k in range(min(max_chunk, len(e.actions) - 1) + 1) if not e.success[k]]
        by_task.setdefault(e.task, []).extend((e, k) for k in ks)
    chosen = []
    for task in sorted(by_task):
        cands = by_task[task]
        order = rng.permutation(len(cands))
        firsts = [i for i in order if cands[i][1] == 0]
        rest = [i for i in order if cands[i][1] != 0]
        chosen += [cands[i] for i in (firsts + rest)[:per_task]]
    return chosen


def _keyframes(manifest: Path, out: Path, *, chunk: int, context: int, max_chunk: int, per_task: int,
               seed: int, action_history: int = 0) -> dict:
    """Keyframes of the manifest's training episodes -> INIT_FILE (frames, proprio, task) and INIT_INDEX."""
    from safetensors.torch import save_file

    from wmrl.worldmodel.data import load_split

    _, train, _ = load_split(manifest, chunk=chunk, verify=False)  # verified by the caller's manifest check
    chosen = select_keyframes(train, max_chunk=max_chunk, per_task=per_task, seed=seed)
    if not chosen:
        raise PairError(f"{manifest} has no training episodes with a keyframe to start from")
    tensors, info = keyframe_tensors(chosen, context, action_history)
    info.update(max_chunk=max_chunk, seed=seed)
    with atomic_path(out / INIT_FILE) as tmp:
        save_file(tensors, str(tmp))
    write_json(out / INIT_INDEX, info)
    return info


def keyframe_tensors(chosen: list[tuple[object, int]], context: int, action_history: int = 0) -> tuple[dict, dict]:
    """(episode, chunk) keyframes -> the tensors an imagined rollout starts from (both views'
    ``context`` frames ending at the keyframe, the first repeated; proprio; task; with
    ``action_history`` > 0 also the chunks of actions executed before it, zeros before the
    episode's start) and their index."""
    import numpy as np
    import torch

    def history(frames: np.ndarray, k: int) -> np.ndarray:
        return np.stack([frames[max(0, k - j)] for j in range(context - 1, -1, -1)])

    tensors = {"main": torch.from_numpy(np.stack([history(e.main, k) for e, k in chosen])),
               "wrist": torch.from_numpy(np.stack([history(e.wrist, k) for e, k in chosen])),
               "proprio": torch.from_numpy(np.stack([e.proprio[k] for e, k in chosen])),
               "task": torch.tensor([e.task for e, _ in chosen], dtype=torch.int64),
               "chunk": torch.tensor([k for _, k in chosen], dtype=torch.int64)}
    if action_history:
        def before(actions: np.ndarray, k: int) -> np.ndarray:
            return np.stack([actions[k - j] if k - j >= 0 else np.zeros_like(actions[0])
                             for j in range(action_history, 0, -1)])

        tensors["past_actions"] = torch.from_numpy(np.stack([before(e.actions, k) for e, k in chosen]))
    per_task_count: dict[str, int] = {}
    for e, _ in chosen:
        per_task_count[str(e.task)] = per_task_count.get(str(e.task), 0) + 1
    # the source episode's outcome in the simulator and the policy that recorded it: what imagined
    # rollouts from its first keyframe by that same policy should reach (ImaginedEnv.diagnostics)
    info = {"keyframes": [{"episode": e.key, "file_sha256": e.file_sha256, "chunk": k, "task": e.task,
                           "source": e.source, "episode_success": e.succeeded,
                           "episode_policy": e.policy} for e, k in chosen],
            "episodes": sorted({e.key for e, _ in chosen}), "context": context,
            **({"action_history": action_history} if action_history else {}),
            "instructions": {str(e.task): e.instruction for e, _ in chosen},
            "per_task": dict(sorted(per_task_count.items(), key=lambda kv: int(kv[0])))}
    return tensors, info


def package_pair(run: str | os.PathLike, out: str | os.PathLike | None = None, *, overwrite: bool = False,
                 keyframe_max_chunk: int = 8, keyframes_per_task: int = 50, seed: int = 0, students: bool = False) -> Path:
    """Build RUN/model_pair from the update's selection (``students``: the few-step students of
    ``make wm-distill`` instead), the reward model and the manifest."""
    from wmrl.data.manifest import load_manifest
    from wmrl.lineage import git_commit
    from wmrl.worldmodel.model import FrameWorldModel

    layout = RunLayout(run)
    out = Path(out or layout.model_pair)
    sel_file, missing = ((layout.student_selection, f"distil the world models first (make wm-distill RUN={run})")
                         if students else (layout.selection, f"run the world-model update first (make wm-update RUN={run})"))
    sel = read_json(sel_file, PairError, missing)
    load_manifest(layout.manifest, verify=True)
    if (out / "pair.json").exists() and not overwrite:
        raise FileExistsError(f"{out}/pair.json exists; pass --overwrite (OVERWRITE=1) to package again")
    # a pair's reward judges the frames of the pair's own models: the teacher's reward reads the
    # one-step students' frames at chance (bench/RESULTS.md), so students come with their own
    reward = layout.student_reward if students else layout.reward
    reward_config = reward / "config.json"  # (a missing teacher reward is named by _copy below)
    if students and not reward_config.exists():
        raise PairError(f"{reward} not found: train the reward on the students' frames first "
                        f"(make wm-reward RUN={run} STUDENTS=1)")
    packed = {v: sel[v]["weights"] for v in VIEWS}
    judged = read_json(reward_config, PairError, "").get("generated_by") if reward_config.exists() else None
    if judged and judged != packed:  # (a reward trained on real frames only names no models)
        again = f"make wm-reward RUN={run} OVERWRITE=1" + (" STUDENTS=1" if students else "")
        raise PairError(f"{reward} was trained on frames of other world models ({judged}) than the ones to pack "
                        f"({packed}): train it again ({again})")
    sources = {**{v: Path(w) for v, w in packed.items()}, "reward": reward}
    cfgs = {v: FrameWorldModel.read_config(sources[v])[0] for v in VIEWS}
    if cfgs["main"].image_size != cfgs["wrist"].image_size or cfgs["main"].chunk_size != cfgs["wrist"].chunk_size:
        raise PairError(f"the main and wrist models differ in image or chunk size ({cfgs}); train both with one profile")
    for part, src in sources.items():
        _copy(src, out / part)
    init_info = _keyframes(layout.manifest, out, chunk=cfgs["main"].chunk_size,
                           context=max(c.context for c in cfgs.values()), max_chunk=keyframe_max_chunk,
                           per_task=keyframes_per_task, seed=seed,
                           action_history=max(c.action_history for c in cfgs.values()))
    files = {part: [_file_entry(out / part / n, out) for n in ("model.safetensors", "config.json")] for part in PARTS}
    files["init_observations"] = [_file_entry(out / INIT_FILE, out), _file_entry(out / INIT_INDEX, out)]
    pair = {
        "format": FORMAT, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "contract": {"image_size": cfgs["main"].image_size, "chunk_size": cfgs["main"].chunk_size,
                     "action_dim": ACTION_DIM, "proprio_dim": PROPRIO_DIM, "views": list(VIEWS),
                     "context": init_info["context"],
                     **({"action_history": init_info["action_history"]} if "action_history" in init_info else {})},
        "models": {**{v: {"step": sel[v]["step"], "stopped": sel[v]["reason"], "source": str(sources[v]),
                          "sample_steps": cfgs[v].sample_steps, **({"distilled_from": sel[v]["teacher"]} if students else {})}
                      for v in VIEWS},
                   "reward": {"threshold": read_json(out / "reward" / "config.json", PairError, "")["threshold"]}},
        "init_observations": {"episodes": len(init_info["episodes"]), "keyframes": len(init_info["keyframes"]),
                              "per_task": init_info["per_task"]},
        "files": files,
        "lineage": {"manifest_sha256": sha256_file(layout.manifest), "selection": str(layout.selection),
                    "git_commit": git_commit()},
    }
    write_json(out / "pair.json", pair)
    return out / "pair.json"


@dataclass(frozen=True)
class ModelPair:
    root: Path
    meta: dict

    def part(self, name: str) -> Path:
        return self.root / name


def load_pair(path: str | os.PathLike) -> ModelPair:
    """Read ``pair.json`` (a folder or the file) and verify every file's size and SHA-256."""
    path = Path(path)
    root = path if path.is_dir() else path.parent
    meta = read_json(root / "pair.json", PairError, "package one with `make package RUN=...`")
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise PairError(f"{root / 'pair.json'}: not a {FORMAT} file")
    for part, entries in meta["files"].items():
        for e in entries:
            f = root / e["path"]
            if not f.is_file():
                raise PairError(f"{f} ({part}) is missing from the model pair {root}")
            if f.stat().st_size != e["bytes"] or sha256_file(f) != e["sha256"]:
                raise PairError(f"{f} ({part}) does not match its SHA-256 in {root / 'pair.json'}: "
                                "the pair was modified or damaged; package it again")
    return ModelPair(root, meta)


def check_contract(pair: ModelPair, *, image_size: int, chunk_size: int, views=VIEWS) -> None:
    """Refuse a pair made for another image size, chunk size or camera set (before any weight loads)."""
    c = pair.meta.get("contract")
    if not c:
        raise PairError(f"{pair.root / 'pair.json'} has no contract (an older format): package it again (make package)")
    want = {"image_size": image_size, "chunk_size": chunk_size, "views": list(views), "action_dim": ACTION_DIM,
            "proprio_dim": PROPRIO_DIM}
    bad = {k: (c.get(k), v) for k, v in want.items() if c.get(k) != v}
    if bad:
        k, (have, need) = next(iter(bad.items()))
        raise PairError(f"the model pair {pair.root} was made for {k}={have}, this run needs {need}: "
                        "use a pair trained for this profile (make wm-update / make package with the same PROFILE)")


def measured_figures(pair: ModelPair) -> dict | None:
    """``make wm-eval``'s figures of this very ``pair.json``; None when it was not evaluated, or
    evaluated before the pair was packaged again (a ``fidelity.json`` of other models)."""
    fid = pair.root / FIDELITY_FILE
    if not fid.is_file():
        return None
    figures = read_json(fid, PairError, "")
    if figures.get("pair_json_sha256") != sha256_file(pair.root / "pair.json"):
        return None
    return figures


def measured_agreement(pair: ModelPair) -> dict | None:
    """The pair's episode agreement with the simulator as ``make wm-eval`` measured it (None:
    unmeasured, ``measured_figures``)."""
    return (measured_figures(pair) or {}).get("agreement")


def wilson_high(hits: int, n: int, z: float = 1.96) -> float:
    """Upper end of the Wilson 95% interval of a rate of ``hits`` in ``n``."""
    p = hits / n
    centre, spread = p + z * z / (2 * n), z * (p * (1 - p) / n + z * z / (4 * n * n)) ** 0.5
    return (centre + spread) / (1 + z * z / n)


def signal_share(balanced: float | None) -> float | None:
    """The share of the simulator's GRPO signal that the pair's successes carry: (TPR - FPR)^2 =
    (2 x balanced accuracy - 1)^2. Where the reward's errors do not depend on the actions, an
    imagined success happens with probability FPR + (TPR - FPR) x P(real success), so the
    advantages and a step's expected gradient shrink by TPR - FPR while the outcomes' noise stays:
    a step needs 1 / share times the rollouts for the simulator's signal-to-noise (0.85 -> 0.49,
    2x; 0.67 -> 0.11, 9x). Errors that follow the actions are worse than noise: an objective of
    their own that the policy can learn."""
    if balanced is None:
        return None
    return round(max(0.0, 2 * balanced - 1) ** 2, 4)


def check_agreement(pair: ModelPair, floor: float) -> dict | None:
    """Refuse a pair whose measured agreement lies below ``floor`` with its whole 95% interval
    (few held-out episodes make a wide interval: only a pair shown to be worse is refused), or
    that imagines a control succeeding too often to reach it (``check_controls``). Returns the
    agreement (None: unmeasured)."""
    figures = measured_figures(pair) or {}
    agreement = figures.get("agreement")
    if floor <= 0:
        return agreement
    check_controls(pair, figures.get("controls") or {}, floor)
    point = (agreement or {}).get("balanced_accuracy")
    if point is None:  # (also where the held-out episodes all share one outcome)
        return agreement
    low, high = agreement.get("balanced_accuracy_95") or (point, point)
    if high < floor:
        raise PairError(
            f"the model pair {pair.root} tells the simulator's successes from failures at {point:.2f} (95%: "
            f"{low:.2f}-{high:.2f}, {agreement.get('episodes', '?')} held-out episodes; {FIDELITY_FILE}), below "
            f"grpo.min_agreement={floor}: GRPO in it would follow {signal_share(point):.2f} of the simulator's signal "
            f"((2 x agreement - 1)^2) and learn the reward model's errors{ranking_clause(figures)}. Train its world models "
            f"further ({train_further(pair)}) or on more episodes (make collect), or pass --min-agreement 0 "
            "(make grpo|cycle MIN_AGREEMENT=0) to train in this pair anyway")
    return agreement


def ranking_clause(figures: dict) -> str:
    """Where ``make wm-eval`` recorded it, how the reward ranks the held-out episodes whatever its
    threshold, imagined against real frames: which of the two lost the outcome."""
    r = figures.get("reward_ranking") or {}
    imagined, real = r.get("imagined"), r.get("real")
    if not imagined:
        return ""
    return (f" (whatever the threshold, the reward ranks the imagined episodes at AUC {imagined['auc']:.2f}"
            + (f", their real frames at {real['auc']:.2f}" if real else "") + ")")


def check_controls(pair: ModelPair, controls: dict, floor: float, source: str = FIDELITY_FILE) -> None:
    """Refuse a pair that imagines success for a control (``hold``: zero actions, ``random``:
    uniform ones; both fail in the simulator). Their imagined successes are false alarms, and the
    balanced accuracy (TPR + TNR) / 2 reaches ``floor`` only with TNR >= 2 x floor - 1 even where
    every real success is seen: a pair shown below that on a control (the upper end of the Wilson
    interval of its TNR) cannot reach the floor, and GRPO in it would learn the control's behaviour."""
    for name in ("hold", "random"):
        c = controls.get(name) or {}
        n, hits = c.get("rollouts") or 0, c.get("successes") or 0
        if n and wilson_high(n - hits, n) < 2 * floor - 1:
            raise PairError(
                f"the model pair {pair.root} imagines success for {hits} of {n} rollouts of the control {name!r} "
                f"({'zero actions' if name == 'hold' else 'random actions'}, which fail in the simulator; "
                f"{source}): GRPO in it would reward that. Its agreement cannot reach "
                f"grpo.min_agreement={floor} while more than {2 - 2 * floor:.0%} of them succeed. Train its world models "
                f"further ({train_further(pair)}) or on more episodes (make collect), or pass --min-agreement 0 "
                "(make grpo|cycle MIN_AGREEMENT=0) to train in this pair anyway")


def train_further(pair: ModelPair) -> str:
    """The commands that train a pair's world models further, in the run that trained them (its
    ``pair.json`` names their weights, RUN/worldmodels/<view>/global_step_N), and package and
    evaluate them again. More updates of the same data took a pair from agreement 0.37 to 0.62
    on an H100 (bench/RESULTS.md "Twice the world-model updates")."""
    meta = pair.meta or read_json(pair.root / "pair.json", PairError, "")
    try:
        wrist = meta["models"]["wrist"]
        run, step = Path(wrist["source"]).parents[2], int(wrist["step"])
    except (KeyError, TypeError, ValueError, IndexError):  # an older pair.json: the commands without values
        return "make wm-update RUN=... MORE=1 STEPS=..., then make wm-reward, package OVERWRITE=1 and make wm-eval"
    return (f"make wm-update RUN={run} MORE=1 STEPS={2 * step}, make wm-reward RUN={run} OVERWRITE=1, "
            f"make package RUN={run} OVERWRITE=1, make wm-eval RUN={run}")
