#!/usr/bin/env python
"""Bimanual world-model recipe: bundle -> validate -> materialize -> train (Stages 0-3) -> export -> generate.

    python python/bimanual.py bundle --profile tiny --out runs/bimanual/bundle [--data LIBERO.hdf5]
    python python/bimanual.py validate runs/bimanual/bundle
    python python/bimanual.py materialize runs/bimanual/bundle
    python python/bimanual.py train --stage 0 --config data/configs/stage0_bidir.toml --dry-run
    python python/bimanual.py train --stage 0 --config data/configs/stage0_bidir.toml trainer.max_iter=12 checkpoint.save_iter=12
    python python/bimanual.py evaluate --config data/configs/stage1_tf.toml --checkpoint RUN/checkpoints/iter_000008000
    python python/bimanual.py base --config data/configs/stage0_bidir.toml --out runs/bimanual/base
    python python/bimanual.py train --stage 2 --config data/configs/stage2_tfdcm.toml checkpoint.load_path=STAGE1_ROOT
    python python/bimanual.py train --stage 3 --config data/configs/stage3_sfdmd.toml checkpoint.load_path=STAGE2_ROOT checkpoint.reference=STAGE0_ROOT
    python python/bimanual.py export --checkpoint STAGE3_ROOT --config data/configs/stage3_sfdmd.toml --out runs/bimanual/student
    python python/bimanual.py generate --student runs/bimanual/student --context runs/bimanual/bundle:EPISODE_ID --out out.mp4 [--teacher STAGE1_ROOT]

validate and materialize print JSON and exit 1 unless ``passed`` is true; both load no weights.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from wmrl import cli  # noqa: E402
from wmrl.config import ConfigError  # noqa: E402


def _errors() -> tuple[type[BaseException], ...]:
    from wmrl.bimanual.bundle import BundleError
    from wmrl.bimanual.export import ExportError
    from wmrl.bimanual.tokenizer import TokenizerError
    from wmrl.bimanual.train import TrainError
    from wmrl.data.trajectory import TrajectoryError

    return (BundleError, ExportError, TrainError, TokenizerError, TrajectoryError)


def _print(obj) -> None:
    print(json.dumps(obj, indent=2, default=str))


def cmd_bundle(a) -> int:
    from wmrl.config import get_profile

    cfg = get_profile(a.profile).bimanual
    over = {"episodes_per_task": a.episodes, "seed": a.seed, "image_size": a.image_size,
            "tasks": tuple(a.tasks.split(",")) if a.tasks else None, "libero_episodes": a.libero_episodes}
    try:
        cfg = dataclasses.replace(cfg, **{k: v for k, v in over.items() if v is not None})
    except ConfigError:
        raise
    out = a.out or "runs/bimanual/bundle"
    if a.dry_run:
        from wmrl.bimanual.build import plan_episodes

        eps = plan_episodes(cfg)
        _print({"plan": "bimanual bundle", "out": out, "config": dataclasses.asdict(cfg), "aloha_episodes": len(eps),
                "perturbed": sum(p for *_, p in eps), "libero": a.data})
        return 0
    from wmrl.bimanual.build import build_bundle

    path = build_bundle(cfg, out, libero=a.data, overwrite=a.overwrite, progress=not a.no_progress)
    print(f"bundle written: {path} (next: make bimanual-validate DATA={path})")
    return 0


def cmd_validate(a) -> int:
    from wmrl.bimanual.bundle import Bundle, validate
    from wmrl.bimanual.loader import preview_episodes

    report = validate(a.bundle, check_hashes=not a.no_hashes)
    if report["passed"] and not a.no_preview:
        out = Path(a.out or Path("runs/bimanual/checks") / Path(a.bundle).name / "validate")
        report["preview"] = preview_episodes(Bundle(a.bundle), out)
    _print(report)
    return 0 if report["passed"] else 1


def cmd_materialize(a) -> int:
    from wmrl.bimanual.bundle import validate
    from wmrl.bimanual.loader import materialize

    out = None if a.no_preview else Path(a.out or Path("runs/bimanual/checks") / Path(a.bundle).name / "materialize")
    pre = validate(a.bundle, check_hashes=False)  # schema first: materialize reads files it trusts
    if not pre["passed"]:
        _print({**pre, "materialized": False})
        return 1
    report = materialize(a.bundle, batch_size=a.batch_size, patch=a.patch, seed=a.seed, out=out)
    _print(report)
    return 0 if report["passed"] else 1


def _stage_config(a):
    from wmrl.bimanual.config import load_stage_config

    cfg = load_stage_config(a.config, profile=a.profile, overrides=a.overrides)
    if a.stage is not None and a.stage != cfg.job.stage:
        raise ConfigError(f"--stage {a.stage} but {a.config} is a Stage {cfg.job.stage} config; use the stage's TOML")
    return cfg


def cmd_train(a) -> int:
    from wmrl.bimanual.train import resolve, train

    cfg = _stage_config(a)
    plan = resolve(cfg)  # JSON only: bundle, parent and resume state checked before weights load
    if a.dry_run:
        _print({"plan": f"bimanual stage {cfg.job.stage} ({cfg.mode})", **plan})
        return 0
    summary = train(cfg, progress=not a.no_progress)
    if summary.get("rank", 0) == 0:  # one report per run, not one per process
        _print(summary)
    return 0


def _root_config(a, root: str):
    """The stage config for reading an existing root: its parent and reference are not read
    again, so the ones the root recorded fill what the command line leaves out; so does its
    [model] (residual, action tokens, time shift...: the weights mean what they were trained as)."""
    import dataclasses
    import json

    from wmrl.bimanual.config import ModelConfig
    from wmrl.bimanual.train import read_root

    meta = read_root(Path(root))
    given = {o.split("=", 1)[0] for o in a.overrides}
    recorded = (meta.get("config") or {}).get("model") or meta.get("model") or {}
    if recorded:  # a key the root predates has the value it was trained with: the default then
        defaults = {f.name: f.default for f in dataclasses.fields(ModelConfig)}
        model = {k: recorded.get(k, v) for k, v in defaults.items()}
        a.overrides = [*a.overrides, *(f"model.{k}={json.dumps(v)}" for k, v in model.items() if f"model.{k}" not in given)]
    if "checkpoint.load_path" not in given:
        a.overrides = [*a.overrides, f"checkpoint.load_path={meta.get('parent') or root}"]
    if "checkpoint.reference" not in given and meta.get("reference"):
        a.overrides = [*a.overrides, f"checkpoint.reference={meta['reference']}"]
    return _stage_config(a)


def cmd_evaluate(a) -> int:
    from wmrl.bimanual.train import evaluate

    cfg = _root_config(a, a.checkpoint)
    report = evaluate(cfg, a.checkpoint, max_windows=a.max_windows, steps=a.steps, use_ema=not a.net_weights,
                      action_control=not a.no_action_control)
    _print(report)
    if a.out:
        from wmrl.fileio import write_json

        write_json(a.out, report)
    return 0


def cmd_base(a) -> int:
    from wmrl.bimanual.train import write_base

    cfg = _stage_config(a)
    print(f"base checkpoint written: {write_base(cfg, a.out, from_root=a.from_root)}")
    return 0


def cmd_export(a) -> int:
    from wmrl.bimanual.export import check_exportable, export_student

    check_exportable(Path(a.checkpoint))  # before the config: a wrong root is named as such
    report = export_student(_root_config(a, a.checkpoint), a.checkpoint, a.out)
    _print(report)
    print(f"student exported: {report['exported']} (next: python python/bimanual.py generate --student {report['exported']} "
          "--context <bundle>:<episode> --out out.mp4)", file=sys.stderr)
    return 0


def cmd_generate(a) -> int:
    from wmrl.bimanual.export import generate

    teacher_cfg = None
    if a.teacher_steps is not None and (not a.teacher or a.teacher_steps < 1):
        raise ConfigError("--teacher-steps N (>= 1) sets the Euler steps of a --teacher; give --teacher <iteration root>")
    if a.config:
        if not a.teacher:
            raise ConfigError("--config describes the --teacher; give --teacher <iteration root> with it (the student needs none)")
        a.overrides = []
        teacher_cfg = _root_config(a, a.teacher)
    report = generate(a.student, a.context, a.out, teacher=a.teacher, teacher_cfg=teacher_cfg, context_frames=a.context_frames,
                      length=a.frames, seed=a.seed, limit=a.limit, fps=a.fps, device=a.device,
                      teacher_steps=a.teacher_steps)
    _print(report)
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)

    b = sub.add_parser("bundle", help="generate a training bundle from scripted MuJoCo ALOHA (+ LIBERO trajectories)")
    b.add_argument("--profile", default="default", choices=("default", "tiny"))
    b.add_argument("--out", help="bundle folder (default runs/bimanual/bundle)")
    b.add_argument("--data", help="LIBERO trajectories to convert and mix in (a .hdf5 file or a folder)")
    b.add_argument("--episodes", type=int, help="ALOHA episodes per task")
    b.add_argument("--libero-episodes", type=int, help="LIBERO episodes to convert (0: all)")
    b.add_argument("--tasks", help="transfer_cube,insertion")
    b.add_argument("--image-size", type=int)
    b.add_argument("--seed", type=int)
    b.add_argument("--overwrite", action="store_true")
    b.add_argument("--dry-run", action="store_true")
    b.add_argument("--no-progress", action="store_true")
    b.set_defaults(fn=cmd_bundle)

    v = sub.add_parser("validate", help="check files, hashes, schema, statistics and splits (JSON)")
    v.add_argument("bundle")
    v.add_argument("--out", help="where decoded preview samples go")
    v.add_argument("--no-hashes", action="store_true", help="skip sha256 checks (faster)")
    v.add_argument("--no-preview", action="store_true")
    v.set_defaults(fn=cmd_validate)

    m = sub.add_parser("materialize", help="read one packed Stage 0 batch through the real loader (JSON)")
    m.add_argument("bundle")
    m.add_argument("--batch-size", type=int, default=2)
    m.add_argument("--patch", type=int, default=8, help="the model's patch size (token counts)")
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--out", help="where the decoded batch goes")
    m.add_argument("--no-preview", action="store_true")
    m.set_defaults(fn=cmd_materialize)

    for name, fn, hlp in (("train", cmd_train, "train or resume one stage"),
                          ("evaluate", cmd_evaluate, "held-out next-chunk PSNR of an iteration root"),
                          ("base", cmd_base, "write a base checkpoint for Stage 0"),
                          ("export", cmd_export, "write the portable student of a finished Stage 3 run")):
        t = sub.add_parser(name, help=hlp)
        t.add_argument("--config", required=True, help="a stage TOML (data/configs/stage*.toml)")
        t.add_argument("--stage", type=int, help="the stage the TOML must be (a guard)")
        t.add_argument("--profile", default="default", choices=("default", "tiny"))
        t.add_argument("overrides", nargs="*", help="section.key=value, e.g. trainer.max_iter=12 checkpoint.save_iter=12")
        t.set_defaults(fn=fn)
        if name == "train":
            t.add_argument("--dry-run", "--dryrun", action="store_true", help="resolve and print the full config; load no weights")
            t.add_argument("--no-progress", action="store_true")
        if name == "evaluate":
            t.add_argument("--checkpoint", required=True, help="an iteration root")
            t.add_argument("--max-windows", type=int, default=64)
            t.add_argument("--steps", type=int, help="denoising steps per block (default: model.denoise_steps)")
            t.add_argument("--net-weights", action="store_true", help="use net instead of net_ema")
            t.add_argument("--no-action-control", action="store_true",
                           help="skip the second rollout with another window's actions (the action response)")
            t.add_argument("--out", help="also write the report here (JSON)")
        if name == "base":
            t.add_argument("--out", required=True)
            t.add_argument("--from-root", help="take the weights of this iteration root instead of fresh ones")
        if name == "export":
            t.add_argument("--checkpoint", required=True, help="the last iteration root of a finished Stage 3 run")
            t.add_argument("--out", required=True, help="a new folder: the export (written whole or not at all)")

    g = sub.add_parser("generate", help="video from context clips with an exported student (and a teacher to compare)")
    g.add_argument("--student", required=True, help="an export folder (make wm-export)")
    g.add_argument("--context", required=True, nargs="+",
                   help="clips to start from: BUNDLE:EPISODE_ID, a bundle folder (its validation episodes) or a .npz "
                        "(frames (K,H,W,3) uint8, raw actions (T,59), mask (T,59), domain, caption)")
    g.add_argument("--out", required=True, help="an .mp4 for one context, else a folder (one .mp4 + .npz per clip, generate.json)")
    g.add_argument("--teacher", help="an iteration root to compare with (e.g. Stage 1), sampled with its own Euler steps")
    g.add_argument("--teacher-steps", type=int, help="the teacher's Euler steps (default: its config's "
                   "model.denoise_steps; the default profile's 8 are its full sampling steps, the tiny profile's 2)")
    g.add_argument("--config", help="the teacher's stage TOML (default: the config its root recorded)")
    g.add_argument("--profile", default="default", choices=("default", "tiny"), help="profile of --config")
    g.add_argument("--context-frames", type=int, default=1, help="real frames given as context")
    g.add_argument("--frames", type=int, help="transitions to generate (default: the training window's)")
    g.add_argument("--limit", type=int, help="at most this many validation episodes per bundle folder")
    g.add_argument("--seed", type=int, default=0, help="noise seed of every clip (the same clip gives the same frames)")
    g.add_argument("--fps", type=int, default=6)
    g.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    g.set_defaults(fn=cmd_generate, stage=None)
    return p


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    return a.fn(a)


if __name__ == "__main__":
    cli.run(main, _errors)
