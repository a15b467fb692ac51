"""The run's report: ``RUN/report.html`` (self-contained: images and videos inline, no network)
and its Markdown twin ``RUN/report.md`` (figures in ``RUN/report/``, linked).

    python -m wmrl.report --run runs/a        # make cycle rebuilds it after every stage

What it shows, from what the stages wrote: real success per checkpoint (plot, with the binomial
error) and per task; per cycle the stages and their wall times, the lineage, and the world
models' figures (episode agreement with the simulator, reward accuracy on real and imagined
frames, fidelity against holding the start frame); real-vs-imagined videos; the GRPO and SFT
curves. Missing pieces are left out, never invented.
"""

from __future__ import annotations

import argparse
import base64
import html
import json
import time
from pathlib import Path

from wmrl.layout import RunLayout, parse_step_name
from wmrl.release.pair import CLOSED_LOOP_FILE, FIDELITY_FILE

Block = tuple  # ("h2", text) | ("p", text) | ("table", headers, rows) | ("image", path, caption) | ("video", path, caption)


# =========================================================================== what the run holds
def evaluations(run: Path, kept: bool = False) -> list[dict]:
    """Every checkpoint's evaluation (its newest): ref, step, kind, successes, trials, rate, per
    task, sampler; with ``kept`` also those it replaced with other samplers (``kept`` True in theirs)."""
    from wmrl.evaluation.evidence import kept_evaluations

    out = []
    layout = RunLayout(run)
    for kind, folder in (("policy", layout.evidence_dir("policy")), ("sft", layout.evidence_dir("sft"))):
        for f in sorted(folder.glob("global_step_*.json")) if folder.is_dir() else []:
            step = parse_step_name(f.stem)
            for path in [f, *(kept_evaluations(f) if kept else [])]:
                try:
                    d = json.loads(path.read_text())
                    s = d["summary"]
                except (OSError, ValueError, KeyError):
                    continue
                out.append({"ref": f"{'sft/' if kind == 'sft' else ''}{step}", "step": step, "kind": kind,
                            "successes": s["successes"], "trials": s["trials"], "rate": s["success_rate"],
                            "per_task": s.get("per_task", {}), "sampler": d.get("settings", {}).get("sampler"),
                            "temperature": d.get("settings", {}).get("temperature"), "file": path, "kept": path != f})
    return sorted(out, key=lambda e: (e["kind"] != "sft", e["step"], e["kept"]))


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _label(e: dict) -> str:
    from wmrl.evaluation.evidence import sampler_label

    return sampler_label({"sampler": e["sampler"] or "-", "temperature": e["temperature"]})


def _step0_evidence(layout: RunLayout) -> Path:
    """GRPO step 0's evidence: the run's own evaluation, else (a run started with its evaluation
    skipped) that of the supervised checkpoint step 0 copies, where it evaluated the same weights."""
    from wmrl.evaluation.evidence import supervised_origin

    own, origin = layout.evidence(0), supervised_origin(layout.checkpoint(0))
    if own.exists() or origin is None:
        return own
    theirs, sha = origin
    try:
        same = json.loads(theirs.read_text())["settings"]["checkpoint"]["model_sha256"] == sha
    except (OSError, ValueError, KeyError, TypeError):
        return own
    return theirs if same else own


def _against_step0(layout: RunLayout, e: dict) -> str:
    """A GRPO step's change against step 0 over the same fixed states and sampler, state by state
    ("-" where there is no such evaluation of step 0)."""
    from wmrl.evaluation.evidence import evaluation_with, paired_change

    start = evaluation_with(_step0_evidence(layout), _label(e)) if e["kind"] == "policy" and e["step"] > 0 else None
    try:
        c = paired_change(json.loads(start.read_text()), json.loads(e["file"].read_text())) if start else None
    except (OSError, ValueError):
        c = None
    return f"{100 * c['change']:+.1f} +- {100 * c['paired_se']:.1f} ({c['up']} up, {c['down']} down)" if c else "-"


def _short(sha: str | None) -> str:
    return (sha or "-")[:12]


def blocks(run: Path) -> list[Block]:
    from wmrl.evaluation.evidence import change_text
    from wmrl.plots import success_curve

    layout = RunLayout(run)
    cyc = json.loads(layout.cycle_record.read_text()) if layout.cycle_record.exists() else {"cycles": {}}
    out: list[Block] = [("p", f"Run `{run}`, report written {time.strftime('%Y-%m-%d %H:%M:%S %Z')}.")]

    # ---- success in the real simulator
    every = evaluations(run, kept=True)
    evs = [e for e in every if not e["kept"]]  # a checkpoint's newest evaluation: the curve, the per-task table
    out.append(("h2", "Success in the real simulator"))
    if evs:
        grpo = [e for e in evs if e["kind"] == "policy"]
        marks = [c["grpo_from"] for c in cyc["cycles"].values()]
        png = success_curve([(e["step"], e["rate"], e["trials"]) for e in grpo], layout.report_figures / "success.png",
                            marks)
        if png:
            out.append(("image", png, "Real success per GRPO step (fixed initial states; bars: binomial standard "
                                      "error; dashed: a cycle begins)"))
        out.append(("table", ["checkpoint", "successes / trials", "success", "sampler", "against GRPO step 0"],
                    [[e["ref"], f"{e['successes']} / {e['trials']}", _pct(e["rate"]),
                      _label(e) + (" (earlier evaluation)" if e["kept"] else ""), _against_step0(layout, e)]
                     for e in every]))
        first, last = evs[0], evs[-1]
        tasks = sorted(set(first["per_task"]) | set(last["per_task"]), key=int)
        if tasks and first is not last:
            rate = lambda e, t: _pct(e["per_task"][t]["success_rate"]) if t in e["per_task"] else "-"  # noqa: E731
            out.append(("p", f"Per task: {first['ref']} against {last['ref']}."))
            out.append(("table", ["task", first["ref"], last["ref"]], [[t, rate(first, t), rate(last, t)] for t in tasks]))
    else:
        out.append(("p", "No evaluation yet."))

    # ---- the cycles
    for n, c in sorted(cyc["cycles"].items(), key=lambda kv: int(kv[0])):
        out.append(("h2", f"Cycle {n}: policy {c['policy_in']} -> " +
                    ("unchanged (GRPO skipped)" if c.get("grpo_skipped") else f"GRPO step {c['grpo_to']}")))
        if c.get("grpo_skipped"):
            out.append(("p", f"GRPO did not run in this cycle's pair: {c['grpo_skipped']}"))
        rows = [[name, "done" if s.get("done") else "interrupted", s.get("attempts", 0), f"{s.get('seconds', 0):.1f}"]
                for name, s in c["stages"].items()]
        out.append(("table", ["stage", "status", "runs", "wall s"], rows))
        lin = c.get("lineage")
        if lin:
            out.append(("table", ["lineage", "value", "SHA-256"], [
                ["policy that collected", lin["policy_in"], "-"], ["data", lin["data"], _short(lin["data_sha256"])],
                ["manifest", "manifest.json", _short(lin["manifest_sha256"])],
                ["model pair", lin["pair"], _short(lin["pair_sha256"])],
                ["policy trained in the pair", f"GRPO step {lin['policy_out']}" if lin["policy_out_sha256"] else
                 f"none ({lin['policy_out']} went on)", _short(lin["policy_out_sha256"])],
                ["real success before / after", f"{_pct(lin['success_before'])} / {_pct(lin['success_after'])}", "-"],
                *([["the change, state by state", change_text(lin["success_change"]), "-"]]
                  if lin.get("success_change") else [])]))
        cl = RunLayout(c["dir"])
        for pair in (cl.model_pair, cl.student_pair):  # the students' pair where the cycle distilled one (STUDENTS=1)
            if pair.is_dir():
                out += world_models(pair, run)

    # ---- curves
    for path, caption in ((layout.logs / "grpo_curves.png", "GRPO: rollout success, update statistics"),
                          (layout.logs / "sft_loss.png", "Supervised training loss")):
        if path.exists():
            out += [("h2", caption.split(":")[0]), ("image", path, caption)]
            if path.name == "grpo_curves.png":
                out += grpo_steps(layout.logs / "grpo.jsonl")
    return out


def grpo_steps(log: Path, most: int = 40) -> list[Block]:
    """GRPO's log as a table, one row per step (at most ``most``, evenly spaced, the last kept):
    the figures behind the curves, readable where the image is not."""
    if not log.exists():
        return []
    rows = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if "rollout_success" in r]
    if not rows:
        return []
    keep = sorted({round(i * (len(rows) - 1) / (most - 1)) for i in range(most)}) if len(rows) > most else range(len(rows))
    fmt = lambda r, k, f: format(r[k], f) if isinstance(r.get(k), (int, float)) else "-"  # noqa: E731
    out: list[Block] = [
        ("table", ["step", "rollout success", "groups skipped", "approx KL", "lr", "rollout s", "update s", "env steps/s"],
         [[r["step"], _pct(r["rollout_success"]), f"{r.get('skipped_groups', '-')} / {r.get('groups', '-')}",
           fmt(r, "approx_kl_final", ".4f"), fmt(r, "lr", ".2e"), fmt(r, "rollout_s", ".1f"), fmt(r, "update_s", ".1f"),
           fmt(r, "env_steps_per_s", ".0f")] for r in (rows[i] for i in keep)])]
    first = next((r for r in rows if r.get("from_episode_starts")), None)
    if first:  # imagination: the pair's closed-loop check (ImaginedEnv.diagnostics)
        rows_text = closed_loop_rows(first["from_episode_starts"])
        out.append(("p", f"Closed-loop check of the pair at step {first['step']}, rollouts from the first keyframe of "
                         f"recorded episodes, by the policy that recorded them: {rows_text}"))
    return out


def closed_loop_rows(by_policy: dict) -> str:
    """``from_episode_starts`` of a GRPO step in imagination, one clause per recording policy: the
    imagined success of the step's rollouts from those episodes' first keyframes beside their real one."""
    return "; ".join(f"{p}: imagined {d['imagined_success']:.0%} vs real {d['recorded_success']:.0%} "
                     f"({d['rollouts']} rollouts)" for p, d in by_policy.items())


def agreement_text(a: dict) -> str:
    """An episode agreement's balanced accuracy, with its 95% interval where ``wm-eval`` drew one."""
    ci = a.get("balanced_accuracy_95")
    return f"{a['balanced_accuracy']}" + (" (95%: {}-{})".format(*ci) if ci else "")


def ranking_text(r: dict) -> str:
    """``wm-eval``'s ``reward_ranking`` of the imagined episodes: AUC, then the best threshold's score."""
    i = r.get("imagined")
    return f"{i['auc']} ({i['best_balanced_accuracy']} at {i['best_threshold']})" if i else "-"


def world_models(pair: Path, run: Path) -> list[Block]:
    f = pair / FIDELITY_FILE
    if not f.exists():
        return []
    d = json.loads(f.read_text())
    out: list[Block] = [("p", f"World models (`{pair.relative_to(run) if pair.is_relative_to(run) else pair}`), "
                              f"{d.get('episodes', '?')} held-out real episodes replayed from their start:")]
    a, r = d.get("agreement") or {}, d.get("reward") or {}
    ceiling = d.get("agreement_on_real_frames") or {}  # the reward reading the real frames
    out.append(("table", ["figure", "value"], [
        ["episode agreement with the simulator (balanced accuracy; target 0.85)",
         agreement_text(a) if "balanced_accuracy" in a else "-"],
        ["the same reward reading the real frames (its ceiling)", ceiling.get("balanced_accuracy", "-")],
        ["the reward's ranking of the imagined episodes, whatever the threshold (AUC; the best threshold's "
         "balanced accuracy on these episodes, optimistic)", ranking_text(d.get("reward_ranking") or {})],
        ["share of the simulator's GRPO signal per rollout, (2 x agreement - 1)^2", a.get("grpo_signal_share", "-")],
        ["real / imagined successes", f"{a.get('real_successes', '-')} / {a.get('imagined_successes', '-')}"],
        ["timing error (chunks)", a.get("timing_error_chunks", "-")],
        ["reward balanced accuracy, real frames", r.get("balanced_accuracy_real", "-")],
        ["reward balanced accuracy, imagined frames", r.get("balanced_accuracy_imagined", "-")]]))
    reward_meta = pair / "reward" / "config.json"
    if reward_meta.exists():
        from wmrl.worldmodel.reward import no_signal_warning

        warning = no_signal_warning(json.loads(reward_meta.read_text()))
        if warning:
            out.append(("p", f"Warning: {warning}"))
    hz = d.get("horizons") or {}
    if hz:
        out.append(("table", ["chunks ahead", "PSNR main (static)", "PSNR wrist (static)", "SSIM main",
                              "end effector off, mm (static)"],
                    [[h, f"{v['psnr_main']} ({v['psnr_main_static']})", f"{v['psnr_wrist']} ({v['psnr_wrist_static']})",
                      v["ssim_main"], f"{v['eef_error_mm']} ({v['eef_error_mm_static']})" if "eef_error_mm" in v else "-"]
                     for h, v in hz.items()]))
    resp = {v: x for v, x in (d.get("action_response") or {}).items() if x}
    if resp:  # a model that ignores its actions predicts the same frame from any chunk
        out.append(("table", ["one chunk ahead, PSNR on the pixels that move", "real chunk", "another chunk", "held frame",
                              "gain from the actions (dB)"],
                    [[v, x["psnr_moving"]["true"], x["psnr_moving"]["other"], x["psnr_moving"]["held"],
                      x["psnr_moving"]["gain_db"]] for v, x in resp.items()]))
    ctl = d.get("controls") or {}
    if ctl:  # both fail in the simulator: what they reach in the pair is imagination's false-alarm rate
        out.append(("table", ["control (fails in the simulator)", "imagined success", "rollouts"],
                    [[n, _pct(ctl[n]["success_rate"]), ctl[n]["rollouts"]] for n in ("hold", "random") if n in ctl]))
    for v in sorted((pair / "videos").glob("*"))[:2] if (pair / "videos").is_dir() else []:
        out.append(("video", v, f"{v.name}: real | imagined (main), real | imagined (wrist)"))
    rk = pair / "ranking.json"  # make wm-rank: does the pair order policies as the simulator does?
    if rk.exists():
        d = json.loads(rk.read_text())
        out.append(("table", ["policy", "imagined success", "real success"],
                    [[p["name"], _pct(p["imagined"]["success_rate"]), _pct(p["real"]["success_rate"])]
                     for p in d["policies"]] +
                    [["Spearman (target 0.8)", d.get("spearman") if d.get("spearman") is not None else "-", ""],
                     ["cost, seconds (imagined / real)", d["cost"]["imagined_seconds"], d["cost"]["real_seconds"]]]))
        if (pair / "ranking.png").exists():
            out.append(("image", pair / "ranking.png", "policy ranking: imagined against real success"))
    cl = pair / CLOSED_LOOP_FILE  # make wm-calibrate: the reward's threshold with the policy acting in the pair
    if cl.exists():
        d = json.loads(cl.read_text())
        best, old = d.get("at_threshold") or {}, d.get("at_calibrated") or {}
        out.append(("table", ["threshold, closed loop (make wm-calibrate)", "imagined success", "recorded success",
                              "balanced accuracy"],
                    [[f"{d.get('threshold')} (chosen)", _pct(best.get("imagined_success")),
                      _pct(best.get("recorded_success")), best.get("balanced_accuracy", "-")],
                     [f"{d.get('calibrated_threshold')} (replays)", _pct(old.get("imagined_success")),
                      _pct(old.get("recorded_success")), old.get("balanced_accuracy", "-")]] +
                    [[f"task {t['task']} at the chosen one", _pct(t["imagined_success"]), _pct(t["recorded_success"]), ""]
                     for t in d.get("by_task", [])] +
                    # a still arm and random actions never succeed in the simulator: what they reach here is false
                    [[f"control {name} at the chosen one (replays' {_pct(c['at_calibrated'])})", _pct(c["at_threshold"]),
                      "0% (simulator)", ""] for name, c in d.get("controls", {}).items()]))
    return out


# =========================================================================== two renderings
def _data_uri(path: Path) -> str:
    mime = {".png": "image/png", ".gif": "image/gif", ".mp4": "video/mp4"}[path.suffix]
    return f"data:{mime};base64,{base64.b64encode(path.read_bytes()).decode()}"


def to_html(bs: list[Block], title: str) -> str:
    e = html.escape
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{e(title)}</title><style>"
             "body{font-family:sans-serif;max-width:960px;margin:2em auto;color:#222}"
             "table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}"
             "th{background:#f3f3f3}img,video{max-width:100%}figcaption{color:#555;font-size:90%}</style></head><body>",
             f"<h1>{e(title)}</h1>"]
    for b in bs:
        if b[0] == "h2":
            parts.append(f"<h2>{e(b[1])}</h2>")
        elif b[0] == "p":
            parts.append(f"<p>{e(b[1])}</p>")
        elif b[0] == "table":
            head = "".join(f"<th>{e(str(h))}</th>" for h in b[1])
            rows = "".join("<tr>" + "".join(f"<td>{e(str(c))}</td>" for c in r) + "</tr>" for r in b[2])
            parts.append(f"<table><tr>{head}</tr>{rows}</table>")
        elif b[0] == "image" or (b[0] == "video" and b[1].suffix == ".gif"):
            parts.append(f"<figure><img src='{_data_uri(b[1])}' alt='{e(b[2])}'><figcaption>{e(b[2])}</figcaption></figure>")
        elif b[0] == "video":
            parts.append(f"<figure><video controls loop muted src='{_data_uri(b[1])}'></video>"
                         f"<figcaption>{e(b[2])}</figcaption></figure>")
    parts.append("</body></html>")
    return "\n".join(parts)


def to_markdown(bs: list[Block], title: str, root: Path) -> str:
    def rel(p: Path) -> str:
        return str(p.relative_to(root)) if p.is_relative_to(root) else str(p)

    lines = [f"# {title}", ""]
    for b in bs:
        if b[0] == "h2":
            lines += [f"## {b[1]}", ""]
        elif b[0] == "p":
            lines += [b[1], ""]
        elif b[0] == "table":
            lines += ["| " + " | ".join(map(str, b[1])) + " |", "|" + "---|" * len(b[1])]
            lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in b[2]] + [""]
        elif b[0] == "image":
            lines += [f"![{b[2]}]({rel(b[1])})", ""]
        elif b[0] == "video":
            lines += [f"[{b[2]}]({rel(b[1])})", ""]
    return "\n".join(lines)


def write_report(run: str | Path) -> tuple[Path, Path]:
    from wmrl.fileio import atomic_path

    run = Path(run)
    bs = blocks(run)
    title = f"wmrl report: {run.name}"
    paths = []
    layout = RunLayout(run)
    for path, text in ((layout.report_html, to_html(bs, title)), (layout.report_md, to_markdown(bs, title, run))):
        with atomic_path(path) as tmp:
            tmp.write_text(text)
        paths.append(path)
    return paths[0], paths[1]


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", required=True)
    a = p.parse_args()
    if not Path(a.run).is_dir():
        raise SystemExit(f"error: {a.run}: no such run folder")
    h, m = write_report(a.run)
    print(f"[report] {h} and {m}")
