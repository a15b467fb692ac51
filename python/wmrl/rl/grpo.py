"""GRPO for the flow-matching policy, in the real simulator or inside the world models.

Read top to bottom; one GRPO step is

    1. starts    ``groups`` start states (seeded random placements, or keyframes of real
                 trajectories in the model pair); each is shared by the ``group_size``
                 rollouts of its group
    2. rollouts  every chunk is sampled with the flow-SDE (noise level 0.5, temperature 1),
                 in all K denoising transitions or, with ``noisy_transitions="one"`` (RLinf's
                 flow-SDE setting), in one of them drawn per chunk, the others ODE steps;
                 its denoising chain x_0 .. x_K and the log-densities are kept
                 (``wmrl.policy.sampling``); the controller executes the chunk (gripper
                 snapped to -1/0/+1); a rollout ends at success (success-once) or after
                 ``max_chunks``
    3. advantage reward = success (0/1); A = (r - mean of the group) / (std of the group +
                 eps); groups whose members all agree carry no signal and are skipped
    4. update    only the action expert trains (``trainable``; the encoders stay as SFT left
                 them). For every kept chunk, the log-density of its stored chain is recomputed
                 under the current parameters (all K transitions in one batched pass); per
                 action element (chunk position x action dimension) the ratio
                 exp(log p_new - log p_old), log p summed over the K transitions (the joint
                 density of the element's chain; ``ratio_transitions`` keeps only the first,
                 noisiest ones; with one noisy transition, that transition's), enters the
                 PPO-clipped surrogate
                 -min(r A, clip(r, 1 - 0.2, 1 + 0.28) A), averaged over a chunk's elements and
                 then over rollouts (each rollout weighs the same); optional KL to the policy
                 GRPO started from (k3 estimator, off by default); gradient clipping;
                 ``epochs`` x ``minibatches`` optimizer steps (each minibatch's gradient
                 accumulated over passes of at most ``micro_chunks`` chunks, for memory),
                 stopped early once the approximate KL passes ``target_kl``
    5. step size the KL between the policy that acted and the updated one, measured on the
                 step's chunks over the whole denoising chain, sets the next step's learning
                 rate (x or / 1.5 towards ``desired_kl``): how far one step moves the flow policy varies too much
                 between runs for a fixed lr (bench/RESULTS.md)

and the cadence of the original (seed 000): every ``eval_interval`` (5) steps the policy's
weights are saved and evaluated in the real simulator on the fixed initial states
(``eval_trials`` per task; the full 10 x 50 at the last step); every ``full_interval`` (10)
steps and at the last one the full state (weights, optimizer, RNG, position). A killed run
reruns with the same command and continues from the last full state; the step's starts and
every random draw are functions of (seed, step, rollout, chunk), so the continuation is
bit-identical on one device.

Checkpoints: ``RUN/weights/policy/global_step_N`` (N = GRPO step; step 0 is the supervised
policy GRPO starts from, copied from ``RUN/weights/sft`` with its lineage). Logs:
``RUN/logs/grpo.jsonl`` + TensorBoard, ``RUN/logs/grpo_curves.png``; evaluations in
``RUN/evidence/evaluations/global_step_N.json``.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

from wmrl import rng
from wmrl.config import TRIALS_PER_TASK, ConfigError, EvalConfig, GRPOConfig, SimConfig
from wmrl.evaluation.evidence import (change_text, evaluation_with, kept_evaluations, paired_change, sampler_label,
                                      supervised_origin)
from wmrl.layout import RunLayout
from wmrl.policy import checkpoint as ck


@dataclass
class GRPOJob:
    run: Path
    cfg: GRPOConfig
    sim: SimConfig  # the real simulator: rollouts (env=sim) and every evaluation
    target: int  # train to this GRPO step (TARGET)
    resume: int | None = None  # RESUME=N: the full state of step N; None: newest GRPO full state, else newest SFT
    pair: Path | None = None  # env=wm: the model pair (default RUN/model_pair)
    init_from: Path | None = None  # step 0 from this run's newest supervised checkpoint (default: RUN's own)
    eval_tasks: tuple[int, ...] = tuple(range(10))  # the real evaluations (all ten)
    eval_seed: int = 0
    eval_first: bool = True  # a fresh run evaluates step 0 (the supervised policy) with final_trials first
    max_minutes: float | None = None  # a time limit: the step that passes it becomes the last (full state + 10 x 50)
    workers: int = 0  # simulator processes (0: one per core)
    envs_per_worker: int = 3  # LIBERO envs per episode slot (one per task; two slots per worker; ~0.8 GB each)
    device: str = "auto"
    profile: str = "default"
    progress: bool = True
    tensorboard: bool = True
    command: str | None = None
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.cfg.rollout_physics:  # rollouts start from random placements; evaluations keep sim.physics
            self.sim = replace(self.sim, train_physics=self.cfg.rollout_physics)


# =========================================================================== where to start
def find_start(job: GRPOJob) -> tuple[str, ck.CheckpointInfo]:
    """("resume", a full GRPO checkpoint), ("sft", the supervised checkpoint step 0 copies),
    ("evaluate", the target's full state whose evaluation was not finished) or ("done", the
    finished target). Checks everything it can without loading weights; one-line errors say what to do."""
    grpo = ck.list_checkpoints(job.run, "policy")
    done = [c for c in grpo if c.full and c.step == job.target]
    if done and (job.resume is None or job.resume < job.target):
        # a rerun of a finished run: nothing to do, unless it was stopped in its last evaluation
        # (the state is saved before it; on an H100 the renderers once found no GPU memory there)
        return ("done" if RunLayout(job.run).evidence(job.target).exists() else "evaluate"), done[-1]
    if job.resume is not None:
        info = ck.resolve(job.run, job.resume, "policy")
        if not info.full:
            raise ck.CheckpointError(
                f"{info.path} is weights-only (a policy+evaluation checkpoint of the every-{job.cfg.eval_interval}-steps "
                f"cadence): it has no optimizer or RNG state to resume; resume from a full state (every "
                f"{job.cfg.full_interval} steps): " + ", ".join(str(c.step) for c in grpo if c.full))
        if job.target <= job.resume:
            raise ConfigError(f"TARGET={job.target} must be above RESUME={job.resume} (it is the step to train to)")
        # a rerun of the same command after a kill continues from the newest full state since
        later = [c for c in grpo if c.full and job.resume < c.step < job.target]
        return "resume", (later[-1] if later else info)
    full = [c for c in grpo if c.full and c.step < job.target]
    if full:
        return "resume", full[-1]
    if grpo:
        raise ck.CheckpointError(f"{ck.policy_dir(job.run)} holds no full GRPO state below TARGET={job.target} "
                                 f"({ck.describe_available(job.run)}); give RESUME=<a full step> or start a new RUN")
    source = job.init_from or job.run
    sft = ck.list_checkpoints(source, "sft")
    if not sft:
        raise ck.CheckpointError(f"no policy to start from: {ck.describe_available(source, 'sft')}")
    return "sft", sft[-1]


def plan(job: GRPOJob) -> dict:
    kind, info = find_start(job)
    if kind == "done":
        return {"run": str(job.run), "start": f"nothing to do: GRPO step {info.step} = TARGET exists ({info.path})"}
    if kind == "evaluate":
        return {"run": str(job.run), "start": f"GRPO step {info.step} = TARGET exists ({info.path}) without its "
                f"evaluation: evaluate it ({job.cfg.final_trials} trials per task), no GRPO step"}
    pair = None
    if job.cfg.env == "wm":
        from wmrl.evaluation.closed_loop import grpo_threshold
        from wmrl.release.pair import check_contract, load_pair

        p = load_pair(job.pair or RunLayout(job.run).model_pair)  # hashes checked
        check_contract(p, image_size=job.sim.image_size, chunk_size=job.sim.chunk_size)
        pair = {"folder": str(p.root), "reward_threshold": grpo_threshold(
            job.cfg.reward_threshold, p.root, job.cfg.success_chunks, job.cfg.min_agreement) or "the pair's own"}
    start = info.step if kind == "resume" else 0
    evals = [s for s in range(start + 1, job.target + 1) if s % job.cfg.eval_interval == 0 or s == job.target]
    return {"run": str(job.run), "env": job.cfg.env, "pair": pair,
            "start": f"resume the full state of GRPO step {info.step} ({info.path})" if kind == "resume" else
                     f"step 0 = supervised checkpoint {info.ref} ({info.path})",
            "steps": f"{start} -> {job.target}", "rollouts_per_step": job.cfg.rollouts,
            "evaluations": {str(s): (job.cfg.final_trials if s == job.target else job.cfg.eval_trials) for s in evals},
            "full_states": [s for s in evals if s % job.cfg.full_interval == 0 or s == job.target],
            "grpo": asdict(job.cfg), "sim": asdict(job.sim)}


# =========================================================================== the policy side
def chunk_noise(seed: int, step: int, rollouts: list[int], chunks: list[int], k: int, chunk: int, dim: int, device):
    """The flow-SDE's x_0, per-transition noise and noisy transition (for
    ``noisy_transitions="one"``, uniform over the K) for each (rollout, chunk): a function of
    (seed, step, rollout, chunk) alone, so batching and resuming never change a sample."""
    from wmrl.rl.envs import derived_seed

    x0, eps, noisy = [], [], []
    for r, c in zip(rollouts, chunks):
        g = torch.Generator().manual_seed(derived_seed(seed, step, r, c))
        x0.append(torch.randn((chunk, dim), generator=g))
        eps.append(torch.randn((k, chunk, dim), generator=g))
        noisy.append(torch.randint(k, (), generator=g))
    return torch.stack(x0).to(device), torch.stack(eps).to(device), torch.stack(noisy).to(device)


def encode(model, norm, lang, main, wrist, proprio, instructions):
    """Prefix tokens of a batch: uint8 images (B, H, W, 3), raw proprio, instruction strings."""
    from wmrl.policy.model import images_to_input

    dev = main.device
    lang_emb = torch.from_numpy(lang.lookup(list(instructions))).to(dev)
    p = (proprio.float() - norm["p_m"]) / norm["p_s"]
    return model.encode(images_to_input(main), images_to_input(wrist), lang_emb, p)


class Rollouts:
    """Everything the update needs, one row per acted chunk (kept on the policy's device)."""

    def __init__(self):
        self.parts: dict[str, list] = {k: [] for k in ("main", "wrist", "proprio", "instructions", "chain", "old_lp",
                                                       "chain_lp", "noisy", "rollout", "chunk")}

    def add(self, obs, chain, old_lp, chain_lp, noisy: torch.Tensor | None = None) -> None:
        """``old_lp``: what enters the ratio; ``chain_lp``: the whole chain's, for the step-size
        control; ``noisy`` (B,): each chunk's one stochastic transition (None: all were; stored as -1)."""
        if noisy is None:
            noisy = torch.full((len(chain),), -1, dtype=torch.long, device=chain.device)
        for k, v in (("main", obs.main), ("wrist", obs.wrist), ("proprio", obs.proprio), ("chain", chain),
                     ("old_lp", old_lp), ("chain_lp", chain_lp), ("noisy", noisy),
                     ("rollout", torch.tensor(obs.rollout, device=chain.device)),
                     ("chunk", torch.tensor(obs.chunk, device=chain.device))):
            self.parts[k].append(v)
        self.parts["instructions"].extend(obs.instructions)

    def tensors(self, device=None) -> dict:
        """Rows ordered by (rollout, chunk): the order in which workers happened to finish
        (or which process acted) never changes the update's minibatches."""
        out = {k: torch.cat(v) for k, v in self.parts.items() if k != "instructions" and v}
        if not out:
            return {"instructions": []}
        order = torch.argsort(out["rollout"] * 100_000 + out["chunk"]).cpu()
        out = {k: v[order.to(v.device)].to(device or v.device) for k, v in out.items()}
        out["instructions"] = [self.parts["instructions"][i] for i in order.tolist()]
        return out

    @staticmethod
    def merged(batches: list[dict], device) -> dict:
        """Several processes' ``tensors()`` as one batch on ``device``, ordered as one process's."""
        parts = Rollouts()
        for b in batches:
            for k, v in b.items():
                parts.parts[k].extend(v if k == "instructions" else [v])
        return parts.tensors(device)


# =========================================================================== advantages, loss
def group_advantages(rewards: torch.Tensor, groups: torch.Tensor, eps: float) -> tuple[torch.Tensor, int]:
    """(r - group mean) / (group std + eps) per rollout (std over the group's members,
    population form); groups whose rewards are all equal get 0 and are counted as skipped."""
    adv = torch.zeros_like(rewards)
    skipped = 0
    for g in groups.unique():
        m = groups == g
        r = rewards[m]
        if torch.all(r == r[0]):
            skipped += 1
            continue
        adv[m] = (r - r.mean()) / (r.std(unbiased=False) + eps)
    return adv, skipped


def outcome_advantages(outcomes: list, cfg: GRPOConfig, device) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Rewards (success-once) of a step's rollouts, their group-relative advantages and the
    number of groups skipped because their members agreed."""
    rewards = torch.tensor([float(o.success) for o in outcomes], device=device)
    adv, skipped = group_advantages(rewards, torch.tensor([o.group for o in outcomes], device=device), cfg.adv_eps)
    return rewards, adv, skipped


def chunk_advantages(batch: dict, adv: torch.Tensor, cfg: GRPOConfig) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per acted chunk: its rollout's advantage, the rows the update uses (a non-zero one) and each
    chunk's weight in the loss ("sequence": 1 / chunks of its rollout, so every rollout counts the
    same; "token": 1)."""
    sample_adv = adv[batch["rollout"]]
    keep = torch.nonzero(sample_adv != 0).flatten()
    counts = torch.bincount(batch["rollout"]).float()
    weights = 1.0 / counts[batch["rollout"]] if cfg.loss_agg == "sequence" else torch.ones_like(sample_adv)
    return sample_adv, keep, weights


def clipped_surrogate(new_lp: torch.Tensor, old_lp: torch.Tensor, adv: torch.Tensor, clip_low: float,
                      clip_high: float, weights: torch.Tensor | None = None) -> tuple[torch.Tensor, dict]:
    """PPO's clipped objective per action element: -min(r A, clip(r, 1 - low, 1 + high) A);
    ``new_lp``/``old_lp`` (B, chunk, A), ``adv`` (B,). Averaged over a chunk's elements, then over
    chunks with ``weights`` (B,) (equal by default). A ratio outside the band on the side the
    advantage pushes gets no gradient."""
    log_ratio = new_lp - old_lp
    ratio = torch.exp(log_ratio)
    a = adv[:, None, None]
    per_chunk = -torch.minimum(ratio * a, ratio.clamp(1 - clip_low, 1 + clip_high) * a).mean(dim=(1, 2))
    w = torch.ones_like(per_chunk) if weights is None else weights.to(per_chunk.dtype)
    loss = (per_chunk * w).sum() / w.sum()
    with torch.no_grad():
        clipped = ((ratio > 1 + clip_high) & (a > 0)) | ((ratio < 1 - clip_low) & (a < 0))
        stats = {"clip_fraction": float(clipped.float().mean()),
                 "approx_kl": float(((ratio - 1) - log_ratio).mean()),  # k3 estimator of KL(old || new) per element
                 "ratio_max": float(ratio.max())}
    return loss, stats


def reduce_steps(step_lp: torch.Tensor, cfg: GRPOConfig) -> torch.Tensor:
    """(B, K, chunk, A) log-densities of the K transitions -> one per element (B, chunk, A): the
    first ``cfg.ratio_transitions`` of them (0: all), summed or averaged (``cfg.logprob_reduce``)."""
    if cfg.ratio_transitions:
        step_lp = step_lp[:, : cfg.ratio_transitions]
    return step_lp.sum(dim=1) if cfg.logprob_reduce == "sum" else step_lp.mean(dim=1)


def sampled_log_prob(step_lp: torch.Tensor, noisy: torch.Tensor | None, cfg: GRPOConfig) -> torch.Tensor:
    """The log-density a sampled chunk enters the ratio with, (B, chunk, A): its one noisy
    transition's, or the K transitions reduced by ``reduce_steps``."""
    if cfg.noisy_transitions == "one":
        return step_lp[torch.arange(len(step_lp), device=step_lp.device), noisy]
    return reduce_steps(step_lp, cfg)


def whole_chain(cfg: GRPOConfig) -> GRPOConfig:
    """``cfg`` with every denoising transition in the log-density. The step-size control measures
    the KL on it even when the ratio keeps only the first transitions: the rollouts act with the
    whole chain, and the late transitions (small std) are where a step moves the density most.
    Measured on the H200 (bench/RESULTS.md, GRPO run 8): with ratio_transitions=3 the first three
    transitions' KL stayed near 1e-4, the lr climbed to lr_max and the policy collapsed to 0%."""
    return replace(cfg, ratio_transitions=0)


def stored_log_probs(step_lp: torch.Tensor, noisy: torch.Tensor | None, cfg: GRPOConfig):
    """What a sampled chunk keeps for the update: (the ratio's log-density, the whole chain's for
    the step-size control); one and the same when the ratio covers the whole chain."""
    old_lp = sampled_log_prob(step_lp, noisy, cfg)
    return old_lp, (old_lp if cfg.ratio_transitions == 0 else sampled_log_prob(step_lp, noisy, whole_chain(cfg)))


def element_log_prob(model, norm, lang, batch: dict, idx, cfg: GRPOConfig):
    """log p of the stored chains of rows ``idx`` under ``model``: (b, chunk, A), the K denoising
    transitions reduced by ``cfg.logprob_reduce``, or the one noisy transition's."""
    from wmrl.policy.sampling import chain_log_prob, transition_log_prob

    prefix = encode(model, norm, lang, batch["main"][idx], batch["wrist"][idx], batch["proprio"][idx],
                    [batch["instructions"][i] for i in idx.tolist()])
    if cfg.noisy_transitions == "one":
        return transition_log_prob(model, prefix, batch["chain"][idx], batch["noisy"][idx], cfg.noise_level,
                                   temperature=cfg.temperature)
    lp = chain_log_prob(model, prefix, batch["chain"][idx], cfg.noise_level, temperature=cfg.temperature,
                        elementwise=True)
    return reduce_steps(lp, cfg)


def update(model, opt, batch: dict, adv: torch.Tensor, cfg: GRPOConfig, *, norm, lang, autocast, step: int,
           ref_model=None) -> dict:
    """PPO-clipped GRPO update on the chunks whose rollout has a non-zero advantage; stops the
    step's update early once the approximate KL passes ``cfg.target_kl``."""
    from wmrl.rl.envs import derived_seed

    sample_adv, keep, weights = chunk_advantages(batch, adv, cfg)
    stats = {"update_chunks": int(len(keep)), "loss": 0.0, "clip_fraction": 0.0, "approx_kl": 0.0, "grad_norm": 0.0,
             "kl_ref": 0.0, "optimizer_steps": 0, "early_stop": False, "approx_kl_start": 0.0, "approx_kl_final": 0.0,
             "approx_kl_stop": 0.0, "lr": opt.param_groups[0]["lr"]}
    if len(keep) == 0:
        return stats  # no group carried a signal: no update
    g = torch.Generator().manual_seed(derived_seed(cfg.seed, step, 0x0D))  # minibatch order
    n_mb = min(cfg.minibatches, len(keep))
    sums: dict[str, float] = {}
    model.train()
    if measures_agreement(cfg, step):
        stats.update(gradient_agreement(model, batch, sample_adv, weights, keep, n_mb, cfg, norm=norm, lang=lang,
                                        autocast=autocast))
    for _ in range(cfg.epochs):
        perm = keep[torch.randperm(len(keep), generator=g).to(keep.device)]
        for idx in perm.tensor_split(n_mb):
            opt.zero_grad(set_to_none=True)
            st = minibatch_gradient(model, batch, idx, sample_adv, weights, cfg, norm=norm, lang=lang, autocast=autocast,
                                    ref_model=ref_model)
            if stats["optimizer_steps"] == 0:  # before any change: the recompute's numerical floor
                stats["approx_kl_start"] = st["approx_kl"]
            if cfg.target_kl > 0 and st["approx_kl"] > cfg.target_kl and stats["optimizer_steps"] > 0:
                stats["early_stop"] = True  # the policy has moved far enough from the one that acted
                stats["approx_kl_stop"] = st["approx_kl"]
                opt.zero_grad(set_to_none=True)  # this minibatch's gradient is not applied
                break
            gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip if cfg.grad_clip > 0 else math.inf)
            opt.step()
            st.update(grad_norm=float(gnorm))
            for k, v in st.items():
                sums[k] = sums.get(k, 0.0) + v
            stats["optimizer_steps"] += 1
        if stats["early_stop"]:
            break
    for k, v in sums.items():  # means over the optimizer steps
        stats[k] = v / stats["optimizer_steps"]
    if stats["optimizer_steps"]:
        stats["approx_kl_final"] = final_kl(model, norm, lang, batch, keep, n_mb, cfg, autocast)
        stats["lr_next"] = adapt_lr(opt, stats["approx_kl_final"], cfg)
    return stats


def minibatch_gradient(model, batch: dict, idx: torch.Tensor, sample_adv: torch.Tensor, weights: torch.Tensor,
                       cfg: GRPOConfig, *, norm, lang, autocast, ref_model=None) -> dict:
    """The gradient of one minibatch's loss (the clipped surrogate, weighted mean over its chunks,
    plus the KL term when asked) into ``.grad``, in passes of at most ``cfg.micro_chunks`` chunks:
    each pass's loss is scaled by its share of the minibatch, so the sum is the whole minibatch's
    gradient while only one pass's activations are held. Returns the minibatch's statistics (means
    over its elements, the largest ratio)."""
    wsum = weights[idx].sum()
    st = {"loss": 0.0, "clip_fraction": 0.0, "approx_kl": 0.0, "kl_ref": 0.0, "ratio_max": 0.0}
    for piece in idx.split(cfg.micro_chunks):
        part = len(piece) / len(idx)  # its share of the minibatch's elements (every chunk has as many)
        with autocast:
            new_lp = element_log_prob(model, norm, lang, batch, piece, cfg)
            surrogate, ps = clipped_surrogate(new_lp.float(), batch["old_lp"][piece], sample_adv[piece], cfg.clip_low,
                                              cfg.clip_high, weights[piece])
            loss = surrogate * (weights[piece].sum() / wsum)  # the weighted mean over the whole minibatch
            if cfg.kl_coef > 0 and ref_model is not None:
                with torch.no_grad():
                    ref_lp = element_log_prob(ref_model, norm, lang, batch, piece, cfg).float()
                d = ref_lp - new_lp.float()
                kl = (torch.exp(d) - d - 1).mean()  # k3: KL(new || ref)
                loss = loss + cfg.kl_coef * kl * part
                st["kl_ref"] += float(kl.detach()) * part
        loss.backward()
        st["loss"] += float(loss.detach())
        st["clip_fraction"] += ps["clip_fraction"] * part
        st["approx_kl"] += ps["approx_kl"] * part
        st["ratio_max"] = max(st["ratio_max"], ps["ratio_max"])
    return st


def measures_agreement(cfg: GRPOConfig, step: int) -> bool:
    """Steps 1, 1 + N, 1 + 2N, ... (steps count from 1) measure the gradient agreement."""
    n = cfg.grad_agreement_interval
    return n > 0 and (step - 1) % n == 0


def group_gradients(model, batch: dict, sample_adv: torch.Tensor, weights: torch.Tensor, keep: torch.Tensor,
                    n_mb: int, cfg: GRPOConfig, *, norm, lang, autocast) -> tuple[list[int], torch.Tensor]:
    """Each group's policy gradient at the parameters that acted (ratio 1: -A grad log p, its
    rollouts weighed as the update weighs them), over the trained parameters: (group ids,
    (groups, parameters)), for the groups with a signal (``keep``). Nothing is updated."""
    params = [p for p in model.parameters() if p.requires_grad]
    group = batch["rollout"] // cfg.group_size  # rollout id = group * group_size + member
    ids = group[keep].unique().tolist()
    grads = []
    for g in ids:
        rows = keep[group[keep] == g]
        for p in params:
            p.grad = None
        wsum = weights[rows].sum()
        for idx in rows.tensor_split(max(1, -(-len(rows) * n_mb // len(keep)))):  # the update's minibatch size
            with autocast:
                lp = element_log_prob(model, norm, lang, batch, idx, cfg).float()
            (-(sample_adv[idx] * weights[idx] * lp.mean(dim=(1, 2))).sum() / wsum).backward()
        grads.append(torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten().float()
                                for p in params]))
    for p in params:
        p.grad = None
    return ids, (torch.stack(grads) if grads else torch.zeros(0))


def agreement(ids: list[int], G: torch.Tensor) -> dict:
    """Signal and noise of group gradients g_i = mu + e_i (independent e_i):

    - ``grad_signal_sq``: the mean of g_i . g_j over pairs of different groups, an unbiased
      estimate of |mu|^2 (negative when the noise hides it);
    - ``grad_noise_group``: the mean |g_i|^2 minus that, one group's noise E|e|^2; a step of n
      such groups has noise E|e|^2 / n, so ``grad_noise_group / grad_signal_sq`` is how many
      groups a step needs before its signal is as large as its noise (bench/RESULTS.md);
    - ``grad_cos_halves``: the cosine between the even-numbered and the odd-numbered groups'
      mean gradients, near 1 when the step's signal dominates and near 0 when its noise does."""
    n = len(ids)
    if n < 2:  # one group with a signal (or none): nothing to compare
        return {"grad_cos_halves": float("nan"), "grad_groups": n}
    gram = (G @ G.T).double()
    signal = float((gram.sum() - gram.diagonal().sum()) / (n * (n - 1)))
    parity = torch.tensor(ids, device=G.device) % 2
    even, odd = G[parity == 0], G[parity == 1]
    cos = float("nan")
    if len(even) and len(odd):
        cos = float(torch.nn.functional.cosine_similarity(even.mean(0), odd.mean(0), dim=0))
    return {"grad_cos_halves": cos, "grad_signal_sq": signal,
            "grad_noise_group": float(gram.diagonal().mean()) - signal, "grad_groups": n}


def gradient_agreement(model, batch: dict, sample_adv: torch.Tensor, weights: torch.Tensor, keep: torch.Tensor,
                       n_mb: int, cfg: GRPOConfig, *, norm, lang, autocast) -> dict:
    """Does this step's batch carry a direction, or mostly noise? ``agreement`` of its
    ``group_gradients``; costs one more forward and backward pass over the step's chunks."""
    return agreement(*group_gradients(model, batch, sample_adv, weights, keep, n_mb, cfg, norm=norm, lang=lang,
                                      autocast=autocast))


@torch.no_grad()
def final_kl(model, norm, lang, batch: dict, keep: torch.Tensor, n_mb: int, cfg: GRPOConfig, autocast) -> float:
    """Approximate KL per element (k3) between the policy that acted and the updated one, over
    all the step's kept chunks and the whole denoising chain (``whole_chain``): how far this step
    moved the policy."""
    total, count = 0.0, 0
    for idx in keep.tensor_split(n_mb):
        with autocast:
            lp = element_log_prob(model, norm, lang, batch, idx, whole_chain(cfg)).float()
        log_ratio = lp - batch["chain_lp"][idx]
        total += float(((torch.exp(log_ratio) - 1) - log_ratio).sum())
        count += log_ratio.numel()
    return total / max(count, 1)


def adapt_lr(opt, kl: float, cfg: GRPOConfig) -> float:
    """RSL-RL's adaptive schedule: the next step's lr / 1.5 when this step's KL passed
    2 x ``desired_kl``, x 1.5 when it stayed under half of it; kept in [lr_min, lr_max]. The lr
    lives in the optimizer's state, so a resumed run continues with it."""
    lr = opt.param_groups[0]["lr"]
    if cfg.desired_kl > 0:
        if kl > 2 * cfg.desired_kl:
            lr = max(cfg.lr_min, lr / 1.5)
        elif kl < cfg.desired_kl / 2:
            lr = min(cfg.lr_max, lr * 1.5)
        for group in opt.param_groups:
            group["lr"] = lr
    return lr


def make_optimizer(model, cfg: GRPOConfig) -> torch.optim.Optimizer:
    """AdamW over what ``cfg.trainable`` names; with "expert" the encoder is frozen
    (``requires_grad`` off), so the update builds no graph through it."""
    if cfg.trainable == "expert":
        model.requires_grad_(False)
        params = model.expert_parameters()
        for p in params:
            p.requires_grad_(True)
    else:
        params = list(model.parameters())
    return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=tuple(cfg.adam_betas),
                             eps=cfg.adam_eps)


# =========================================================================== one step
@dataclass
class Learner:
    """What a GRPO step changes or reads: the policy, its optimizer and statistics."""

    model: torch.nn.Module
    opt: torch.optim.Optimizer
    norm: dict  # the normalisation tensors on the policy's device
    lang: object  # LanguageCache
    cfg: GRPOConfig
    device: torch.device
    autocast: object
    ref_model: torch.nn.Module | None = None


def roll_out(learner: Learner, env, step: int) -> tuple[list, list, Rollouts, float]:
    """Step ``step``'s start states in ``env`` and this process's rollouts from them: the
    outcomes, every acted chunk with its chain and stored log-densities, and the seconds they took."""
    from wmrl.policy.runner import to_controller
    from wmrl.policy.sampling import sde_sample
    from wmrl.rl import ranks

    L, cfg = learner, learner.cfg
    k, chunk, adim = L.model.cfg.denoise_steps, L.model.cfg.chunk_size, L.model.cfg.action_dim
    buf = Rollouts()
    L.model.eval()

    def act(obs):  # the policy acts wherever observations are ready; chains are kept
        with torch.no_grad(), L.autocast:
            prefix = encode(L.model, L.norm, L.lang, obs.main, obs.wrist, obs.proprio, obs.instructions)
            x0, eps, noisy = chunk_noise(cfg.seed, step, obs.rollout, obs.chunk, k, chunk, adim, L.device)
            noisy = noisy if cfg.noisy_transitions == "one" else None
            s = sde_sample(L.model, prefix, k, cfg.noise_level, temperature=cfg.temperature, noise=x0, step_noise=eps,
                           noisy=noisy)
        buf.add(obs, s.chain, *stored_log_probs(s.element_log_probs, noisy, cfg), noisy)
        return to_controller(s.actions * L.norm["a_s"] + L.norm["a_c"], L.model.cfg.gripper_deadband)

    t0 = time.perf_counter()
    starts = env.starts(step)
    outcomes = env.run(ranks.share(starts), cfg.group_size, act)  # this process's groups (all, alone)
    return starts, outcomes, buf, time.perf_counter() - t0


def train_step(learner: Learner, env, step: int) -> tuple[dict | None, list, torch.Tensor | None]:
    """One GRPO step in ``env``: rollouts -> advantages -> the clipped update. Returns the log
    record, the outcomes and the advantages (on ranks other than 0, which only roll out:
    None, [], None)."""
    from wmrl.rl import ranks

    L, cfg = learner, learner.cfg
    starts, outcomes, buf, rollout_s = roll_out(L, env, step)
    shares = ranks.gather((outcomes, buf.tensors("cpu") if ranks.world()[1] > 1 else None, rollout_s))
    if shares is None:  # another rank learns; take its weights once it has
        ranks.send_weights(L.model)
        return None, [], None
    if len(shares) > 1:
        outcomes = sorted((o for share in shares for o in share[0]), key=lambda o: o.rollout)
        batch = Rollouts.merged([share[1] for share in shares], L.device)
        rollout_s = max(share[2] for share in shares)
    else:
        batch = buf.tensors()

    # advantages: success against the group's mean
    rewards, adv, skipped = outcome_advantages(outcomes, cfg, L.device)

    # the PPO-clipped update
    t1 = time.perf_counter()
    ust = update(L.model, L.opt, batch, adv, cfg, norm=L.norm, lang=L.lang, autocast=L.autocast, step=step,
                 ref_model=L.ref_model)
    ranks.send_weights(L.model)
    update_s = time.perf_counter() - t1

    env_steps = sum(o.steps for o in outcomes)
    rec = {"step": step, "rollout_success": float(rewards.mean()), "mean_reward": float(rewards.mean()),
           "groups": len(starts), "skipped_groups": skipped, "rollouts": len(outcomes), "chunks": len(batch.get("rollout", ())),
           "env_steps": env_steps, "env_builds": sum(o.env_built for o in outcomes),
           "rollout_s": round(rollout_s, 2), "update_s": round(update_s, 2),
           "env_steps_per_s": round(env_steps / max(rollout_s, 1e-9), 1),
           "update_share": round(update_s / max(rollout_s + update_s, 1e-9), 3),
           "tasks": sorted({s.task for s in starts}), **ust, **env.diagnostics(outcomes), "time": time.time()}
    peaks = sorted(o.reward_peak for o in outcomes if o.reward_peak is not None)
    if peaks:  # imagination: how high the reward model's success probability got, per rollout (median)
        rec["reward_peak_median"] = peaks[len(peaks) // 2]
    if not math.isfinite(rec["loss"]):
        raise FloatingPointError(f"GRPO loss is {rec['loss']} at step {step}; lower --lr (rerunning resumes from the "
                                 "last full state)")
    return rec, outcomes, adv


# groups of 8 a step that made GRPO's first measurable real gains in the simulator (bench/RESULTS.md, run 11)
SIMULATOR_GROUPS = 64


def pair_signal_text(pair: Path, agreement: dict | None, groups: int) -> str:
    """What the pair's measured agreement means for a step of ``groups`` groups: the share of the
    simulator's signal an imagined rollout carries, (2 x agreement - 1)^2 (measured on the CPU toy,
    bench/grpo_snr.py --label-noise), and the groups a step would need for the signal-to-noise of
    SIMULATOR_GROUPS groups in the simulator. An upper bound: on an H100 pair at agreement 0.75, 256
    groups a step (the signal of 64 by this rule) gave gradient halves with cosines of -0.12 to
    +0.01, where the simulator's 64 groups read +0.06 on average (bench/RESULTS.md, "256 groups a
    step in the one-step students"): the policy acting on imagined frames is what the rule leaves out."""
    from wmrl.release.pair import signal_share

    if agreement is None:
        return (f"[grpo] the agreement of {pair} with the simulator is unmeasured: GRPO in imagination gains only "
                f"where the pair's reward agrees with the simulator (make wm-eval RUN=... measures it)")
    point = agreement.get("balanced_accuracy")
    if point is None:  # every held-out episode had the same outcome in the simulator
        return (f"[grpo] the agreement of {pair} with the simulator has no value: the held-out episodes it was "
                f"measured on ({agreement.get('episodes', '?')}) all had the same outcome in the simulator (collect "
                f"more, with successes and failures, and make wm-eval again)")
    share = signal_share(point)
    text = (f"[grpo] the pair's agreement with the simulator, {point:.2f}, leaves an imagined rollout {share:.2f} of a "
            f"real one's signal ((2 x agreement - 1)^2): a step of {groups} groups carries the signal of at most "
            f"~{groups * share:.0f} in the simulator, where GRPO's first real gains took {SIMULATOR_GROUPS} (at most: "
            f"it counts the reward's errors on replays, not the policy failing more often on imagined frames; the "
            f"closed-loop check and the gradient's cosine of halves, grad_cos_halves, tell whether a step has a direction)")
    if 0 < share and groups * share < SIMULATOR_GROUPS:
        text += f"; --groups {math.ceil(SIMULATOR_GROUPS / share)} would match them (or a pair of higher agreement)"
    return text


def closed_loop_text(by_policy: dict, sft_ref: str | None) -> str:
    """``ImaginedEnv.diagnostics`` for a person: per policy that recorded the start episodes, the
    imagined success of this step's rollouts from their first keyframes beside their real success."""
    from wmrl.report import closed_loop_rows

    return (f"[grpo] closed-loop check of the pair, rollouts from the first keyframe of recorded episodes, by the "
            f"policy that recorded them: {closed_loop_rows(by_policy)}. Where that policy is the one GRPO started "
            f"from ({sft_ref}, at the same temperature) the two should match. Far below real: the policy acts worse on "
            f"imagined frames than on real ones (bench/action_gap.py measures how differently); far above: the reward "
            f"calls imagined failures successes. Either way GRPO learns what succeeds in the pair's frames")


# =========================================================================== the loop
def main(job: GRPOJob) -> dict:
    from tqdm import tqdm

    from wmrl.device import pick_device
    from wmrl.logs import MetricsLog
    from wmrl.rl import ranks
    from wmrl.rl.envs import ImaginedEnv, SimEnv

    cfg, layout = job.cfg, RunLayout(job.run)
    kind, info = find_start(job)  # checked before anything heavy
    if kind == "done":
        print(f"[grpo] {info.path} is the full state of TARGET={job.target}: nothing to do")
        return {"step": info.step, "start": info.step, "evaluations": [], "curves": None}
    if kind == "evaluate":
        return evaluate_saved(job, info)
    if cfg.env == "wm":  # the pair's hashes and contract, before any weight or rollout
        from wmrl.evaluation.closed_loop import grpo_threshold
        from wmrl.release.pair import check_contract, load_pair

        check_contract(load_pair(job.pair or layout.model_pair), image_size=job.sim.image_size,
                       chunk_size=job.sim.chunk_size)
        threshold = grpo_threshold(cfg.reward_threshold, job.pair or layout.model_pair, cfg.success_chunks,
                                   cfg.min_agreement)
    rank, world = ranks.world()
    device = pick_device(job.device, ranks.local_rank())
    ranks.init(device)  # several processes (torchrun): rank 0 learns, every rank rolls out its share
    main_rank = rank == 0
    on_gpu = device.type == "cuda"
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=on_gpu and cfg.bf16)
    say = (lambda *a: print(*a, flush=True)) if main_rank else (lambda *a: None)  # noqa: E731

    # ---- 1. the policy, its optimizer, where the run starts
    loaded = ck.load_checkpoint(info.path, need_full=(kind == "resume"))  # every file's hash checked
    if loaded.image_size and loaded.image_size != job.sim.image_size:
        raise ck.CheckpointError(f"{info.path} was trained on {loaded.image_size} px images, the simulator is set to "
                                 f"{job.sim.image_size} px: use the matching PROFILE or --image-size")
    if loaded.cfg.chunk_size != job.sim.chunk_size:
        raise ConfigError(f"{info.path} acts in chunks of {loaded.cfg.chunk_size}, the simulator runs chunks of "
                          f"{job.sim.chunk_size}: use a profile of the same chunk size")
    model = loaded.build_model(device)
    norm, lang, image_size = loaded.norm.tensors(device), loaded.lang, loaded.image_size
    opt = make_optimizer(model, cfg)
    if kind == "resume":
        st = loaded.train_state
        if st.get("kind") != "grpo":
            raise ck.CheckpointError(f"{info.path} holds a supervised training state, not GRPO's; resume a GRPO step")
        origin, start = st["origin"], info.step
        restarted = bool(st.get("moments_dropped"))
        if restarted:  # a portable state (wmrl.policy.pack): settings and lr, no moments
            if len(st["optimizer_groups"]) != len(opt.param_groups):
                raise ck.CheckpointError(f"{info.path}/train_state.pt has {len(st['optimizer_groups'])} parameter "
                                         f"groups, this run's optimizer {len(opt.param_groups)}: resume with the "
                                         f"TRAINABLE it was trained with")
            for group, saved in zip(opt.param_groups, st["optimizer_groups"]):
                group.update(saved)
            origin = {**origin, "moment_restarts": [*origin.get("moment_restarts", []), start]}
            say(f"[grpo] resuming step {start} from a portable state ({info.path}): the same data position, RNG and "
                f"lr ({opt.param_groups[0]['lr']:.3g}); Adam's moments restart from zero (they did not travel)")
        else:
            try:
                opt.load_state_dict(st["optimizer"])
            except (KeyError, ValueError) as e:
                raise ck.CheckpointError(f"{info.path}/train_state.pt does not fit this run ({e})") from None
            travelled = f"; Adam's moments travelled in {st['moments_dtype']}" if st.get("moments_dtype") else ""
            say(f"[grpo] resuming the full state of step {start} ({info.path}{travelled})")
        rng.restore(st["rng"])
    else:
        origin = {"sft_checkpoint": str(info.path.resolve()), "sft_ref": info.ref,
                  "sft_model_sha256": loaded.meta["files"]["model.safetensors"]}
        start, restarted = 0, False
        torch.manual_seed(cfg.seed)
    ref_model = None
    if cfg.kl_coef > 0:  # the policy GRPO started from, frozen
        ref_model = ck.load_checkpoint(origin["sft_checkpoint"]).build_model(device).requires_grad_(False)

    env = (SimEnv(job.sim, tasks=cfg.tasks, groups=cfg.groups, seed=cfg.seed,
                  workers=max(1, (job.workers or _cores()) // world), max_chunks=cfg.max_chunks,
                  envs_per_worker=job.envs_per_worker, device=device)
           if cfg.env == "sim" else
           ImaginedEnv(job.pair or layout.model_pair, tasks=cfg.tasks, groups=cfg.groups, seed=cfg.seed,
                       max_chunks=cfg.max_chunks, image_size=job.sim.image_size, chunk_size=job.sim.chunk_size,
                       index_dir=layout.grpo if main_rank else None, device=device, bf16=cfg.bf16,
                       success_chunks=cfg.success_chunks, world_noise=cfg.world_noise,
                       min_agreement=cfg.min_agreement, max_batch=cfg.wm_batch, threshold=threshold,
                       recorded_by=cfg.start_recorded_by))
    if cfg.env == "wm":
        say(pair_signal_text(env.pair.root, env.agreement, cfg.groups))
    layout.grpo.mkdir(parents=True, exist_ok=True)
    # rank 0 evaluates, on its own pool of all the cores when the rollouts' pools are shares
    evaluator = Evaluator(job, env if world == 1 else None) if main_rank else None

    def save(step: int, full: bool):
        state = None
        if full:
            state = {"kind": "grpo", "step": step, "optimizer": opt.state_dict(), "rng": rng.capture(),
                     "origin": origin, "grpo": asdict(cfg)}
        path = ck.save_checkpoint(layout.checkpoint(step), model, step=step, image_size=image_size, norm=loaded.norm,
                                  lang=lang, train_state=state,
                                  extra={"grpo": asdict(cfg), "env": env.settings(), "origin": origin,
                                         "profile": job.profile, "command": job.command, **job.extra})
        ck.update_latest(job.run, resume_command=job.command)
        return path

    step = start
    metrics = MetricsLog(layout.log("grpo"), tag="grpo", tensorboard=layout.tensorboard("grpo") if job.tensorboard
                         else None, start_step=start, say=say, enabled=main_rank)
    rollout_log = MetricsLog(layout.grpo / "rollouts.jsonl", tag="rollouts", start_step=start,  # every rollout's start and end
                             enabled=main_rank)
    try:
        if kind == "sft" and main_rank:  # step 0: the supervised policy, with its lineage, and its real success
            save(0, full=True)
            done = origin_evidence(layout.checkpoint(0), cfg.eval_sampler, trials=cfg.final_trials * len(job.eval_tasks),
                                   seed=job.eval_seed, temperature=cfg.eval_temperature)
            if job.eval_first and done:
                say(f"[grpo] step 0 was evaluated as the supervised checkpoint it copies (same weights, sampler and "
                    f"trials): {done}")
            elif job.eval_first:
                evaluator(model, loaded.norm, lang, image_size, 0, cfg.final_trials)
        elif main_rank and start and not layout.evidence(start).exists():
            # the call that saved this state was stopped in its evaluation: evaluate it before going on
            # (off the cadence it was the last step of a call with a time limit: the final trials)
            evaluator(model, loaded.norm, lang, image_size, start,
                      cfg.eval_trials if start % cfg.eval_interval == 0 else cfg.final_trials)

        # ---- 2. GRPO steps
        bar = tqdm(total=job.target, initial=start, desc=f"grpo ({cfg.env})", unit="step",
                   disable=not job.progress or not main_rank, dynamic_ncols=True)
        deadline = None if job.max_minutes is None else time.monotonic() + 60 * job.max_minutes
        learner = Learner(model, opt, norm, lang, cfg, device, autocast, ref_model)
        for step in range(start + 1, job.target + 1):
            rec, outcomes, adv = train_step(learner, env, step)
            # rank 0 decides (its clock) whether this step is the call's last; every rank follows
            timed_out = ranks.from_rank0(deadline is not None and time.monotonic() >= deadline and step < job.target)
            if not main_rank:
                continue
            if restarted and step == start + 1:  # the first step with fresh Adam moments: the curves mark it
                rec["moments_restarted"] = 1
            metrics.write(rec)
            if rec["skipped_groups"] == rec["groups"]:  # no group saw two outcomes: nothing to learn from
                outcome = {1.0: "all succeeded", 0.0: "all failed"}.get(rec["rollout_success"], "each group agreed")
                say(f"[grpo] step {step}: no group had both outcomes ({outcome}), so the policy did not change" +
                    (" (in imagination the reward model decides: see the pair's fidelity.json, agreement)"
                     if cfg.env == "wm" else ""))
            if step == start + 1 and rec.get("from_episode_starts"):  # the pair's closed-loop check, once a call
                say(closed_loop_text(rec["from_episode_starts"], origin.get("sft_ref")))
            rollout_log.write({"step": step, "outcomes": [asdict(o) for o in outcomes], "advantages": adv.tolist()})
            bar.set_postfix(success=f"{rec['rollout_success']:.2f}", skipped=f"{rec['skipped_groups']}/{rec['groups']}")
            bar.update(1)

            # the original's cadence: weights + real evaluation every 5, the full state every 10 and at the end
            last = step == job.target or timed_out
            if step % cfg.eval_interval == 0 or last:
                save(step, full=step % cfg.full_interval == 0 or last)
                evaluator(model, loaded.norm, lang, image_size, step, cfg.final_trials if last else cfg.eval_trials)
            if timed_out:
                say(f"[grpo] the time limit of {job.max_minutes} min passed: step {step} is this call's last "
                    f"(full state and the full evaluation written; rerun with the same TARGET to continue)")
                break
        bar.close()
    finally:
        metrics.close()
        rollout_log.close()
        if evaluator is not None:
            evaluator.close()
        env.close()
    if not main_rank:
        ranks.close()
        return {"step": step, "start": start, "evaluations": [], "curves": None}
    ranks.close()
    from wmrl.plots import grpo_curves

    png = grpo_curves(layout.log("grpo"), layout.logs / "grpo_curves.png", evaluator.history())
    say(f"[grpo] stopped at step {step}; curves: {png}")
    return {"step": step, "start": start, "evaluations": evaluator.history(), "curves": str(png) if png else None}


def evaluate_saved(job: GRPOJob, info: ck.CheckpointInfo) -> dict:
    """The last step of a run stopped in its final evaluation: its saved weights evaluated with
    ``final_trials``, nothing else loaded (no environment, no pair), the curves redrawn."""
    from wmrl.device import pick_device
    from wmrl.plots import grpo_curves
    from wmrl.rl import ranks

    if ranks.world()[0] != 0:  # several processes (torchrun): rank 0 evaluates, alone as always
        return {"step": info.step, "start": info.step, "evaluations": [], "curves": None}
    layout = RunLayout(job.run)
    print(f"[grpo] {info.path} is the full state of TARGET={job.target} but its evaluation was not finished: "
          "evaluating it now", flush=True)
    loaded = ck.load_checkpoint(info.path)  # every file's hash checked
    model = loaded.build_model(pick_device(job.device))
    evaluator = Evaluator(job, None)
    try:
        evaluator(model, loaded.norm, loaded.lang, loaded.image_size, info.step, job.cfg.final_trials)
    finally:
        evaluator.close()
    png = grpo_curves(layout.log("grpo"), layout.logs / "grpo_curves.png", evaluator.history())
    return {"step": info.step, "start": info.step, "evaluations": evaluator.history(), "curves": str(png) if png else None}


def origin_evidence(step0: Path, sampler: str, trials: int | None = None, seed: int | None = None,
                    temperature: float = 0.0) -> Path | None:
    """GRPO step 0 is a copy of a supervised checkpoint; the evaluation of that checkpoint in
    the run that trained it (same weights by SHA-256, same sampler and, for the SDE, temperature:
    ``temperature``, or the checkpoint's own where 0; ``trials`` episodes and evaluation ``seed``,
    if given), if there is one."""
    import json

    from wmrl.policy.model import FlowPolicy

    policy, _ = FlowPolicy.read_config(step0)
    origin = supervised_origin(step0)
    if origin is None:
        return None
    sft_evidence, sft_sha = origin
    # the same sampler, and for the SDE the same temperature (GRPO evaluates at the checkpoint's own unless told):
    # the checkpoint's newest evaluation or one it kept of another sampler
    wanted = sampler_label({"sampler": sampler, "temperature": temperature or policy.temperature_eval})
    ev = evaluation_with(sft_evidence, wanted)
    if ev is None:
        return None
    try:
        found = json.loads(ev.read_text())
        settings, done = found["settings"], found["summary"]["trials"]
    except (OSError, ValueError, KeyError):
        return None
    if (trials is not None and done != trials) or (seed is not None and settings.get("eval_seed") != seed):
        return None
    return ev if settings.get("checkpoint", {}).get("model_sha256") == sft_sha else None


def _cores() -> int:
    from wmrl.config import default_workers

    return default_workers()


class Evaluator:
    """Real-simulator evaluations of the policy in training, on the fixed initial states, with
    the evaluation's sampler; evidence in ``RUN/evidence/evaluations/global_step_N.json``. The
    simulator workers are kept for the whole run (shared with the rollouts when those run in
    the same simulator settings)."""

    def __init__(self, job: GRPOJob, env):
        self.job, self.pool, self.own = job, None, False
        if getattr(env, "sim", None) == job.sim:
            self.pool = env.pool

    def __call__(self, model, norm, lang, image_size: int, step: int, trials: int) -> dict:
        """``norm``: the checkpoint's ``NormStats``."""
        import json

        from wmrl.evaluation.evidence import publish
        from wmrl.evaluation.harness import evaluate, format_throughput
        from wmrl.fileio import sha256_file
        from wmrl.policy.runner import PolicyRunner
        from wmrl.sim.vector import SimulatorPool

        job, layout = self.job, RunLayout(self.job.run)
        info = ck.resolve(job.run, step, "policy")
        sha = sha256_file(info.path / "model.safetensors")
        evidence = layout.evidence(step)
        sampler, temperature = job.cfg.eval_sampler, job.cfg.eval_temperature or model.cfg.temperature_eval
        if evidence.exists():  # a rerun after a kill: the same weights were evaluated already, the same way
            old = json.loads(evidence.read_text())
            settings = old.get("settings", {})
            if settings.get("checkpoint", {}).get("model_sha256") == sha and \
                    old["summary"]["trials"] == trials * len(job.eval_tasks) and \
                    sampler_label(settings) == sampler_label({"sampler": sampler, "temperature": temperature}):
                return old["summary"]
        if next(model.parameters()).is_cuda:
            # the renderers (EGL) take their framebuffers from the GPU that the rollouts' and the
            # update's cached blocks fill: at 2,048 imagined rollouts a step, two runs on one H100,
            # the final evaluation's renderers failed ("Offscreen framebuffer is not complete")
            torch.cuda.empty_cache()
        if self.pool is None:
            self.pool = SimulatorPool(job.sim, job.workers or _cores(), policy_id="grpo-eval",
                                      max_envs=job.envs_per_worker)
            self.own = True
        runner = PolicyRunner.from_model(model, norm, lang, step=step, image_size=image_size,
                                         path=info.path, device=str(next(model.parameters()).device),
                                         seed=job.eval_seed, model_sha256=sha, eval_sampler=sampler,
                                         temperature_eval=temperature)
        cfg = EvalConfig(tasks=job.eval_tasks, trials=min(trials, TRIALS_PER_TASK), workers=self.pool.num_workers,
                         seed=job.eval_seed)
        result = evaluate(runner, sim=job.sim, cfg=cfg, out_dir=layout.eval_dir(step), policy_id=runner.policy_id,
                          overwrite=True, progress=job.progress, extra_settings=runner.settings(), pool=self.pool)
        publish(job.run, info, result.results, harness_results=result.results_path)
        s = result.summary
        print(f"[grpo] step {step}: real success {s['successes']}/{s['trials']} = {100 * s['success_rate']:.1f}% "
              f"({sampler_label({'sampler': sampler, 'temperature': temperature})}; evidence {evidence}); "
              f"{format_throughput(result.results['throughput_this_run'])}", flush=True)
        start = self.start_evidence() if step > 0 else None
        change = paired_change(json.loads(start.read_text()), result.results) if start else None
        if change and change["samplers"][0] == change["samplers"][1]:  # the same states, the same sampler
            print(f"[grpo] step {step} against step 0, state by state: {change_text(change, samplers=False)}", flush=True)
        return s

    def start_evidence(self) -> Path | None:
        """Step 0's evaluation: this run's own, or the supervised run's of the same weights, sampler
        and temperature (``origin_evidence``)."""
        layout = RunLayout(self.job.run)
        if layout.evidence(0).exists():
            return layout.evidence(0)
        step0 = [c.path for c in ck.list_checkpoints(self.job.run, "policy") if c.step == 0]
        return origin_evidence(step0[0], self.job.cfg.eval_sampler, temperature=self.job.cfg.eval_temperature) \
            if step0 else None

    def history(self) -> list[tuple[int, float, int, str]]:
        """(step, success rate, trials, sampler label) of every evaluation in the run so far."""
        import json

        from wmrl.layout import parse_step_name

        layout, out = RunLayout(self.job.run), []
        paths = {c.step: c.path for c in ck.list_checkpoints(self.job.run, "policy")}
        # with the evidence of steps whose weights are elsewhere (a portable state's history)
        evidenced = {parse_step_name(f.stem) for f in layout.evidence_dir("policy").glob("global_step_*.json")}
        for step in sorted(paths.keys() | (evidenced - {None})):
            ev = layout.evidence(step)
            if step == 0:  # or evaluated in the run that trained it
                ev = self.start_evidence() or ev
            # with the evaluations of other samplers that a newer one replaced (one line each in the curves)
            for f in ([ev] if ev.exists() else []) + kept_evaluations(layout.evidence(step)):
                result = json.loads(f.read_text())
                s = result["summary"]
                out.append((step, s["success_rate"], s["trials"], sampler_label(result.get("settings", {}))))
        return out

    def close(self) -> None:
        if self.own and self.pool is not None:
            self.pool.close()
