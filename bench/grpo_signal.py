"""How many rollouts does a GRPO step need on LIBERO? The gradient's signal and noise, measured
on real rollouts of a real policy.

    .venv/train/bin/python bench/grpo_signal.py --policy runs/a/weights/sft/global_step_4000 \
        --steps 2 --groups 8 --group-size 8 --workers 2 --json out.json

Rolls out ``--steps`` GRPO steps' worth of real-simulator episodes with the policy (the GRPO
rollout code itself: seeded random placements, flow-SDE at temperature 1; no update between
them, so every batch is drawn from the same policy), and for each batch computes every group's
policy gradient at ratio 1 (``grpo.gradient_agreement``). Between groups, g_i . g_j estimates the
squared true gradient |mu|^2 (the signal); |g_i|^2 minus it one group's noise. A step of n groups
has noise / n, so

    groups_for_snr_1 = noise_group / signal

is how many groups (of ``--group-size`` rollouts) one step needs before its gradient's signal is
as large as its noise; below that Adam mostly follows noise. Reported per estimator of the same
rollouts (``--ratio-transitions``: 0 = all K transitions in the log-density, N = the first N),
averaged over the batches; the signal estimate of one batch of 8 groups is itself noisy, so
``--steps`` > 1 is what makes the figure worth reading. Across batches (the same policy, other
placements) a task met twice tells a task's own direction (g . g' of the same task) apart from
sampling noise (g . g' of other tasks, and its expectation |mu|^2).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--policy", required=True, help="a policy checkpoint folder (weights/sft/global_step_N)")
    p.add_argument("--steps", type=int, default=2, help="independent batches (GRPO steps' start states)")
    p.add_argument("--groups", type=int, default=8)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--ratio-transitions", default="0,3,1", help="estimators to compare: 0 = all K, N = first N")
    p.add_argument("--noisy-transitions", default="all", choices=("all", "one"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--json", help="write the figures here")
    args = p.parse_args(argv)
    variants = [int(x) for x in args.ratio_transitions.split(",")]
    if not Path(args.policy, "model.safetensors").is_file():
        p.error(f"{args.policy} holds no model.safetensors: pass a checkpoint folder such as "
                "runs/a/weights/sft/global_step_4000")

    import torch

    from wmrl.config import get_profile, override
    from wmrl.device import pick_device
    from wmrl.policy import checkpoint as ck
    from wmrl.rl import grpo
    from wmrl.rl.envs import SimEnv

    device = pick_device(args.device, 0)
    loaded = ck.load_checkpoint(Path(args.policy))
    prof = get_profile("default")
    cfg = override(prof.grpo, groups=args.groups, group_size=args.group_size, seed=args.seed,
                   noisy_transitions=args.noisy_transitions)
    sim = override(prof.sim, image_size=loaded.image_size or prof.sim.image_size, train_physics=cfg.rollout_physics)
    model = loaded.build_model(device)
    grpo.make_optimizer(model, cfg)  # only for what it trains: requires_grad on the action expert
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda" and cfg.bf16)
    learner = grpo.Learner(model, None, loaded.norm.tensors(device), loaded.lang, cfg, device, autocast)
    env = SimEnv(sim, tasks=cfg.tasks, groups=cfg.groups, seed=cfg.seed, workers=args.workers,
                 max_chunks=cfg.max_chunks, envs_per_worker=3, device=device)
    rows: dict[int, list[dict]] = {v: [] for v in variants}
    kept: dict[int, list[tuple[int, int, torch.Tensor]]] = {v: [] for v in variants}  # (batch, task, gradient)
    batches = []
    try:
        for step in range(1, args.steps + 1):
            starts, outcomes, buf, rollout_s = grpo.roll_out(learner, env, step)
            task_of = {s.group: s.task for s in starts}
            batch = buf.tensors()
            rewards, adv, skipped = grpo.outcome_advantages(outcomes, cfg, device)
            sample_adv, keep, weights = grpo.chunk_advantages(batch, adv, cfg)  # as the update weighs them
            batches.append({"step": step, "success": float(rewards.mean()), "skipped_groups": skipped,
                            "tasks": [task_of[g] for g in sorted(task_of)], "chunks": len(batch["rollout"]),
                            "rollout_s": round(rollout_s, 1)})
            print(f"[signal] batch {step}: {len(outcomes)} rollouts, success {float(rewards.mean()):.2f}, "
                  f"{skipped}/{cfg.groups} groups skipped, {rollout_s:.0f} s", flush=True)
            for v in variants:
                t0 = time.perf_counter()
                ids, G = grpo.group_gradients(model, batch, sample_adv, weights, keep, cfg.minibatches,
                                              override(cfg, ratio_transitions=v), norm=learner.norm,
                                              lang=learner.lang, autocast=autocast)
                st = {**grpo.agreement(ids, G), "seconds": round(time.perf_counter() - t0, 1)}
                rows[v].append(st)
                kept[v] += [(step, task_of[g], G[i].cpu()) for i, g in enumerate(ids)]
                print(f"[signal]   ratio_transitions={v}: {st}", flush=True)
    finally:
        env.close()

    table = []
    for v, sts in rows.items():
        sts = [s for s in sts if "grad_signal_sq" in s]
        if not sts:
            continue
        per_batch = [s["grad_signal_sq"] for s in sts]
        signal = sum(per_batch) / len(per_batch)
        # the batches are independent estimates: their spread says how well the signal is known
        se = (sum((x - signal) ** 2 for x in per_batch) / (len(per_batch) - 1) / len(per_batch)) ** 0.5 \
            if len(per_batch) > 1 else float("nan")
        noise = sum(s["grad_noise_group"] for s in sts) / len(sts)
        bound = signal + 2 * se
        # across batches the policy is the same, so a task met in two batches (other placements, other
        # rollouts) tells task-specific direction apart from sampling noise
        same, other = [], []
        for a in range(len(kept[v])):
            for b in range(a + 1, len(kept[v])):
                (sa, ta, ga), (sb, tb, gb) = kept[v][a], kept[v][b]
                if sa != sb:
                    (same if ta == tb else other).append(float(ga @ gb))
        norm_sq = sum(float(g @ g) for *_, g in kept[v]) / len(kept[v])
        table.append({"ratio_transitions": v, "batches": len(sts), "signal_sq": signal, "noise_group": noise,
                      "signal_se": se, "signal_per_batch": per_batch,
                      "groups_for_snr_1": noise / signal if signal > 0 else float("inf"),
                      # at most this much signal (two standard errors above the estimate): at least this many groups
                      "groups_for_snr_1_at_bound": noise / bound if bound > 0 else float("inf"),
                      "cos_halves": [round(s["grad_cos_halves"], 3) for s in sts],
                      "group_norm_sq": norm_sq,
                      "same_task_dot": sum(same) / len(same) if same else None, "same_task_pairs": len(same),
                      "other_task_dot": sum(other) / len(other) if other else None, "other_task_pairs": len(other)})
    print("\nratio_transitions | signal |mu|^2 +- s.e. | one group's noise | groups per step for SNR 1 (estimate; "
          "at estimate + 2 s.e.) | cosine even/odd, per batch")
    for r in table:
        print(f"{r['ratio_transitions']:>17} | {r['signal_sq']:.3e} +- {r['signal_se']:.1e} | {r['noise_group']:.3e} | "
              f"{r['groups_for_snr_1']:.1f}; >= {r['groups_for_snr_1_at_bound']:.1f} | {r['cos_halves']}")
    print("\nratio_transitions | mean |g|^2 of a group | g . g', same task, two batches | g . g', other tasks, two batches")
    for r in table:
        print(f"{r['ratio_transitions']:>17} | {r['group_norm_sq']:.3e} | {r['same_task_dot']} ({r['same_task_pairs']} "
              f"pairs) | {r['other_task_dot']} ({r['other_task_pairs']} pairs)")
    out = {"policy": str(args.policy), "group_size": args.group_size, "groups": args.groups,
           "noisy_transitions": args.noisy_transitions, "batches": batches, "table": table,
           "machine": {"cpu": platform.processor() or platform.machine(), "device": str(device),
                       "torch": torch.__version__, "workers": args.workers}}
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
