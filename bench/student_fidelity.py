"""A distilled world-model student against its teacher over several horizons, on held-out
episodes: one chunk ahead (real context) and on their own frames after N chunks (the figure
imagination lives on), each against the baseline that does nothing (copy the last frame one
chunk ahead, hold the start frame over N chunks). ``make wm-distill`` reports one horizon
(``--rollout-chunks``); this reads any saved student again at several.

    python bench/student_fidelity.py RUN [RUN ...] --view main --chunks 1,3,5,10 [--rollouts 64] [--json out.json]

Each RUN is a run folder after ``wm_distill.py`` (its manifest, the teacher its selection names,
``worldmodels/V_student``). The rollouts start at the first held-out transitions followed by N - 1
more of the same episode; every model draws the same noise (``distill.compare``'s). A wrist
model starts each chunk on the main frame the selection's main model imagines (as Stage 3 and
imagination do).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

from wmrl.fileio import read_json  # noqa: E402
from wmrl.layout import RunLayout, parse_step_name, step_name  # noqa: E402
from wmrl.worldmodel.data import Transitions, load_split  # noqa: E402
from wmrl.worldmodel.distill import compare, rollout_starts  # noqa: E402
from wmrl.worldmodel.fidelity import psnr, ssim  # noqa: E402
from wmrl.worldmodel.model import FrameWorldModel  # noqa: E402


def held_baseline(val, view: str, starts, chunks: int, norm: dict) -> dict:
    """Holding the start frame: PSNR / SSIM of the rollouts' first frame against the real
    frame ``chunks`` chunks later (one chunk: copy-last)."""
    first = val.batch(starts, view, None, norm)
    real = val.batch(starts + chunks - 1, view, None, norm)["target"]
    now = first["frames"][:, -1]
    return {"psnr": round(float(psnr(now, real).mean()), 2), "ssim": round(float(ssim(now, real).mean()), 4)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+")
    p.add_argument("--view", default="main", choices=["main", "wrist"])
    p.add_argument("--chunks", default="1,3,5,10")
    p.add_argument("--rollouts", type=int, default=64, help="held-out starts per horizon")
    p.add_argument("--json")
    a = p.parse_args()
    torch.set_grad_enabled(False)
    horizons = [int(c) for c in a.chunks.split(",")]
    rows, baseline, teacher_rows = [], {}, {}
    for run in a.runs:
        layout = RunLayout(run)
        selection = read_json(layout.selection, SystemExit, "no teacher selection")
        teacher_path = Path(selection[a.view]["weights"])
        main_model = FrameWorldModel.from_pretrained(Path(selection["main"]["weights"])).eval() \
            if a.view == "wrist" else None
        folder = layout.wm_student(a.view)
        saved = sorted(s for s in (parse_step_name(d.name) for d in folder.glob("*")) if s is not None)
        if not saved:
            sys.exit(f"{folder}: no student saved (python python/wm_distill.py --run {run})")
        # the newest: where distillation stopped (a view distilled alone writes no selection)
        student_path = folder / step_name(saved[-1])
        teacher = FrameWorldModel.from_pretrained(teacher_path).eval()
        student = FrameWorldModel.from_pretrained(student_path).eval()
        _, _, val_eps = load_split(layout.manifest, teacher.cfg.chunk_size)
        val = Transitions(val_eps, teacher.cfg.context, "cpu", teacher.cfg.action_history)
        row = {"run": run, "student": str(student_path), "by_chunks": {}}
        for n in horizons:
            r = compare(student, teacher, val, a.view, a.rollouts, torch.device("cpu"), chunks=max(n, 1),
                        main_model=main_model)
            starts = rollout_starts(val, n)[:a.rollouts]
            if n == 1:
                got = {"student_psnr": r["student"]["psnr"], "student_ssim": r["student"]["ssim"],
                       "teacher_psnr": r["teacher"]["psnr"], "teacher_ssim": r["teacher"]["ssim"],
                       "rollouts": r["transitions"]}
                starts = torch.arange(min(a.rollouts, val.size))
                row["speedup"] = r["speedup"]
            else:
                got = dict(r["open_loop"])
            baseline.setdefault(n, held_baseline(val, a.view, starts, n, teacher.proprio_stats))
            teacher_rows.setdefault(n, (got["teacher_psnr"], got["teacher_ssim"]))
            row["by_chunks"][n] = got
            print(f"{run}: {n} chunk(s), {got['rollouts']} starts: student {got['student_psnr']:.2f} dB / "
                  f"{got['student_ssim']:.3f}, teacher {got['teacher_psnr']:.2f} / {got['teacher_ssim']:.3f}, "
                  f"held {baseline[n]['psnr']:.2f} / {baseline[n]['ssim']:.3f}", flush=True)
        rows.append(row)
    print(f"\n| model ({a.view} view) | " + " | ".join(f"{n} chunk{'s' * (n > 1)}: PSNR / SSIM" for n in horizons) + " |")
    print("|---|" + "---|" * len(horizons))
    print("| hold the start frame (1: copy-last) | " + " | ".join(
        f"{baseline[n]['psnr']:.2f} / {baseline[n]['ssim']:.3f}" for n in horizons) + " |")
    print("| teacher | " + " | ".join(f"{teacher_rows[n][0]:.2f} / {teacher_rows[n][1]:.3f}" for n in horizons) + " |")
    for row in rows:
        print(f"| {row['run']} | " + " | ".join(
            f"{row['by_chunks'][n]['student_psnr']:.2f} / {row['by_chunks'][n]['student_ssim']:.3f}" for n in horizons) + " |")
    if a.json:
        Path(a.json).write_text(json.dumps({"view": a.view, "held": baseline, "runs": rows}, indent=2))


if __name__ == "__main__":
    main()
