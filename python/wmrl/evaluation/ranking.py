"""Does the model pair rank policies the way the real simulator does?

For each policy (a checkpoint with its sampler and temperature):

* **imagined success**: closed-loop rollouts inside the pair from *held-out* keyframes (chunk
  boundaries of the manifest's validation episodes, which no world model trained on),
  ``trials`` rollouts per keyframe, all policies from the same keyframes; success once the
  reward model's probability reaches its calibrated threshold, as GRPO's imagined
  environment judges it;
* **real success**: the evaluation harness on the fixed initial states (``real_trials`` per
  task), the same sampler;

then the rank correlation of the two lists (Spearman; ties get their mean rank) and what each
evaluation cost in seconds: a pair that ranks policies right is also a cheap evaluator.

The scripted expert acts on the simulator's object poses, which imagination does not have, so
the policies compared are checkpoints: supervised ones of different training lengths and the
same checkpoint with a noisier sampler (a higher SDE temperature) make a spread of skill.
Two controls need no checkpoint: ``hold`` (every action zero: the arm stays, the gripper does
not move) and ``random`` (uniform actions in [-1, 1]^7, the simulator's random policy per
chunk). Both fail in the real simulator; a pair whose reward lets them succeed in imagination
does not judge the actions, whatever its ranking of the checkpoints.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from wmrl.config import ConfigError
from wmrl.worldmodel.reward import CONTROLS  # hold and random, the same two wherever controls are named


@dataclass(frozen=True)
class PolicySpec:
    """``sft/4000``, ``60`` (a GRPO step), or a checkpoint folder; ``@ode`` or ``@T=3`` after it
    picks the sampler (default: the checkpoint's flow-SDE at its evaluation temperature)."""

    name: str
    checkpoint: Path | None  # None: a control (``hold``, ``random``)
    sampler: str | None = None  # None: the checkpoint's eval_sampler
    temperature: float | None = None  # None: the checkpoint's temperature_eval

    def identity(self) -> tuple:
        """What makes the actions: the checkpoint with the sampler and temperature it will
        really use (its config's defaults filled in), so ``sft/4000`` and ``sft/4000@T=1.6``
        are the same policy when 1.6 is the checkpoint's evaluation temperature."""
        if self.checkpoint is None:
            return (self.name,)
        from wmrl.policy.model import FlowPolicy

        cfg, _ = FlowPolicy.read_config(self.checkpoint)  # the config alone, no weights
        sampler = self.sampler or cfg.eval_sampler
        temperature = self.temperature if self.temperature is not None else cfg.temperature_eval
        return (str(self.checkpoint.resolve()), sampler, float(temperature) if sampler == "sde" else None)


class ControlPolicy:
    """``hold`` or ``random`` as a chunk policy (the harness's and imagination's interface):
    no checkpoint, the same actions for the same observation whatever the batch."""

    def __init__(self, name: str, chunk_size: int, action_dim: int = 7, seed: int = 0):
        if name not in CONTROLS:
            raise ConfigError(f"unknown control policy {name!r}: choose one of {', '.join(CONTROLS)}")
        self.name, self.chunk_size, self.action_dim, self.seed = name, chunk_size, action_dim, int(seed)
        self.policy_id = f"control-{name}"

    def settings(self) -> dict:
        return {"control": self.name, "policy_seed": self.seed,
                "actions": "zero (arm still, gripper unchanged)" if self.name == "hold" else "uniform in [-1, 1]^7"}

    def act(self, observations: list) -> np.ndarray:
        out = np.zeros((len(observations), self.chunk_size, self.action_dim), np.float32)
        if self.name == "random":
            for i, o in enumerate(observations):  # seeded by the observation, as PolicyRunner's noise
                key = [self.seed, int(o.task_index), int(o.step)]
                state = getattr(o, "state", None)
                if state is not None:
                    key += np.frombuffer(np.ascontiguousarray(state, np.float64).tobytes(), np.uint32).tolist()
                out[i] = np.random.default_rng(key).uniform(-1.0, 1.0, out.shape[1:])
        return out


def parse_policy(text: str, run: str | Path) -> PolicySpec:
    from wmrl.policy import checkpoint as ck

    if text in CONTROLS:
        return PolicySpec(text, None)
    ref, _, how = text.partition("@")
    path = Path(ref)
    if not (path / "model.safetensors").is_file():
        path = ck.resolve(run, ref).path  # lists the checkpoints that exist when this one does not
    sampler, temperature = None, None
    if how == "ode":
        sampler = "ode"
    elif how.startswith("T="):
        try:
            sampler, temperature = "sde", float(how[2:])
        except ValueError:
            temperature = -1.0
        if temperature <= 0:
            raise ConfigError(f"--policy {text}: the temperature after @T= must be a positive number (e.g. @T=3)")
    elif how:
        raise ConfigError(f"--policy {text}: after @ write ode or T=<temperature> (e.g. sft/4000@T=3)")
    return PolicySpec(text, path, sampler, temperature)


def check_distinct(specs: list[PolicySpec]) -> None:
    """Refuse a policy listed twice under two names: it would count twice in the rank correlation."""
    seen: dict[tuple, str] = {}
    for spec in specs:
        key = spec.identity()
        if key in seen:
            what = spec.name if spec.checkpoint is None else f"{spec.checkpoint.name}, {key[1]}" + (
                f" at temperature {key[2]:g}" if key[2] is not None else "")
            raise ConfigError(f"--policy {seen[key]} and --policy {spec.name} are the same policy ({what}): list each "
                              "once (another temperature: @T=<t>; the deterministic sampler: @ode)")
        seen[key] = spec.name


def spearman(a: list[float], b: list[float]) -> float | None:
    """Spearman's rank correlation (ties: mean ranks); None when either list is constant or
    shorter than 2 (no order to compare)."""
    if len(a) != len(b):
        raise ValueError("spearman: the lists differ in length")
    if len(a) < 2:
        return None
    ra, rb = _ranks(np.asarray(a, float)), _ranks(np.asarray(b, float))
    if ra.std() == 0 or rb.std() == 0:
        return None
    return float(np.corrcoef(ra, rb)[0, 1])


def _ranks(x: np.ndarray) -> np.ndarray:
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x))
    ranks[order] = np.arange(len(x), dtype=float)
    for v in np.unique(x):  # ties share their mean rank
        ranks[x == v] = ranks[x == v].mean()
    return ranks


def imagined_success(env, runner, trials: int, traces: bool = False) -> dict:
    """``trials`` closed-loop rollouts of ``runner`` (a ``PolicyRunner``) from every keyframe of
    ``env`` (an ``ImaginedEnv``) of its tasks, all in one batch. ``traces``: every rollout imagined
    to the last chunk, the reward's probability at each chunk kept ("traces"; the success decision
    unchanged): other decision rules can be judged offline against the real success rates."""
    from wmrl.rl.envs import Start

    starts = [Start(0, i, t, keyframe=i) for i, t in enumerate(env.keyframe_tasks) if t in env.tasks]
    task_of = [s.task for s in starts for _ in range(trials)]
    chunk = env.chunk_size
    # a PolicyRunner's one pass over the whole batch (its act() would split it into fixed-size passes)
    act_all = getattr(runner, "act_batch", runner.act)

    def act(obs):  # the harness's observation objects, so the policy samples exactly as in evaluation
        rows = [SimpleNamespace(main=obs.main[j].cpu().numpy(), wrist=obs.wrist[j].cpu().numpy(),
                                proprio=obs.proprio[j].cpu().numpy(), instruction=obs.instructions[j],
                                task_index=task_of[r], step=obs.chunk[j] * chunk,
                                state=np.asarray([r], np.float64))  # distinct noise per rollout
                for j, r in enumerate(obs.rollout)]
        return torch.from_numpy(act_all(rows))

    t0 = time.perf_counter()
    outcomes = env.run(starts, trials, act, to_the_end=traces)
    seconds = time.perf_counter() - t0
    steps = sum(o.steps for o in outcomes)
    wins = [o for o in outcomes if o.success]
    peaks = [o.reward_peak for o in outcomes if o.reward_peak is not None]
    by_rule = {}
    if traces:  # the same rollouts judged by each success_chunks rule
        from wmrl.rl.envs import first_success

        for k in (1, 2, 3):
            hits = sum(first_success(o.reward_trace, env.threshold, k) is not None for o in outcomes)
            by_rule[str(k)] = round(hits / len(outcomes), 4)
    return {"success_rate": len(wins) / len(outcomes), "successes": len(wins), "rollouts": len(outcomes),
            "keyframes": len(starts), "trials_per_keyframe": trials, "seconds": round(seconds, 2),
            "imagined_steps": steps, "steps_per_s": round(steps / max(seconds, 1e-9), 1),
            # when imagination declares success, and how sure the reward is: a reward that fires
            # early and for every policy alike is the first suspect when the ranking fails
            "success_chunk_mean": round(float(np.mean([o.chunks for o in wins])), 2) if wins else None,
            "reward_peak_median": round(float(np.median(peaks)), 4) if peaks else None,
            "success_chunks": env.success_chunks,
            **({"traces": [o.reward_trace for o in outcomes], "trace_keyframes": [o.start for o in outcomes],
                "success_rate_by_success_chunks": by_rule} if traces else {})}


def held_out_env(pair: Path, manifest: Path, *, image_size: int | None, chunk_size: int | None, max_chunks: int,
                 tasks: tuple[int, ...] | None, max_chunk: int, keyframes_per_task: int, seed: int, device,
                 bf16: bool, success_chunks: int = 1, policy: str | None = None):
    """The pair as GRPO's imagined environment, started from keyframes of the manifest's
    validation episodes (no world model trained on them; ``policy``: only those that policy id
    recorded); ``image_size`` / ``chunk_size`` None: the pair's own. Returns (env, the pair's
    contract, the keyframes' summary for the result)."""
    from wmrl.release.pair import check_contract, load_pair
    from wmrl.rl.envs import ImaginedEnv, Keyframes

    loaded = load_pair(pair)  # every file's hash, then the contract, before any weight or episode loads
    contract = loaded.meta["contract"]
    image_size, chunk_size = image_size or contract["image_size"], chunk_size or contract["chunk_size"]
    check_contract(loaded, image_size=image_size, chunk_size=chunk_size)
    keyframes = Keyframes.held_out(manifest, chunk=chunk_size, context=contract["context"], max_chunk=max_chunk,
                                   per_task=keyframes_per_task, seed=seed,
                                   action_history=contract.get("action_history", 0), policy=policy)
    held = {int(k["task"]) for k in keyframes.info["keyframes"]}
    kf_tasks = tuple(sorted(held & set(tasks) if tasks is not None else held))
    if not kf_tasks:
        raise ConfigError(f"{manifest}'s validation episodes hold no keyframe of tasks {list(tasks or ())}")
    env = ImaginedEnv(pair, tasks=kf_tasks, groups=1, seed=seed, max_chunks=max_chunks, image_size=image_size,
                      chunk_size=chunk_size, index_dir=None, device=device, bf16=bf16, keyframes=keyframes,
                      success_chunks=success_chunks)
    info = {"origin": keyframes.origin, "count": sum(t in env.tasks for t in env.keyframe_tasks),
            "episodes": keyframes.info["episodes"]}
    return env, contract, info


def control_false_alarms(pair: Path, manifest: Path, *, trials: int = 4, keyframes_per_task: int = 5,
                         max_chunks: int = 30, seed: int = 0, device="cpu", bf16: bool = False) -> dict:
    """Imagined success of the two controls from held-out keyframes, no simulator needed: ``hold``
    never moves the arm and ``random`` does not solve a task, so in the real simulator both stay
    near 0% from these starts (the keyframes are where the goal does not hold yet); what they
    reach in the pair is the rate at which imagination calls a failing rollout successful."""
    env, contract, keyframes = held_out_env(pair, manifest, image_size=None, chunk_size=None, max_chunks=max_chunks,
                                            tasks=None, max_chunk=0, keyframes_per_task=keyframes_per_task, seed=seed,
                                            device=device, bf16=bf16)
    out = {"keyframes": keyframes, "trials_per_keyframe": trials, "max_chunks": max_chunks,
           "threshold": env.threshold}
    for name in CONTROLS:
        runner = ControlPolicy(name, env.chunk_size, contract["action_dim"], seed=seed)
        out[name] = imagined_success(env, runner, trials)
    return out


def rank_policies(specs: list[PolicySpec], *, pair: Path, manifest: Path, sim, tasks: tuple[int, ...], trials: int,
                  real_trials: int, keyframes_per_task: int, max_chunk: int, seed: int, workers: int, out_dir: Path,
                  device: str = "auto", bf16: bool = True, progress: bool = False, traces: bool = False,
                  guidance: tuple[float, ...] = (), success_chunks: int = 1) -> dict:
    """Imagined and real success of every policy, their rank correlation and costs (``traces``:
    see ``imagined_success``; the imagined seconds then count the rollouts run to the end).
    ``guidance``: imagine at each of these action-guidance scales (a pair trained with action
    dropout; the first is the headline "imagined", all under "imagined_by_guidance" with their own
    Spearman): one real evaluation per policy serves every scale. Empty: the pair's own scale.
    ``success_chunks``: GRPO's rule of that name (k chunks in a row at the reward's threshold);
    with ``traces`` every rule 1-3 is also read from the same rollouts, each with its Spearman."""
    from wmrl.config import EvalConfig
    from wmrl.device import pick_device
    from wmrl.evaluation.harness import evaluate
    from wmrl.fileio import sha256_file
    from wmrl.policy.runner import PolicyRunner
    from wmrl.sim.vector import SimulatorPool

    if len(specs) < 2:
        raise ConfigError("ranking needs at least 2 policies (--policy A --policy B ...; 4 or more to mean much)")
    check_distinct(specs)
    dev = pick_device(device)
    env, contract, keyframes = held_out_env(pair, manifest, image_size=sim.image_size, chunk_size=sim.chunk_size,
                                            max_chunks=sim.max_steps // sim.chunk_size, tasks=tasks,
                                            max_chunk=max_chunk, keyframes_per_task=keyframes_per_task, seed=seed,
                                            device=dev, bf16=bf16, success_chunks=success_chunks)
    scales = guidance_scales(env.world.models, guidance)
    pool = SimulatorPool(sim, workers, policy_id="wm-rank", max_envs=3)
    rows = []
    try:
        for spec in specs:
            if spec.checkpoint is None:
                runner = ControlPolicy(spec.name, sim.chunk_size, contract["action_dim"], seed=seed)
            else:
                runner = PolicyRunner(spec.checkpoint, device=str(dev), sampler=spec.sampler,
                                      temperature=spec.temperature, seed=seed)
            by_scale = {}
            for w in scales:
                for model in env.world.models.values():
                    model.guidance = w
                by_scale[w] = imagined_success(env, runner, trials, traces=traces)
            imagined = by_scale[scales[0]]
            t0 = time.perf_counter()
            cfg = EvalConfig(tasks=tasks, trials=real_trials, workers=pool.num_workers, seed=seed)
            real = evaluate(runner, sim=sim, cfg=cfg, out_dir=out_dir / _slug(spec.name), policy_id=runner.policy_id,
                            overwrite=True, progress=progress, extra_settings=runner.settings(), pool=pool).summary
            rows.append({"name": spec.name, "checkpoint": str(spec.checkpoint) if spec.checkpoint else None,
                         "policy_id": runner.policy_id,
                         "model_sha256": sha256_file(spec.checkpoint / "model.safetensors") if spec.checkpoint else None,
                         "imagined": imagined,
                         **({"imagined_by_guidance": {str(w): x for w, x in by_scale.items()}} if len(scales) > 1 else {}),
                         "real": {"success_rate": real["success_rate"], "successes": real["successes"],
                                  "trials": real["trials"], "seconds": round(time.perf_counter() - t0, 2)}})
            print(f"[wm-rank] {spec.name}: imagined {100 * imagined['success_rate']:.1f}% "
                  f"({imagined['rollouts']} rollouts, {imagined['seconds']:.1f} s), real "
                  f"{100 * real['success_rate']:.1f}% ({real['trials']} episodes)", flush=True)
    finally:
        pool.close()
    real_rates = [r["real"]["success_rate"] for r in rows]

    def rho(imagined_rates):  # Spearman against the real success rates, rounded
        value = spearman(imagined_rates, real_rates)
        return None if value is None else round(value, 4)

    by_guidance = {w: rho([r["imagined_by_guidance"][w]["success_rate"] for r in rows])
                   for w in map(str, scales)} if len(scales) > 1 else {}
    by_rule = {k: rho([r["imagined"]["success_rate_by_success_chunks"][k] for r in rows])
               for k in ("1", "2", "3")} if traces else {}
    imag_s = sum(x["seconds"] for r in rows for x in r.get("imagined_by_guidance", {"": r["imagined"]}).values())
    real_s = sum(r["real"]["seconds"] for r in rows)
    return {"pair": str(pair), "manifest": str(manifest), "keyframes": keyframes,
            "tasks": list(tasks), "trials_per_keyframe": trials, "real_trials_per_task": real_trials, "seed": seed,
            "policies": rows, "spearman": rho([r["imagined"]["success_rate"] for r in rows]),
            "guidance": scales[0], **({"spearman_by_guidance": by_guidance} if by_guidance else {}),
            "success_chunks": success_chunks, **({"spearman_by_success_chunks": by_rule} if by_rule else {}),
            "cost": {"imagined_seconds": round(imag_s, 2), "real_seconds": round(real_s, 2),
                     "real_over_imagined": round(real_s / max(imag_s, 1e-9), 2),
                     "device": str(dev), "simulator_workers": pool.num_workers}}


def guidance_scales(models: dict, guidance: tuple[float, ...]) -> list[float]:
    """The action-guidance scales to imagine at, checked against the pair's world models (view ->
    model) by their own config's rule (a scale other than 1 needs models trained with action dropout)."""
    from wmrl.config import override

    if not guidance:
        return [models["main"].guidance]
    text = ",".join(map(str, guidance))
    if len(set(guidance)) != len(guidance):
        raise ConfigError(f"--guidance {text}: distinct scales (1: no guidance)")
    for view, model in models.items():
        for w in guidance:
            try:
                override(model.cfg, action_guidance=w)
            except ConfigError as e:
                raise ConfigError(f"--guidance {text}: the {view} world model: {e}; retrain with wm_update.py "
                                  "--action-dropout 0.1 or rank at --guidance 1") from None
    return list(guidance)


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
