"""World-model speed: training samples/s and MFU, imagined steps/s against the real simulator.

    python bench/wm_throughput.py                                # default profile, GPU if present
    python bench/wm_throughput.py --sim-json out/throughput.json # ratio to the real simulator
    python bench/wm_throughput.py --profile tiny --train-steps 3 --batch 4   # CPU smoke run
    python bench/wm_throughput.py --variants eager,channels_last,compile,channels_last+compile \
        --micro-batch 64 --trace runs/wm_trace --skip-imagination      # what each speed option buys
    (compile's own options: +nhwc NHWC inside the graph, +graphs CUDA graphs, +autotune kernel
    autotuning, e.g. compile+nhwc+graphs; ``WMTrainConfig.compile_nhwc`` / ``compile_mode``)

* Training: the main-view model through the same DeepSpeed engine as ``make wm-update``
  (bf16 and ZeRO from data/worldmodel/ds_gpu.json on a GPU), on synthetic inputs of the
  real shapes; samples/s over ``--train-steps`` optimizer updates after warm-up. FLOPs per
  sample are counted by torch's FlopCounterMode on one forward + backward, so MFU = achieved
  FLOP/s / the device's dense bf16 peak (``--peak-tflops``; 790 TFLOP/s is used for the
  H200).
* Imagination: both views (the wrist model conditioned on the imagined main view) for a
  batch of ``--batch`` rollouts, ``sample_steps`` Euler steps each; one chunk = 8 policy
  steps per rollout. Compared with the real simulator's aggregate steps/s (cameras at
  chunk boundaries) from ``bench/sim_throughput.py --json`` on the same machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


def _timed(fn, warmup: int, repeats: int, device) -> float:
    """Wall seconds of ``repeats`` calls of ``fn`` after ``warmup`` untimed ones."""
    for _ in range(warmup):
        fn()
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    _sync(device)
    return time.perf_counter() - t0


def _inputs(cfg, batch: int, device):
    import torch

    s = cfg.image_size
    return {"frames": torch.rand(batch, cfg.input_frames, 3, s, s, device=device) * 2 - 1,
            "target": torch.rand(batch, 3, s, s, device=device) * 2 - 1,
            "actions": torch.rand(batch, cfg.action_chunks * cfg.chunk_size, cfg.action_dim, device=device) * 2 - 1,
            "proprio": torch.randn(batch, cfg.proprio_dim, device=device),
            "next_proprio": torch.randn(batch, cfg.proprio_dim, device=device)}


def flops_per_sample(model, cfg, device) -> float:
    from torch.utils.flop_counter import FlopCounterMode

    b = _inputs(cfg, 2, device)
    with FlopCounterMode(display=False) as fc:
        loss, _ = model.loss(**b)
        loss.backward()
    model.zero_grad(set_to_none=True)
    return fc.get_total_flops() / 2


VARIANTS = ("eager", "channels_last", "compile", "channels_last+compile", "compile+nhwc", "compile+nhwc+graphs",
            "compile+nhwc+autotune", "compile+nhwc+graphs+autotune", "compile+nhwc+cudnn", "compile+nhwc+fast",
            "compile+nhwc+fast+refine2")
# +cudnn: cuDNN's algorithm search (torch.backends.cudnn.benchmark), with any of them;
# +fast: the model's fast kernels (WMTrainConfig.fast_kernels), with any of them;
# +refine2: the refine head on 2 x 2 pixel patches (WorldModelConfig.refine_patch=2; another model,
# the same FLOPs: its fidelity is measured on a pair, not here)
# the options that act through torch.compile: NHWC inside the graph, CUDA graphs, kernel autotuning
COMPILED = {"nhwc", "graphs", "autotune"}


def variant_options(variant: str) -> dict:
    """A ``--variants`` entry -> the ``WMTrainConfig`` speed fields it sets; an unknown one exits
    with the choices (checked for every entry before anything loads)."""
    options = set(variant.split("+")) - {"eager", "refine2"}  # refine2: a model option (bench_training)
    if options - {"channels_last", "compile", "cudnn", "fast"} - COMPILED or (options & COMPILED and "compile" not in options):
        raise SystemExit(f"unknown variant {variant!r}; choose from {', '.join(VARIANTS)}")
    mode = {(False, False): "default", (True, False): "reduce-overhead", (False, True): "max-autotune-no-cudagraphs",
            (True, True): "max-autotune"}["graphs" in options, "autotune" in options]
    return {"channels_last": "channels_last" in options, "compile": "compile" in options,
            "compile_nhwc": "nhwc" in options, "compile_mode": mode, "cudnn_benchmark": "cudnn" in options,
            "fast_kernels": "fast" in options}


def bench_training(prof, args, device, variant: str = "eager") -> dict:
    """Training samples/s (and MFU) of the main-view model with ``variant``'s speed options
    (``WMTrainConfig.channels_last`` / ``compile``: the same model and loss, other kernels)."""
    import deepspeed
    import torch
    from wmrl.config import override
    from wmrl.worldmodel.model import FrameWorldModel
    from wmrl.worldmodel.train import Objective, ds_config, init_distributed, speed_up

    on_gpu = device.type == "cuda"
    cfg = override(prof.main, refine_patch=2) if "refine2" in variant.split("+") else prof.main
    t = override(prof.train, **variant_options(variant), **({"micro_batch": args.micro_batch} if args.micro_batch else {}))
    # a variant compiled earlier in this process must not serve this one: dynamo's cache would hand
    # back its graph (the same code, the same shapes), whatever inductor's layout option says now
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = FrameWorldModel(cfg).to(device)
    # counted on the plain modules (speed_up below sets the variant's kernels): zero channels are not work
    fps = flops_per_sample(model, cfg, device)
    init_distributed(on_gpu)
    engine, *_ = deepspeed.initialize(model=speed_up(Objective(model, 1.0), t), model_parameters=model.parameters(),
                                      config=ds_config(t.ds_config_gpu if on_gpu else t.ds_config_cpu, t, on_gpu, 1))
    mb, acc = engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps()
    batch = _inputs(cfg, mb, device)

    def update():
        for _ in range(acc):
            loss, _ = engine(**batch)
            engine.backward(loss)
            engine.step()

    if on_gpu:  # each variant's own peak (a micro batch's memory decides whether it fits a smaller card)
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    update()  # the first update compiles (when asked): timed apart
    _sync(device)
    first = time.perf_counter() - t0
    wall = _timed(update, args.warmup, args.train_steps, device)
    sps = args.train_steps * acc * mb / wall
    out = {"variant": variant, "micro_batch": mb, "grad_accum": acc, "updates": args.train_steps,
           "wall_s": round(wall, 2), "first_update_s": round(first, 1), "samples_per_s": round(sps, 1),
           "gflops_per_sample": round(fps / 1e9, 2),
           "params_m": round(sum(p.numel() for p in model.parameters()) / 1e6, 2),
           "precision": "bf16" if on_gpu else "fp32"}
    if on_gpu:
        out["peak_memory_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 1)
    if args.peak_tflops:
        out["mfu"] = round(sps * fps / (args.peak_tflops * 1e12), 4)
    if args.trace:
        out["trace"] = profile_updates(update, device, Path(args.trace) / variant)
    return out


def profile_updates(update, device, folder: Path, updates: int = 3) -> dict:
    """torch.profiler over a few updates: the operators that take the time (a table a person
    reads, sorted by device time on a GPU), the convolutions by input shape (which of them a
    kernel that runs once per update belongs to: the trace's shapes without its 100+ MB), and a
    Chrome trace (chrome://tracing, Perfetto)."""
    from torch.autograd.profiler_util import EventList
    from torch.profiler import ProfilerActivity, profile

    folder.mkdir(parents=True, exist_ok=True)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities, record_shapes=True) as prof:
        for _ in range(updates):
            update()
        _sync(device)
    sort = "cuda_time_total" if device.type == "cuda" else "cpu_time_total"
    table = prof.key_averages().table(sort_by=sort, row_limit=30)
    (folder / "top_ops.txt").write_text(table)
    convs = EventList([e for e in prof.key_averages(group_by_input_shape=True)
                       if e.key in ("aten::convolution", "aten::convolution_backward")])
    (folder / "conv_shapes.txt").write_text(convs.table(sort_by=sort, row_limit=60, max_shapes_column_width=120))
    prof.export_chrome_trace(str(folder / "trace.json"))
    return {"top_ops": str(folder / "top_ops.txt"), "conv_shapes": str(folder / "conv_shapes.txt"),
            "chrome_trace": str(folder / "trace.json"), "updates": updates}


def bench_imagination(prof, args, device) -> dict:
    import torch
    from wmrl.worldmodel.model import FrameWorldModel, own_actions

    main, wrist = FrameWorldModel(prof.main).to(device).eval(), FrameWorldModel(prof.wrist).to(device).eval()
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    b = args.batch
    cm, cw = prof.main, prof.wrist
    frames_m = torch.rand(b, cm.context, 3, cm.image_size, cm.image_size, device=device) * 2 - 1
    frames_w = torch.rand(b, cw.context, 3, cw.image_size, cw.image_size, device=device) * 2 - 1
    acts = torch.rand(b, max(cm.action_chunks, cw.action_chunks) * cm.chunk_size, cm.action_dim, device=device) * 2 - 1
    acts_m, acts_w = own_actions(cm, acts), own_actions(cw, acts)
    prop = torch.randn(b, cm.proprio_dim, device=device)

    def chunk():
        with torch.autocast(device.type, dtype=dtype, enabled=device.type == "cuda"):
            m, p = main.generate(frames_m, acts_m, prop)
            x = torch.cat([frames_w, m[:, None]], dim=1) if cw.condition_on_main else frames_w
            w, _ = wrist.generate(x, acts_w, prop)
        return m, w, p

    wall = _timed(chunk, args.warmup, args.chunks, device)
    steps = args.chunks * b * cm.chunk_size
    return {"batch": b, "chunks": args.chunks, "sample_steps": cm.sample_steps, "wall_s": round(wall, 3),
            "imagined_chunks_per_s": round(args.chunks * b / wall, 1), "imagined_steps_per_s": round(steps / wall, 1)}


def bench_closed_loop(prof, args, device, batch: int) -> dict:
    """Imagination with the policy in the loop, as GRPO in the pair runs it: per chunk the
    policy (default-profile size) encodes both imagined views and samples its chunk with the
    flow-SDE (K denoising steps), then both world models imagine the chunk. Random weights: the
    speed depends on the shapes, not on what the models learned."""
    import torch
    from wmrl.config import get_profile
    from wmrl.policy.model import FlowPolicy, images_to_input
    from wmrl.policy.sampling import sde_sample
    from wmrl.worldmodel.imagine import Imagination
    from wmrl.worldmodel.model import FrameWorldModel, unit_to_images

    pcfg = get_profile(args.profile).policy
    torch.manual_seed(0)
    policy = FlowPolicy(pcfg).to(device).eval()
    main, wrist = FrameWorldModel(prof.main).to(device).eval(), FrameWorldModel(prof.wrist).to(device).eval()
    world = Imagination(main, wrist)
    cm, s = prof.main, prof.main.image_size
    lang = torch.randn(batch, pcfg.lang_dim, device=device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    state = {}

    def reset():
        m = torch.rand(batch, cm.context, 3, s, s, device=device) * 2 - 1
        w = torch.rand(batch, prof.wrist.context, 3, s, s, device=device) * 2 - 1
        world.start(m, w, torch.randn(batch, cm.proprio_dim, device=device))
        state.update(main=unit_to_images(m[:, -1]), wrist=unit_to_images(w[:, -1]))

    def chunk():
        with torch.no_grad(), torch.autocast(device.type, dtype=dtype, enabled=device.type == "cuda"):
            prefix = policy.encode(images_to_input(state["main"]), images_to_input(state["wrist"]), lang,
                                   world.proprio[:, : pcfg.proprio_dim])
            actions = sde_sample(policy, prefix, pcfg.denoise_steps, 0.5).actions
            m, w, _ = world.step(actions.float())
        state.update(main=unit_to_images(m.float()), wrist=unit_to_images(w.float()))

    reset()
    wall = _timed(chunk, args.warmup, args.chunks, device)
    steps = args.chunks * batch * cm.chunk_size
    return {"batch": batch, "chunks": args.chunks, "policy_params_m": round(sum(p.numel() for p in policy.parameters())
                                                                           / 1e6, 2),
            "denoise_steps": pcfg.denoise_steps, "wall_s": round(wall, 3),
            "imagined_steps_per_s": round(steps / wall, 1)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--profile", default="default", choices=["default", "tiny"])
    p.add_argument("--train-steps", type=int, default=20, help="timed optimizer updates")
    p.add_argument("--micro-batch", type=int)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--batch", type=int, default=256, help="imagined rollouts at once")
    p.add_argument("--chunks", type=int, default=10, help="timed imagined chunks")
    p.add_argument("--peak-tflops", type=float, default=None, help="dense bf16 peak for MFU (H200: 790)")
    p.add_argument("--sim-json", help="bench/sim_throughput.py --json output from the same machine")
    p.add_argument("--json", help="also write the figures here")
    p.add_argument("--closed-loop", default="", help="batch sizes (e.g. 64,256,1024) of imagination with the policy in "
                                                      "the loop")
    p.add_argument("--skip-training", action="store_true", help="no training figures (no DeepSpeed needed)")
    p.add_argument("--variants", default="eager", help=f"training speed options to compare, comma-separated: "
                                                        f"{', '.join(VARIANTS)}")
    p.add_argument("--skip-imagination", action="store_true")
    p.add_argument("--trace", help="folder: a torch.profiler table and Chrome trace of each variant's updates")
    p.add_argument("--sample-steps", type=int, help="Euler steps per imagined frame (default: the profile's; 1: a "
                   "distilled student's, make wm-distill)")
    args = p.parse_args()
    for variant in args.variants.split(","):
        variant_options(variant)
    import torch
    from wmrl.config import get_profile

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda" and args.peak_tflops is None:
        args.peak_tflops = 790.0
    if device.type == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    prof = get_profile(args.profile).wm
    if args.sample_steps:
        prof = dataclasses.replace(prof, main=dataclasses.replace(prof.main, sample_steps=args.sample_steps),
                                   wrist=dataclasses.replace(prof.wrist, sample_steps=args.sample_steps))
    machine = {"host": platform.node(), "cpu_cores": os.cpu_count(), "torch": torch.__version__,
               "gpu": torch.cuda.get_device_name(0) if device.type == "cuda" else None, "profile": args.profile,
               "image_size": prof.main.image_size}
    result = {"machine": machine}

    def save() -> None:
        # Written after every figure (temp file + rename): a call cut short at the lent machine's
        # limit still brings back the variants that finished.
        if args.json:
            tmp = Path(args.json + ".tmp")
            tmp.write_text(json.dumps(result, indent=2))
            tmp.replace(args.json)

    if not args.skip_training:
        result["training"] = []
        for variant in args.variants.split(","):
            try:
                result["training"].append(bench_training(prof, args, device, variant))
            except torch.cuda.OutOfMemoryError as e:  # a micro batch too large for this card: said, and on
                result["training"].append({"variant": variant, "micro_batch": args.micro_batch,
                                           "error": f"out of GPU memory: {str(e).splitlines()[0]}"})
                torch.cuda.empty_cache()
            print("[wm-speed]", json.dumps(result["training"][-1]), flush=True)
            save()
    if not args.skip_imagination:
        result["imagination"] = bench_imagination(prof, args, device)
    if args.closed_loop:
        result["closed_loop"] = [bench_closed_loop(prof, args, device, int(b)) for b in args.closed_loop.split(",")]
    if args.sim_json and "imagination" in result:
        rows = json.loads(Path(args.sim_json).read_text())["rows"]
        real = [r["aggregate_steps_per_s"] for r in rows if r["mode"] == "cameras@chunk" and r["size"] == prof.main.image_size]
        if real:
            result["real_sim_steps_per_s"] = real[0]
            result["imagined_over_real"] = round(result["imagination"]["imagined_steps_per_s"] / real[0], 2)
    print(json.dumps(result, indent=1))
    save()


if __name__ == "__main__":
    main()
