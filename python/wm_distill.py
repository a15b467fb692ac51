"""Distil each world model into a few-step student (the imagination engine's speed).

    python python/wm_distill.py --run runs/c1                   # both views, the profile's settings
    python python/wm_distill.py --profile tiny --run runs/t --steps 4
    python python/wm_distill.py --run runs/c1 --self-forcing-steps 600  # then Stage 3 (SF-DMD) on its own frames
    make wm-distill RUN=runs/c1 [STEPS=1000]
    make wm-reward RUN=runs/c1 STUDENTS=1; make package RUN=runs/c1 STUDENTS=1 OVERWRITE=1   # their pair

Reads RUN/train/selected_world_models.json (the teachers) and RUN/manifest.json, writes
RUN/worldmodels/{main,wrist}_student/ and RUN/train/selected_students.json
(``wmrl.worldmodel.distill`` says how). Rerun the same command after an interruption: each view
continues from its last save.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from wmrl import cli
from wmrl.config import VIEWS, DistillConfig, get_profile, profile_names


def build(argv: list[str] | None = None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--profile", default="default", choices=profile_names())
    p.add_argument("--run", "--run-dir", dest="run", default="runs/default", help="run folder")
    p.add_argument("--view", choices=VIEWS, help="distil this view only (default: both)")
    cli.add_config_flags(p, DistillConfig, title="distillation")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    from wmrl.worldmodel.distill import DistillJob

    cfg = cli.config_from_flags(args, get_profile(args.profile).distill)
    return args, DistillJob(run=Path(args.run), cfg=cfg, views=(args.view,) if args.view else VIEWS,
                            device=args.device, progress=not args.no_progress)


def main(args, job) -> int:
    from wmrl.layout import RunLayout
    from wmrl.worldmodel.distill import load_teachers
    from wmrl.worldmodel.distill import main as distill

    teachers = load_teachers(job)  # bad input is said before anything loads
    layout = RunLayout(job.run)
    if args.dry_run:
        cli.print_plan("world-model distillation", {
            "teachers": {v: str(t["weights"]) for v, t in teachers.items()}, "manifest": layout.manifest,
            "config": job.cfg, "students": {v: layout.wm_student(v) for v in job.views},
            "selection": layout.student_selection})
        return 0
    result = distill(job)
    for view, r in result["reports"].items():
        print(f"[distill {view}] {r['student']['sample_steps']}-step student vs {r['teacher']['sample_steps']}-step "
              f"teacher on {r['transitions']} held-out transitions: PSNR to the real frame {r['student']['psnr']} vs "
              f"{r['teacher']['psnr']} dB, to the teacher's frame {r['student_vs_teacher_psnr']} dB; "
              f"{r['student']['frames_per_s']} vs {r['teacher']['frames_per_s']} frames/s ({r['speedup']}x)")
        if "open_loop" in r:
            o = r["open_loop"]
            print(f"[distill {view}] on their own frames, {o['chunks']} chunks from {o['rollouts']} held-out starts: "
                  f"PSNR {o['student_psnr']} (student) vs {o['teacher_psnr']} dB (teacher), "
                  f"SSIM {o['student_ssim']} vs {o['teacher_ssim']}")
    if len(result["selection"]) == len(VIEWS):
        print(f"[distill] students: {layout.student_selection} (their pair: make wm-reward RUN={job.run} STUDENTS=1, "
              f"then make package RUN={job.run} STUDENTS=1 OVERWRITE=1)")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    cli.run(lambda: main(*build()))
