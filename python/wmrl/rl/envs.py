"""The two environments GRPO drives, behind one protocol.

    env.starts(step)                      -> this step's group start states (never an evaluation state)
    env.run(starts, group_size, act)      -> one Outcome per rollout; ``act(ObsBatch)`` is called
                                             whenever observations are ready and returns the
                                             controller's action chunks (B, chunk, 7)

* ``SimEnv``: the real LIBERO-Spatial simulator through the worker pool (the control
  experiment, RLinf's piRL setting). A group's members share a seeded random placement
  (``mode=train``); the reward is the simulator's success-once.
* ``ImaginedEnv``: the model pair. Rollouts start from keyframes of real training
  trajectories (both views' frame history and the proprio; keyframe-initialised rollouts),
  the main-view and wrist-view world models step in lockstep on the GPU, all rollouts of a
  step in one batch, and the frozen reward model scores every generated main | wrist pair:
  success once its probability reaches the threshold calibrated on validation data in
  ``success_chunks`` chunks in a row (1: the first crossing; 2 also asks the next chunk, which
  the policy acts in too, to look like success: a world model's passing glimpse of success
  does not count). A group's members draw the same sampler noise chunk by chunk
  (``world_noise="group"``, GRPO's default): the world stays one world for the whole group, as
  the simulator's deterministic physics is, and only the members' actions set them apart.

The algorithm (``wmrl.rl.grpo``) does not know which one it drives. Start states are a pure
function of (seed, step, group), so a resumed run draws the same ones; the imagined
environment's keyframe list is written once per run and pair (``RUN/grpo/keyframes-*.json``)
and checked, never reselected, on resume.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, replace
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Callable, Protocol

import numpy as np
import torch

from wmrl.config import WORLD_NOISE, SimConfig


@dataclass
class ObsBatch:
    """What the policy sees for B rollouts at a chunk boundary (tensors on the policy's device)."""

    main: torch.Tensor  # (B, H, W, 3) uint8, upright
    wrist: torch.Tensor
    proprio: torch.Tensor  # (B, P) float32, raw
    instructions: list[str]
    rollout: list[int]  # which rollout of this step each row belongs to
    chunk: list[int]  # the chunk's index within its rollout


@dataclass(frozen=True)
class Start:
    step: int
    group: int
    task: int
    seed: int | None = None  # SimEnv: the reset seed of the random placement (mode=train)
    keyframe: int | None = None  # ImaginedEnv: index into the pair's keyframes


@dataclass
class Outcome:
    rollout: int
    group: int
    success: bool
    chunks: int  # chunks acted
    steps: int  # simulator (or imagined) steps
    start: str  # "train" (a seeded random placement) or "keyframe:<episode>:<chunk>"; never an evaluation state
    env_built: bool = False  # SimEnv: its worker built the task's env first (a cost of the task schedule)
    placement_redraws: int = 0  # SimEnv: how often its placement was drawn again (an object slid away settling)
    # ImaginedEnv: the highest success probability the reward model gave the rollout's frames
    # (up to its success): where the calibrated threshold cuts, read per rollout
    reward_peak: float | None = None
    # ImaginedEnv.run(to_the_end=True): the reward's probability at every imagined chunk, past the
    # success too (decision rules other than the first crossing, studied offline)
    reward_trace: list[float] | None = None


class RolloutEnv(Protocol):
    name: str
    chunk_size: int
    image_size: int

    def starts(self, step: int) -> list[Start]: ...

    def run(self, starts: list[Start], group_size: int, act: Callable[[ObsBatch], torch.Tensor]) -> list[Outcome]: ...

    def settings(self) -> dict: ...

    def diagnostics(self, outcomes: list[Outcome]) -> dict: ...

    def close(self) -> None: ...


def rollout_id(start: Start, member: int, group_size: int) -> int:
    """A rollout's number within its step, from its group and member: the same whichever
    process runs it (``wmrl.rl.ranks``), so its noise and its advantage's place are too."""
    return start.group * group_size + member


def frame_noise(seed: int, step: int, keys: list[int], chunk: int, view: str, size: int, device,
                shared: bool = False) -> torch.Tensor:
    """The world model's starting noise for each rollout's imagined frame (B, 3, size, size): a
    function of (seed, step, key, chunk, view) alone, like the policy's ``chunk_noise``, so
    neither the batch an imagined rollout runs in nor the process that runs it changes it. A key
    is the rollout's id, or with ``shared`` its group's (``GRPOConfig.world_noise``)."""
    v = ("main", "wrist").index(view)
    out = []
    for k in keys:
        g = torch.Generator(device=device).manual_seed(derived_seed(seed, step, k, chunk, v, 0x1A6F if shared else 0x1A6E))
        out.append(torch.randn((3, size, size), generator=g, device=device))
    return torch.stack(out)


def derived_seed(*parts: int) -> int:
    """A 63-bit seed from integers (stable across runs, machines and Python versions)."""
    h = hashlib.blake2b(np.asarray(parts, np.int64).tobytes(), digest_size=8)
    return int.from_bytes(h.digest(), "little") & (2**63 - 1)


def keyframe_choice(seed: int, step: int, group: int, count: int) -> int:
    """Which of a task's ``count`` keyframes group ``group`` of step ``step`` starts from (the rule
    the keyframe index records; bench/closed_loop_gap.py replays it from a run's logs)."""
    return derived_seed(seed, step, group, 0x4B46) % count


def start_keyframes(keyframes: list[dict], tasks, recorded_by: str = "*") -> dict[int, list[int]]:
    """Per task, the indexes of the keyframes its groups may start from: those of episodes whose
    recording policy's id matches ``recorded_by`` (``GRPOConfig.start_recorded_by``). The rule
    the keyframe index records; bench/closed_loop_gap.py replays it from a run's logs."""
    kept = [i for i, k in enumerate(keyframes) if fnmatchcase(k.get("episode_policy") or "", recorded_by)]
    return {t: [i for i in kept if int(keyframes[i]["task"]) == t] for t in tasks}


def group_tasks(tasks: tuple[int, ...], step: int, groups: int) -> list[int]:
    """Tasks of this step's groups: a window of ``groups`` tasks that slides by one task per
    step, so every task comes ``groups`` times in any ``len(tasks)`` consecutive steps, and
    consecutive steps share all tasks but one. The simulator's workers keep an env for their
    most recent tasks (building one costs 4-6 s, a reset well under 1 s); windows that jumped by
    ``groups`` tasks shared none and made nearly every worker build every step
    (bench/grpo_rollouts.py)."""
    return [tasks[(step + g) % len(tasks)] for g in range(groups)]


# ------------------------------------------------------------------------------ real simulator
class SimEnv:
    name = "sim"

    def __init__(self, sim: SimConfig, *, tasks: tuple[int, ...], groups: int, seed: int, workers: int,
                 max_chunks: int, envs_per_worker: int = 3, device="cpu"):
        from wmrl.sim.vector import SimulatorPool

        self.sim = replace(sim, max_steps=min(sim.max_steps, max_chunks * sim.chunk_size))
        self.tasks, self.groups, self.seed, self.device = tasks, groups, seed, device
        self.chunk_size, self.image_size = sim.chunk_size, sim.image_size
        self.pool = SimulatorPool(self.sim, workers, policy_id="grpo", max_envs=envs_per_worker)

    def starts(self, step: int) -> list[Start]:
        return [Start(step, g, task, seed=derived_seed(self.seed, step, g, 0x5EED) % (2**31))
                for g, task in enumerate(group_tasks(self.tasks, step, self.groups))]

    def run(self, starts: list[Start], group_size: int, act) -> list[Outcome]:
        from wmrl.sim.tasks import get_task
        from wmrl.sim.vector import EpisodeSpec, FixedEpisodes

        specs = [EpisodeSpec(s.task, init_index=None, seed=s.seed, tag=rollout_id(s, m, group_size))
                 for s in starts for m in range(group_size)]
        assert all(sp.mode == "train" for sp in specs)  # fixed evaluation states never start a rollout
        group_of = {sp.tag: sp.tag // group_size for sp in specs}
        device, chunk = self.device, self.chunk_size

        class Adapter:  # the pool's chunk-policy interface -> ObsBatch
            policy_id = "grpo"

            def act(self, observations: list) -> np.ndarray:
                batch = ObsBatch(
                    main=torch.from_numpy(np.stack([o.main for o in observations])).to(device),
                    wrist=torch.from_numpy(np.stack([o.wrist for o in observations])).to(device),
                    proprio=torch.from_numpy(np.stack([o.proprio for o in observations]).astype(np.float32)).to(device),
                    instructions=[get_task(o.task_index).instruction for o in observations],
                    rollout=[o.spec.tag for o in observations], chunk=[o.step // chunk for o in observations])
                return act(batch).float().cpu().numpy()

        out = []
        for r in self.pool.run(FixedEpisodes(specs), Adapter()):
            out.append(Outcome(r.spec.tag, group_of[r.spec.tag], bool(r.success), -(-r.steps // chunk), r.steps,
                               r.spec.mode, r.env_built, placement_redraws=r.placement_redraws))
        return sorted(out, key=lambda o: o.rollout)

    def settings(self) -> dict:
        return {"env": "sim", "sim": asdict(self.sim), "workers": self.pool.num_workers,
                "start_states": "seeded random placements (mode=train), one per group"}

    def diagnostics(self, outcomes: list[Outcome]) -> dict:
        # The simulator is the reference the imagined environment is checked against; what it
        # reports is how many starts LIBERO's sampler had to draw again (~3%: a bowl thrown off a
        # plate while settling, SimConfig.max_settle_shift). A group's members share one start.
        redraws = {o.group: o.placement_redraws for o in outcomes}
        return {"redrawn_starts": sum(r > 0 for r in redraws.values()), "placement_redraws": sum(redraws.values())}

    def close(self) -> None:
        self.pool.close()


# ------------------------------------------------------------------------------ imagination
@dataclass
class Keyframes:
    """Where imagined rollouts start: both views' frame history and the proprio at chunk
    boundaries of real trajectories, with their task and instruction."""

    tensors: dict  # main / wrist (N, context, H, W, 3) uint8, proprio (N, P), task (N,)
    info: dict  # the index: keyframes [{episode, file_sha256, chunk, task, source}], instructions, per_task
    origin: str  # what they are, for the record

    @classmethod
    def of_pair(cls, pair) -> "Keyframes":
        """The pair's own keyframes (of its training episodes): GRPO's starts."""
        from safetensors.torch import load_file

        from wmrl.release.pair import INIT_FILE, INIT_INDEX

        return cls(load_file(str(pair.root / INIT_FILE)), json.loads((pair.root / INIT_INDEX).read_text()),
                   "keyframes of the pair's training trajectories")

    @classmethod
    def held_out(cls, manifest: Path, *, chunk: int, context: int, max_chunk: int, per_task: int,
                 seed: int, action_history: int = 0, policy: str | None = None) -> "Keyframes":
        """Keyframes of the manifest's *validation* episodes, which no world model trained on:
        the starts of an evaluation inside the pair (``policy``: only episodes that policy id recorded)."""
        from wmrl.release.pair import PairError, keyframe_tensors, select_keyframes
        from wmrl.worldmodel.data import load_split

        _, _, val = load_split(manifest, chunk=chunk)
        if policy is not None:
            recorded_by = sorted({e.policy for e in val})
            val = [e for e in val if e.policy == policy]
            if not val:
                raise PairError(f"{manifest}'s validation episodes were recorded by {recorded_by}, none by {policy}: "
                                "give the policy (and temperature) that recorded them, or collect with it")
        chosen = select_keyframes(val, max_chunk=max_chunk, per_task=per_task, seed=seed)
        if not chosen:
            raise PairError(f"{manifest} has no validation episodes with a keyframe: build it with --val-ratio > 0")
        tensors, info = keyframe_tensors(chosen, context, action_history)
        return cls(tensors, info, "keyframes of held-out (validation) trajectories")


def first_success(trace: list[float], threshold: float, success_chunks: int) -> int | None:
    """The chunk (0-based) where ``success_chunks`` chunks in a row at ``threshold`` begin in a
    reward trace (``Outcome.reward_trace``; NaN: not imagined), or None: ImaginedEnv's rule, read
    offline, so one traced rollout judges every rule."""
    from wmrl.worldmodel.fidelity import in_a_row

    hit = torch.tensor([[p == p and p >= threshold for p in trace]])  # NaN never clears it
    starts = torch.nonzero(in_a_row(hit, success_chunks)[0]).flatten()
    return int(starts[0]) if len(starts) else None


class ImaginedEnv:
    name = "wm"

    def __init__(self, pair_dir: str | Path, *, tasks: tuple[int, ...], groups: int, seed: int, max_chunks: int,
                 image_size: int, chunk_size: int, index_dir: Path | None, device="cpu", bf16: bool = False,
                 keyframes: Keyframes | None = None, success_chunks: int = 1, world_noise: str = "rollout",
                 min_agreement: float = 0.0, max_batch: int = 0, threshold: float = 0.0, recorded_by: str = "*"):
        """``keyframes``: where rollouts start (default: the pair's own); ``index_dir``: where the
        run's keyframe index is written once and checked on resume (None: not recorded);
        ``success_chunks``: chunks in a row at the reward's threshold that make a success;
        ``world_noise``: "group" (a group's rollouts share the samplers' noise) or "rollout"
        (``GRPOConfig.world_noise``; an evaluation's trials stay apart with "rollout");
        ``min_agreement``: refuse a pair ``make wm-eval`` measured below it (``GRPOConfig.min_agreement``);
        ``max_batch``: at most this many rollouts imagined at once, whole groups (0: all; ``GRPOConfig.wm_batch``);
        ``threshold``: the reward probability that makes a success (0: the one calibrated with the
        pair's reward; ``GRPOConfig.reward_threshold``); ``recorded_by``: starts only from keyframes
        of episodes whose recording policy's id matches this pattern (``GRPOConfig.start_recorded_by``)."""
        from wmrl.fileio import sha256_file, write_json
        from wmrl.release.pair import PairError, check_agreement, check_contract, load_pair
        from wmrl.worldmodel.imagine import Imagination
        from wmrl.worldmodel.model import FrameWorldModel
        from wmrl.worldmodel.reward import RewardModel

        pair = load_pair(pair_dir)  # every file's SHA-256 first
        check_contract(pair, image_size=image_size, chunk_size=chunk_size)  # before any weight loads
        self.agreement = check_agreement(pair, min_agreement)  # None: the pair was not evaluated (make wm-eval)
        self.pair, self.device, self.bf16 = pair, torch.device(device), bf16
        if not 1 <= success_chunks <= max_chunks:
            raise ValueError(f"success_chunks={success_chunks}: 1 (the first chunk at the threshold) up to "
                             f"max_chunks={max_chunks}")
        self.tasks, self.groups, self.seed, self.max_chunks = tasks, groups, seed, max_chunks
        self.success_chunks, self.max_batch = success_chunks, max_batch
        if world_noise not in WORLD_NOISE:
            raise ValueError(f"world_noise={world_noise!r}: {' or '.join(WORLD_NOISE)}")
        self.world_noise = world_noise
        self.chunk_size, self.image_size = chunk_size, image_size
        keyframes = keyframes or Keyframes.of_pair(pair)  # where rollouts start: checked before any weight loads
        kf, info = keyframes.tensors, keyframes.info
        self.keyframe_origin = keyframes.origin
        self.instructions = {int(t): s for t, s in info["instructions"].items()}
        self.keyframe_names = [f"keyframe:{k['episode']}:{k['chunk']}" for k in info["keyframes"]]
        self.keyframe_tasks = [int(k["task"]) for k in info["keyframes"]]
        # (chunk, the recorded episode's real outcome, the policy that recorded it) per keyframe name;
        # the outcome and policy are None / "" in pairs packaged before they were indexed
        self.keyframe_sources = {name: (int(k["chunk"]), k.get("episode_success"), k.get("episode_policy") or "")
                                 for name, k in zip(self.keyframe_names, info["keyframes"])}
        self.recorded_by = recorded_by
        self.by_task = start_keyframes(info["keyframes"], tasks, recorded_by)
        missing = [t for t, ids in self.by_task.items() if not ids]
        if missing and recorded_by != "*":
            policies = sorted({self.keyframe_sources[self.keyframe_names[i]][2] or "(not named)"
                               for i, t in enumerate(self.keyframe_tasks) if t in missing})
            raise PairError(f"no keyframe of task(s) {missing} in {pair.root} comes from an episode recorded by a policy "
                            f"matching {recorded_by!r}; theirs were recorded by {policies}: give a pattern that matches "
                            "one of them (grpo.start_recorded_by), or '*'")
        if missing:
            raise PairError(f"{keyframes.origin} ({pair.root}) include no keyframe of task(s) {missing}: collect "
                            f"trajectories of those tasks into the manifest, or use --tasks "
                            f"{','.join(map(str, info['per_task']))}")
        main = FrameWorldModel.from_pretrained(pair.part("main"), self.device)
        wrist = FrameWorldModel.from_pretrained(pair.part("wrist"), self.device)
        self.world = Imagination(main, wrist)
        self.reward = RewardModel.from_pretrained(pair.part("reward"), self.device)
        self.calibrated_threshold = float(self.reward.threshold)
        self.threshold = threshold or self.calibrated_threshold
        self.frames = {"main": kf["main"].to(self.device), "wrist": kf["wrist"].to(self.device)}  # (N, C, H, W, 3)
        self.proprio = kf["proprio"].to(self.device).float()
        history = max(main.cfg.action_history, wrist.cfg.action_history)
        if history and ("past_actions" not in kf or kf["past_actions"].shape[1] < history):
            raise PairError(f"{keyframes.origin} ({pair.root}) carry no {history} chunk(s) of past actions, which its "
                            "world models read (action_history): package the pair again with this kit")
        self.past_actions = kf["past_actions"].to(self.device).float() if history else None
        self.index_path = None
        if index_dir is None:
            return
        # the run's keyframe index: written once per pair, checked (never reselected) on resume
        index = {"pair": str(pair.root), "pair_json_sha256": sha256_file(pair.root / "pair.json"),
                 "keyframes": info["keyframes"], "rule": "group g of step s starts from keyframe "
                 "by_task[task][derived_seed(seed, s, g) % len(by_task[task])]", "seed": seed,
                 "recorded_by": recorded_by}
        self.index_path = index_dir / f"keyframes-{index['pair_json_sha256'][:12]}.json"
        if self.index_path.exists():
            old = json.loads(self.index_path.read_text())
            if old.get("keyframes") != index["keyframes"] or old.get("seed") != seed or \
                    old.get("recorded_by", "*") != recorded_by:
                raise PairError(f"{self.index_path} indexes other keyframes, another seed or another start_recorded_by "
                                f"({old.get('recorded_by', '*')!r}) than this run's: GRPO never reselects keyframes on "
                                "resume; use the pair, seed and start_recorded_by the run began with")
        else:
            write_json(self.index_path, index)

    def starts(self, step: int) -> list[Start]:
        out = []
        for g, task in enumerate(group_tasks(self.tasks, step, self.groups)):
            ids = self.by_task[task]
            out.append(Start(step, g, task, keyframe=ids[keyframe_choice(self.seed, step, g, len(ids))]))
        return out

    @torch.no_grad()
    def run(self, starts: list[Start], group_size: int, act, *, to_the_end: bool = False) -> list[Outcome]:
        """``to_the_end``: imagine every rollout for ``max_chunks`` and record the reward's
        probability at each chunk (``Outcome.reward_trace``); success and its chunk are decided
        as always (``success_chunks`` in a row at the threshold), only the imagining goes on."""
        from wmrl.worldmodel.model import images_to_unit, unit_to_images

        if not starts:  # more processes than groups: nothing to imagine here
            return []
        per_slice = max(1, self.max_batch // group_size) if self.max_batch else len(starts)
        if len(starts) > per_slice:  # in slices of whole groups: every rollout's noise is its own (or its group's)
            return [o for i in range(0, len(starts), per_slice)
                    for o in self.run(starts[i:i + per_slice], group_size, act, to_the_end=to_the_end)]
        kf = torch.tensor([s.keyframe for s in starts for _ in range(group_size)], device=self.device)
        b = len(kf)
        group = [s.group for s in starts for _ in range(group_size)]
        rid = [rollout_id(s, m, group_size) for s in starts for m in range(group_size)]
        shared = self.world_noise == "group"
        key = group if shared else rid  # whose sampler noise a rollout's frames start from
        instr = [self.instructions[s.task] for s in starts for _ in range(group_size)]
        self.world.start(images_to_unit(self.frames["main"][kf]), images_to_unit(self.frames["wrist"][kf]),
                         self.proprio[kf], None if self.past_actions is None else self.past_actions[kf])
        main, wrist = self.frames["main"][kf, -1], self.frames["wrist"][kf, -1]  # uint8 (B, H, W, 3)
        proprio = self.proprio[kf]
        done = torch.zeros(b, dtype=torch.bool, device=self.device)
        success = torch.zeros_like(done)
        chunks = torch.zeros(b, dtype=torch.long, device=self.device)
        peak = torch.zeros(b, device=self.device)
        streak = torch.zeros(b, dtype=torch.long, device=self.device)  # chunks in a row at the threshold
        trace = torch.full((b, self.max_chunks), float("nan"), device=self.device) if to_the_end else None
        imagined = torch.arange(b, device=self.device)  # the rollouts in the world's batch, in its order
        step = starts[0].step
        autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=self.bf16 and self.device.type == "cuda")
        for t in range(self.max_chunks):
            live = torch.nonzero(~done).flatten()
            if len(live) == 0:
                break
            if len(live) < len(imagined):  # finished rollouts leave the batch: no frames imagined for them
                self.world.keep(torch.searchsorted(imagined, live))
                imagined = live
            rows = live.tolist()
            actions = act(ObsBatch(main[live], wrist[live], proprio[live], [instr[i] for i in rows],
                                   [rid[i] for i in rows], [t] * len(rows))).to(self.device).float()
            noise = {view: frame_noise(self.seed, step, [key[i] for i in rows], t, view, self.image_size, self.device,
                                       shared) for view in ("main", "wrist")}
            with autocast:
                m, w, p = self.world.step(actions, noise=noise)
                seen = self.reward.inputs({"main": m, "wrist": w})
                prob = torch.sigmoid(self.reward(seen.to(next(self.reward.parameters()).dtype)).float())
            main[live], wrist[live], proprio[live] = unit_to_images(m.float()), unit_to_images(w.float()), p.float()
            hit = prob >= self.threshold
            open_ = ~success[live]  # still undecided: counts its chunk and its peak
            chunks[live[open_]] += 1
            peak[live[open_]] = torch.maximum(peak[live[open_]], prob[open_])
            streak[live] = torch.where(hit, streak[live] + 1, 0)
            confirmed = streak[live] >= self.success_chunks
            success[live] |= confirmed
            if trace is None:
                done[live] |= confirmed
            else:
                trace[live, t] = prob
        return [Outcome(rid[i], group[i], bool(success[i]), int(chunks[i]), int(chunks[i]) * self.chunk_size,
                        self.keyframe_names[int(kf[i])], reward_peak=round(float(peak[i]), 4),
                        reward_trace=None if trace is None else [round(x, 4) for x in trace[i].tolist()])
                for i in range(b)]

    def settings(self) -> dict:
        return {"env": "wm", "pair": str(self.pair.root), "pair_models": self.pair.meta.get("models"),
                "reward_threshold": self.threshold, "reward_threshold_calibrated": self.calibrated_threshold,
                "success_chunks": self.success_chunks, "max_chunks": self.max_chunks,
                "world_noise": self.world_noise,
                # the pair's agreement with the simulator when GRPO began (make wm-eval; None: not evaluated)
                "agreement": None if self.agreement is None else {
                    k: self.agreement.get(k) for k in ("balanced_accuracy", "balanced_accuracy_95", "episodes")},
                "keyframe_index": str(self.index_path),
                "start_states": f"{self.keyframe_origin} (keyframe-initialised rollouts)",
                "start_recorded_by": self.recorded_by,
                "start_keyframes": sum(len(ids) for ids in self.by_task.values())}

    def diagnostics(self, outcomes: list[Outcome]) -> dict:
        """The closed-loop check of the pair, read off a step's own rollouts: those that start
        from the *first* keyframe of a recorded episode, per policy that recorded it, their
        imagined success beside the simulator's success of the same episodes. Where the policy in
        the loop is the one that recorded them (GRPO's first step from the collecting checkpoint),
        the two should match: ``make wm-eval``'s agreement replays recorded actions, this lets the
        policy act on the imagined frames, as GRPO does. (H100, bench/RESULTS.md: a pair at
        agreement 0.67 gave the policy 25% imagined success where those episodes had 63% real.)"""
        counts: dict[str, list[int]] = {}
        for o in outcomes:
            chunk, real, policy = self.keyframe_sources.get(o.start, (None, None, ""))
            if chunk == 0 and real is not None and policy:
                c = counts.setdefault(policy, [0, 0, 0])
                c[0], c[1], c[2] = c[0] + o.success, c[1] + bool(real), c[2] + 1
        if not counts:
            return {}
        return {"from_episode_starts": {p: {"rollouts": n, "imagined_success": round(i / n, 4),
                                            "recorded_success": round(r / n, 4)} for p, (i, r, n) in sorted(counts.items())}}

    def close(self) -> None:
        pass

