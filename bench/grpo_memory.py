"""How much memory one pass of GRPO's update holds per chunk: the recompute of the stored
chains' log-probabilities (both images encoded, all K denoising transitions) and its backward,
for a freshly built policy of a profile, at several numbers of chunks. The growth between two
sizes is the activations' cost per chunk, the figure ``grpo.micro_chunks`` bounds.

    python bench/grpo_memory.py --chunks 32,128                 # CPU: peak resident memory (fp32)
    python bench/grpo_memory.py --chunks 128,512 --device cuda  # GPU: peak allocated, bf16 autocast

On the CPU every size runs in its own process (the resident peak never falls back)."""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))


def one_pass(profile: str, chunks: int, device: str) -> dict:
    import torch
    from wmrl.config import get_profile
    from wmrl.policy.model import FlowPolicy, images_to_input
    from wmrl.policy.sampling import chain_log_prob

    torch.manual_seed(0)
    prof = get_profile(profile)
    cfg = prof.policy
    dev = torch.device(device)
    model = FlowPolicy(cfg).to(dev).train()
    size, k = prof.sim.image_size, cfg.denoise_steps
    main = torch.randint(0, 255, (chunks, size, size, 3), dtype=torch.uint8, device=dev)
    lang, proprio = torch.randn(chunks, cfg.lang_dim, device=dev), torch.randn(chunks, cfg.proprio_dim, device=dev)
    chain = torch.randn(chunks, k + 1, cfg.chunk_size, cfg.action_dim, device=dev)
    if dev.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    t0 = time.perf_counter()
    with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
        prefix = model.encode(images_to_input(main), images_to_input(main.clone()), lang, proprio)
        lp = chain_log_prob(model, prefix, chain, 0.5, elementwise=True)
    lp.float().sum().backward()
    if dev.type == "cuda":
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"chunks": chunks, "peak_mib": round(peak / 2**20, 1), "before_mib": round(base / 2**20, 1),
            "seconds": round(time.perf_counter() - t0, 2), "denoise_steps": k, "image_size": size}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--profile", default="default")
    p.add_argument("--chunks", default="32,128", help="comma-separated numbers of chunks in one pass")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--one", type=int, help=argparse.SUPPRESS)  # a child's single size (CPU)
    args = p.parse_args()
    if args.one:
        print(json.dumps(one_pass(args.profile, args.one, args.device)))
        return
    sizes = [int(c) for c in args.chunks.split(",")]
    if len(sizes) < 2 or sorted(sizes) != sizes or sizes[0] < 1:
        raise SystemExit(f"--chunks {args.chunks}: give two or more increasing sizes, e.g. 32,128")
    rows = []
    for n in sizes:
        if args.device == "cpu":
            out = subprocess.run([sys.executable, __file__, "--profile", args.profile, "--device", "cpu", "--one", str(n)],
                                 capture_output=True, text=True, check=True)
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        else:
            rows.append(one_pass(args.profile, n, "cuda"))
        print("[grpo-memory]", json.dumps(rows[-1]), flush=True)
    per_chunk = (rows[-1]["peak_mib"] - rows[0]["peak_mib"]) / (rows[-1]["chunks"] - rows[0]["chunks"])
    print(json.dumps({"machine": platform.node(), "device": args.device, "profile": args.profile,
                      "mib_per_chunk": round(per_chunk, 2), "rows": rows}))


if __name__ == "__main__":
    main()
