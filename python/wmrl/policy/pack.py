"""A policy checkpoint packed small enough to travel: half-precision weights in one .tar.xz.

A float32 checkpoint of the default policy is 45 MB; the lent GPU machine takes 64 MiB with
each call, of which the simulator's offline bundle needs 39. Packed in float16 and xz it is
19 MiB, so a supervised policy trained once can be carried to later GPU runs instead of being
trained again (demonstrations and SFT are ~400 s of a 30-minute session), and every run
starts from the *same* policy (two SFT runs of one recipe differed by 6 points).

float16 keeps 11 significant bits: inference runs under bf16 autocast (8 bits), so the packed
policy's matrix products are the original's; LayerNorm and the fp32 parts see a relative
change below 5e-4. bfloat16 packs to 15 MiB but rounds what fp16 keeps (choose with ``dtype``).

    pack_checkpoint(ckpt_dir, "policy.tar.xz")             # hash-verified read, atomic write
    unpack_checkpoint("policy.tar.xz", RUN, kind="sft")    # a normal checkpoint in RUN/weights/sft

A policy trained further from an unpacked pack (GRPO trains the action expert only) packs as
a *delta* against that pack: only the tensors whose half-precision values changed, ~13 MiB,
small enough to come back from a GPU call (16 MiB a file) and to continue in a later session:

    pack_checkpoint(grpo_ckpt, "grpo.tar.xz", base="policy.tar.xz")
    unpack_checkpoint("grpo.tar.xz", RUN2, base="policy.tar.xz")

A GRPO *full state* packs with ``state=True`` as a **portable state**: the weights as above
plus the step, RNG states, lineage and the optimizer's settings (the lr its KL rule reached),
without Adam's per-parameter moments (55 MB in float32 for the action expert), and the run's
small history (metrics and rollout logs, the keyframe index, evaluations), so the curves and
the imagined start states go on where they stopped. Unpacked as ``kind="policy"`` it is a full
checkpoint GRPO resumes from on another machine: the same data position and lr, Adam's moments
restarting from zero (the resume says so and records the step in the run's lineage,
``origin["moment_restarts"]``). In run 13 (bench/RESULTS.md) the first steps after such restarts
moved the policy 2-3x as far as uninterrupted ones (KL; Adam's first update is about lr x sign(g),
and the lr had risen too); with ``moments=True`` the moments travel too, rounded to bfloat16 (27 MB, ~20 MB after xz, for the
default policy's action expert; the pack then comes back in parts), and the run goes on as if it
had not stopped, to the moments' rounding:

    pack_checkpoint(grpo_full_state, "grpo4.tar.xz", state=True [, moments=True])
    unpack_checkpoint("grpo4.tar.xz", RUN/grpo/seed0, kind="policy")   # then grpo.py --target 8
"""

from __future__ import annotations

import hashlib
import io
import json
import lzma
import os
import tarfile
import tempfile
from pathlib import Path

from wmrl.fileio import atomic_path
from wmrl.policy.checkpoint import NORM_FILE, CheckpointError, load_checkpoint, save_checkpoint
from wmrl.policy.language import CACHE_FILE, LanguageCache
from wmrl.policy.normalize import NormStats

PACK_FORMAT = "wmrl-policy-pack/1"
WEIGHTS = "weights.safetensors"
META = "pack.json"
STATE = "state.pt"  # a GRPO full state, the optimizer's moments only with moments=True
HISTORY = "history/"  # with it, the GRPO run's small files, by their path in the run
HISTORY_FILES = ("logs/*.jsonl", "grpo/*.json", "grpo/*.jsonl", "evidence/evaluations/*.json",
                 "evidence/evaluations/samplers/*.json")  # a step's evaluations with other samplers
DTYPES = ("float16", "bfloat16")


def pack_checkpoint(ckpt: str | os.PathLike, out: str | os.PathLike, *, dtype: str = "float16",
                    base: str | os.PathLike | None = None, state: bool = False, moments: bool = False) -> dict:
    """Write checkpoint folder ``ckpt`` (weights only; optimizer state is left out) to ``out``
    (.tar.xz); returns the pack's metadata. With ``base`` (a full pack of the same architecture
    and dtype) only the tensors that differ from it are kept. ``state``: ``ckpt`` is a GRPO full
    state and its portable part goes along, ``moments``: with Adam's moments in bfloat16 (the
    module's docstring)."""
    import torch
    from safetensors.torch import load, save

    if dtype not in DTYPES:
        raise CheckpointError(f"dtype {dtype!r}: choose one of {', '.join(DTYPES)}")
    if moments and not state:
        raise CheckpointError("moments travel with a GRPO state: pack with state=True (--state) too")
    based_on = None
    if base is not None:  # checked before the checkpoint is read
        base_meta, base_members = read_pack(base)
        if base_meta.get("base"):
            raise CheckpointError(f"{base} is itself a delta pack; give the full pack it was made against as the base")
        if base_meta["dtype"] != dtype:
            raise CheckpointError(f"{base} holds {base_meta['dtype']} weights; pack with dtype={base_meta['dtype']}")
        based_on = {"pack": Path(base).name, "weights_sha256": base_meta["weights_sha256"]}
    loaded = load_checkpoint(ckpt, need_full=state)  # every file's SHA-256 checked first
    state_bytes = None
    if state:
        buf = io.BytesIO()
        torch.save(portable_state(loaded, ckpt, moments=moments), buf)
        state_bytes = buf.getvalue()
    target = getattr(torch, dtype)
    if dtype == "float16":
        big = max(float(v.abs().max()) for v in loaded.weights.values() if v.is_floating_point())
        if big > 6e4:
            raise CheckpointError(f"{ckpt}: a weight of {big:.3g} overflows float16; pack with dtype=bfloat16")
    tensors = {k: (v.to(target) if v.is_floating_point() else v).contiguous() for k, v in loaded.weights.items()}
    if based_on is not None:
        ref = load(base_members[WEIGHTS])
        if {k: tuple(v.shape) for k, v in ref.items()} != {k: tuple(v.shape) for k, v in tensors.items()}:
            raise CheckpointError(f"{ckpt} and the base {base} are different architectures; pack without a base")
        tensors = {k: v for k, v in tensors.items() if not torch.equal(v, ref[k])}
    weights = save(tensors)
    meta = {"format": PACK_FORMAT, "dtype": dtype, "source": str(Path(ckpt).resolve()),
            "source_model_sha256": loaded.meta["files"]["model.safetensors"],
            "weights_sha256": hashlib.sha256(weights).hexdigest(), "config": loaded.meta, "base": based_on,
            "tensors": len(tensors),
            "state_sha256": hashlib.sha256(state_bytes).hexdigest() if state_bytes is not None else None}
    members = {WEIGHTS: weights, META: json.dumps(meta, indent=1).encode(),
               NORM_FILE: (Path(ckpt) / NORM_FILE).read_bytes(), CACHE_FILE: (Path(ckpt) / CACHE_FILE).read_bytes()}
    if state_bytes is not None:
        members[STATE] = state_bytes
        run = Path(ckpt).resolve().parents[2]  # RUN/weights/policy/global_step_N
        for pattern in HISTORY_FILES:
            for f in sorted(run.glob(pattern)):
                members[HISTORY + f.relative_to(run).as_posix()] = f.read_bytes()
    with atomic_path(out) as tmp:
        with tarfile.open(tmp, "w:xz", preset=6) as tar:
            for name, data in members.items():
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return meta


def portable_state(loaded, ckpt, moments: bool = False) -> dict:
    """A GRPO full state without Adam's per-parameter moments: what resumes on another machine;
    ``moments``: with them, each floating tensor rounded to bfloat16 (the optimizer's
    ``load_state_dict`` casts them back to the parameters' float32)."""
    import torch

    st = loaded.train_state
    if st.get("kind") != "grpo":
        raise CheckpointError(f"{ckpt} holds a {st.get('kind', 'supervised')} training state; only a GRPO full "
                              f"state packs with its state (pack the weights alone without --state)")
    if moments:
        opt = st["optimizer"]
        small = {i: {k: v.to(torch.bfloat16) if torch.is_tensor(v) and v.is_floating_point() and v.dim() else v
                     for k, v in per_param.items()} for i, per_param in opt["state"].items()}
        return {**st, "optimizer": {**opt, "state": small}, "moments_dtype": "bfloat16"}
    return {**{k: v for k, v in st.items() if k != "optimizer"},
            "optimizer_groups": [{k: v for k, v in g.items() if k != "params"} for g in st["optimizer"]["param_groups"]],
            "moments_dropped": True}


def read_pack(path: str | os.PathLike) -> tuple[dict, dict[str, bytes]]:
    """(metadata, members) of a pack, its weights checked against their recorded hash."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such policy pack (make one with bench/policy_pack.py pack)")
    try:
        with tarfile.open(path, "r:xz") as tar:
            members = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}
    except (tarfile.TarError, lzma.LZMAError, EOFError, OSError) as e:
        raise CheckpointError(f"{path}: not a readable policy pack ({e}); copy it again") from None
    missing = [n for n in (WEIGHTS, META, NORM_FILE, CACHE_FILE) if n not in members]
    if missing:
        raise CheckpointError(f"{path}: not a policy pack (missing {', '.join(missing)})")
    meta = json.loads(members[META])
    if meta.get("format") != PACK_FORMAT:
        raise CheckpointError(f"{path}: pack format {meta.get('format')!r}, expected {PACK_FORMAT!r}")
    if hashlib.sha256(members[WEIGHTS]).hexdigest() != meta["weights_sha256"]:
        raise CheckpointError(f"{path}: its weights do not match their recorded SHA-256 (damaged copy); copy it again")
    if meta.get("state_sha256") and hashlib.sha256(members.get(STATE, b"")).hexdigest() != meta["state_sha256"]:
        raise CheckpointError(f"{path}: its GRPO state does not match its recorded SHA-256 (damaged copy); copy it again")
    return meta, members


def unpack_checkpoint(path: str | os.PathLike, run: str | os.PathLike, *, kind: str = "sft",
                      step: int | None = None, base: str | os.PathLike | None = None) -> Path:
    """Write the pack as a weights-only checkpoint RUN/weights/<kind>/global_step_<step>
    (float32 again; ``step``: the packed checkpoint's own by default). A delta pack needs the
    ``base`` pack it was made against. A pack with a portable GRPO state unpacked as
    ``kind="policy"`` is a full checkpoint (GRPO resumes it); as "sft" its weights alone.
    Rerunning it with the same pack does nothing; a different checkpoint already there is refused."""
    import torch
    from safetensors.torch import load

    from wmrl.layout import RunLayout
    from wmrl.policy.checkpoint import policy_config_from
    from wmrl.policy.model import FlowPolicy

    meta, members = read_pack(path)
    base_weights = {}
    if meta.get("base"):
        wanted = meta["base"]
        if base is None:
            raise CheckpointError(f"{path} holds only the weights that differ from the pack {wanted['pack']}; "
                                  f"pass that pack as the base (--base)")
        base_meta, base_members = read_pack(base)
        if base_meta["weights_sha256"] != wanted["weights_sha256"]:
            raise CheckpointError(f"{base} is not the pack {path} was made against ({wanted['pack']}, weights "
                                  f"{wanted['weights_sha256'][:12]}); pass that one as the base")
        base_weights = load(base_members[WEIGHTS])
    src = meta["config"]
    step = int(src.get("step", 0) if step is None else step)
    dest = RunLayout(run).checkpoint(step, kind)
    if dest.exists():
        if load_checkpoint(dest).meta.get("unpacked_from", {}).get("weights_sha256") == meta["weights_sha256"]:
            return dest  # this pack, already unpacked
        raise CheckpointError(f"{dest} exists and is not this pack's checkpoint; unpack into another RUN")
    cfg = policy_config_from(src.get("policy", {}), f"{path}:{META}")
    model = FlowPolicy(cfg)
    weights = {**base_weights, **load(members[WEIGHTS])}
    weights = {k: (v.to(torch.float32) if v.is_floating_point() else v) for k, v in weights.items()}
    model.load_state_dict(weights)
    with tempfile.TemporaryDirectory() as work:  # the two loaders read files
        for name in (NORM_FILE, CACHE_FILE):
            (Path(work) / name).write_bytes(members[name])
        norm = NormStats.load(Path(work) / NORM_FILE, action_dim=cfg.action_dim, proprio_dim=cfg.proprio_dim)
        lang = LanguageCache.load(Path(work) / CACHE_FILE)
    provenance = {"pack": Path(path).name, "dtype": meta["dtype"], "weights_sha256": meta["weights_sha256"],
                  "source": meta["source"], "source_model_sha256": meta["source_model_sha256"],
                  "source_step": src.get("step"), "base": meta.get("base")}
    state = None
    if STATE in members and kind == "policy":
        state = torch.load(io.BytesIO(members[STATE]), map_location="cpu", weights_only=True)
        restore_history(members, RunLayout(run).root)
    return save_checkpoint(dest, model, step=step, image_size=int(src.get("image_size", 0)), norm=norm, lang=lang,
                           train_state=state, extra={"unpacked_from": provenance})


def restore_history(members: dict[str, bytes], run: Path) -> None:
    """The packed run's history files into ``run``, each one only where the run has none yet."""
    for name, data in members.items():
        if not name.startswith(HISTORY):
            continue
        rel = Path(name[len(HISTORY):])
        if rel.is_absolute() or ".." in rel.parts:
            raise CheckpointError(f"pack member {name!r} points outside the run; this pack was not made by pack_checkpoint")
        dest = run / rel
        if not dest.exists():
            dest.parent.mkdir(parents=True, exist_ok=True)
            with atomic_path(dest) as tmp:
                Path(tmp).write_bytes(data)
