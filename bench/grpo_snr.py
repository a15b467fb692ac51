"""How noisy is GRPO's gradient, depending on which denoising transitions enter the ratio?

    .venv/train/bin/python bench/grpo_snr.py                  # CPU, under a minute
    .venv/train/bin/python bench/grpo_snr.py --json out.json --batches 40 --group 64

A controlled stand-in for the real question (``GRPOConfig.ratio_transitions``). A flow policy of
the tiny profile's shape with the default K = 10 denoising steps, conditioned on a fixed prefix,
is first trained by flow matching on a two-mode distribution of action chunks (half the chunks
push dimension 0 up, half down, plus noise). The task: a chunk succeeds when its mean dimension-0
command passes the median of the policy's own samples (about half succeed, as in a mixed GRPO
group). For ``--batches`` independent batches of ``--group`` flow-SDE samples (noise level 0.5,
temperature 1) the policy-gradient estimate at ratio 1 (what the first PPO step follows) is
computed with log p summed over the first N transitions (N = 1, 2, 3, 5, all K), advantages
normalised in the batch. Reported per N:

* ``cosine``: mean cosine similarity between the estimates of two independent batches; 1 for a
  noise-free direction, near 0 when noise dominates (the SNR proxy that matters for Adam, which
  follows the direction, not the size);
* ``snr_one_batch``: the norm of the mean estimate against the root of the summed
  per-parameter variance of one batch's estimate (signal-to-noise of one batch);
* ``alignment_with_all``: cosine between the mean estimate and the mean estimate of the exact
  chain density (all K): leaving transitions out biases the direction; this says how much;
* ``learning``: success before and after ``--train-steps`` Adam steps of the plain policy
  gradient from the same policy with the same sampling noise, per N: what the trade buys.

``--one``: the same for ``noisy_transitions="one"`` (one stochastic transition per chunk, drawn
uniformly, the others ODE steps; the ratio is that transition's density) as the row ``one``:
its own batches, so its cosine and SNR compare directly; its alignment is with the all-K
estimate of the all-K sampler (a different sampling distribution, so read it loosely); its
success is counted with its own sampler and, for both, with the ODE (``success_ode_*``).

``--label-noise 'TPR,FPR;...'``: the same batches also judged by a reward that finds a success
with probability TPR and calls a failure one with FPR, independent of the actions (what a model
pair's episode agreement means for GRPO); per pair of rates the measured share of the gradient's
squared signal-to-noise against the prediction (TPR - FPR)^2 = (2 x agreement - 1)^2.

The reward here is a smooth function of the final action, the case where every transition's
noise moves the action about as far as its std; LIBERO's success is not smooth, so this is a
direction for the GPU measurement, not a replacement for it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batches", type=int, default=24)
    p.add_argument("--group", type=int, default=64, help="samples per batch (one GRPO step's chunks of a state)")
    p.add_argument("--pretrain", type=int, default=400, help="flow-matching steps on the two-mode target first")
    p.add_argument("--transitions", default="1,2,3,5,0", help="N values (0: all K)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--train-steps", type=int, default=20, help="policy-gradient steps per N afterwards (Adam)")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--one", action="store_true", help="add the one-noisy-transition mode as a row")
    p.add_argument("--label-noise", default="",
                   help="TPR,FPR pairs separated by ';' (e.g. '0.6,0.267;0.85,0.15'): the same batches judged by a "
                        "reward that finds a success with probability TPR and calls a failure one with FPR, "
                        "independent of the actions (a pair's episode agreement); the measured share of the "
                        "gradient's squared signal-to-noise against (TPR - FPR)^2")
    p.add_argument("--json")
    args = p.parse_args()

    import torch

    from wmrl.config import get_profile, override
    from wmrl.policy.model import FlowPolicy
    from wmrl.policy.sampling import chain_log_prob, ode_sample, sde_sample, transition_log_prob

    torch.manual_seed(args.seed)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    cfg = override(get_profile("tiny").policy, denoise_steps=10)
    k, noise_level = cfg.denoise_steps, 0.5
    policy = FlowPolicy(cfg)
    with torch.no_grad():  # one fixed observation: the prefix is a constant of the problem
        prefix = policy.encode(torch.zeros(1, 3, 64, 64), torch.zeros(1, 3, 64, 64), torch.zeros(1, cfg.lang_dim),
                               torch.zeros(1, cfg.proprio_dim))

    # 1. a policy that models a two-mode chunk distribution (flow matching, x_t = t noise + (1 - t) a)
    opt = torch.optim.Adam(policy.parameters(), lr=2e-3)
    for _ in range(args.pretrain):
        a = 0.3 * torch.randn(128, cfg.chunk_size, cfg.action_dim)
        a[:, :, 0] += torch.where(torch.rand(128, 1) < 0.5, -1.0, 1.0)
        noise, t = torch.randn_like(a), torch.rand(128)
        x_t = t[:, None, None] * noise + (1 - t[:, None, None]) * a
        loss = ((policy.velocity(prefix.expand(128, -1, -1), x_t, t) - (noise - a)) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    # the action expert's parameters: the prefix is fixed, so the encoders get no gradient
    params = [q for name, q in policy.named_parameters() if not name.startswith(("main_enc", "wrist_enc", "lang_proj",
                                                                                "proprio_proj", "encoder", "prefix_norm",
                                                                                "type_emb"))]

    with torch.no_grad():  # the success threshold: the median of the policy's own chunks
        s = sde_sample(policy, prefix.expand(1024, -1, -1), k, noise_level)
        threshold = float(s.actions[:, :, 0].mean(1).median())

    def batch():
        """One batch of flow-SDE samples: normalised advantages (B,) and each transition's log p (B, K)."""
        with torch.no_grad():
            s = sde_sample(policy, prefix.expand(args.group, -1, -1), k, noise_level)
            r = (s.actions[:, :, 0].mean(1) > threshold).float()
            adv = (r - r.mean()) / (r.std(unbiased=False) + 1e-6)
        steps = chain_log_prob(policy, prefix.expand(args.group, -1, -1), s.chain, noise_level, elementwise=True)
        return adv, steps.sum(dim=(2, 3))

    def batch_one():
        """A batch with one noisy transition per sample: advantages (B,) and that transition's log p (B,)."""
        noisy = torch.randint(k, (args.group,))
        with torch.no_grad():
            s = sde_sample(policy, prefix.expand(args.group, -1, -1), k, noise_level, noisy=noisy)
            r = (s.actions[:, :, 0].mean(1) > threshold).float()
            adv = (r - r.mean()) / (r.std(unbiased=False) + 1e-6)
        lp = transition_log_prob(policy, prefix.expand(args.group, -1, -1), s.chain, noisy, noise_level)
        return adv, lp.sum(dim=(1, 2))

    def first(per_step, n):  # log p over the first n transitions (0: all K)
        return per_step[:, :n].sum(1) if n else per_step.sum(1)

    ONE = -1  # the row of noisy_transitions="one" (its own batches)

    # 2. the same batches, every N: policy-gradient estimates at ratio 1
    ns = [int(x) for x in args.transitions.split(",")]
    grads: dict[int, list[torch.Tensor]] = {n: [] for n in ns + [ONE]}

    def flat(g):
        return torch.cat([(x if x is not None else torch.zeros_like(q)).flatten() for x, q in zip(g, params)])

    t0 = time.perf_counter()
    for _ in range(args.batches):
        adv, per_step = batch()
        for n in ns:
            lp = first(per_step, n)
            grads[n].append(flat(torch.autograd.grad((adv * lp).mean(), params, retain_graph=True, allow_unused=True)))
        if args.one:
            adv, lp = batch_one()
            grads[ONE].append(flat(torch.autograd.grad((adv * lp).mean(), params, allow_unused=True)))
    seconds = time.perf_counter() - t0

    rows = []
    for n in ns + ([ONE] if args.one else []):
        G = torch.stack(grads[n])  # (batches, params)
        unit = G / G.norm(dim=1, keepdim=True)
        cos = unit @ unit.T
        off = cos[~torch.eye(len(G), dtype=torch.bool)]
        mean, var = G.mean(0), G.var(0, unbiased=True)
        full = torch.stack(grads[ns[-1]]).mean(0) if ns[-1] == 0 else None
        row = {"transitions": "one" if n == ONE else (n or k), "all": n == 0, "cosine": round(float(off.mean()), 4),
               "snr_one_batch": round(float(mean.norm() / var.sum().sqrt()), 4)}
        if full is not None:  # does the partial estimate point where the exact one does, on average?
            row["alignment_with_all"] = round(float(mean @ full / (mean.norm() * full.norm())), 4)
        rows.append(row)
    # 3. what it buys: the same number of plain policy-gradient steps from the same start, per N
    import copy

    start = copy.deepcopy(policy.state_dict())

    def success(model, n=2048, sampler="all"):
        with torch.no_grad():
            pre = prefix.expand(n, -1, -1)
            if sampler == "ode":
                a = ode_sample(model, pre, k)
            else:
                a = sde_sample(model, pre, k, noise_level, noisy=torch.randint(k, (n,)) if sampler == "one" else None).actions
        return float((a[:, :, 0].mean(1) > threshold).float().mean())

    learning = []
    for n in ns + ([ONE] if args.one else []):
        policy.load_state_dict(start)
        torch.manual_seed(args.seed + 1)  # the same sampling noise for every N
        opt = torch.optim.Adam(params, lr=args.lr)
        own = "one" if n == ONE else "all"
        before, before_ode = success(policy, sampler=own), success(policy, sampler="ode")
        for _ in range(args.train_steps):
            if n == ONE:
                adv, lp = batch_one()
            else:
                adv, per_step = batch()
                lp = first(per_step, n)
            opt.zero_grad()
            (-(adv * lp).mean()).backward()
            opt.step()
        learning.append({"transitions": "one" if n == ONE else (n or k), "success_before": round(before, 4),
                         "success_after": round(success(policy, sampler=own), 4),
                         "success_ode_before": round(before_ode, 4),
                         "success_ode_after": round(success(policy, sampler="ode"), 4)})
    if args.label_noise:
        policy.load_state_dict(start)
        torch.manual_seed(args.seed + 2)
        out_noise = label_noise_rows(args, [tuple(float(x) for x in pair.split(",")) for pair in args.label_noise.split(";")],
                                     lambda: sde_sample(policy, prefix.expand(args.group, -1, -1), k, noise_level),
                                     lambda s: (s.actions[:, :, 0].mean(1) > threshold).float(),
                                     lambda s: chain_log_prob(policy, prefix.expand(args.group, -1, -1), s.chain,
                                                              noise_level, elementwise=True).sum(dim=(1, 2, 3)),
                                     flat, params)
    sigmas = [round(float(x), 4) for x in (noise_level * (torch.linspace(1, 0, k + 1)[:-1] /
                                                         (1 - torch.linspace(1, 0, k + 1)[:-1]).clamp(min=1 / k)).sqrt()
                                           * (1 / k) ** 0.5)]
    out = {"policy": {"params_m": round(sum(q.numel() for q in params) / 1e6, 3), "denoise_steps": k,
                      "noise_level": noise_level, "transition_std": sigmas},
           "batches": args.batches, "group": args.group, "threshold": round(threshold, 4), "seconds": round(seconds, 1),
           "rows": rows, "learning": {"steps": args.train_steps, "lr": args.lr, "rows": learning},
           **({"label_noise": out_noise} if args.label_noise else {})}
    print(json.dumps(out, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


def label_noise_rows(args, rates, sample, succeeded, log_prob, flat, params) -> list[dict]:
    """The same batches judged twice: by the simulator's labels and by a reward with the given
    (TPR, FPR) whose errors do not depend on the actions; the gradient's squared signal-to-noise
    under the noisy labels as a share of the clean one's, beside the prediction (TPR - FPR)^2."""
    import torch

    from wmrl.rl.grpo import agreement  # |mu|^2 from g_i . g_j over pairs, one estimate's noise: GRPO's own log

    def signal_and_noise(G) -> tuple[float, float]:
        d = agreement(list(range(len(G))), G)
        return d["grad_signal_sq"], d["grad_noise_group"]

    clean, noisy = [], {r: [] for r in rates}
    for _ in range(args.batches):
        with torch.no_grad():
            s = sample()
            r = succeeded(s)
        lp = log_prob(s)
        norm = lambda x: (x - x.mean()) / (x.std(unbiased=False) + 1e-6)  # noqa: E731
        clean.append(flat(torch.autograd.grad((norm(r) * lp).mean(), params, retain_graph=True, allow_unused=True)))
        u = torch.rand_like(r)
        for tpr, fpr in rates:
            said = torch.where(r > 0, u < tpr, u < fpr).float()
            noisy[(tpr, fpr)].append(flat(torch.autograd.grad((norm(said) * lp).mean(), params, retain_graph=True,
                                                              allow_unused=True)))
    sig_c, noise_c = signal_and_noise(torch.stack(clean))
    rows = [{"labels": "simulator", "signal_sq": sig_c, "noise": noise_c, "snr_sq": sig_c / noise_c}]
    for (tpr, fpr), gs in noisy.items():
        sig, noise = signal_and_noise(torch.stack(gs))
        rows.append({"labels": f"TPR {tpr}, FPR {fpr}", "signal_sq": sig, "noise": noise, "snr_sq": sig / noise,
                     "share_measured": round(sig / noise / (sig_c / noise_c), 3),
                     "share_predicted": round((tpr - fpr) ** 2, 3)})
    return rows


if __name__ == "__main__":
    main()
