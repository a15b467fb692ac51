"""The figures: real PNGs from real logs and summaries, nothing for an empty log."""

import json

from PIL import Image

from wmrl.plots import loss_curve, success_by_task


def test_loss_curve_from_an_sft_log(tmp_path):
    log = tmp_path / "sft.jsonl"
    records = [{"step": s, "loss": 1.0 / s, "lr": 1e-3} for s in range(1, 60, 10)] + [{"step": 50, "val_loss": 0.05}]
    log.write_text("".join(json.dumps(r) + "\n" for r in records))
    png = loss_curve(log, tmp_path / "loss.png")
    with Image.open(png) as im:
        assert im.format == "PNG" and im.size[0] > 300
    empty = tmp_path / "empty.jsonl"
    empty.write_text(json.dumps({"step": 1, "lr": 1e-3}) + "\n")
    assert loss_curve(empty, tmp_path / "none.png") is None and not (tmp_path / "none.png").exists()


def test_success_by_task_bars(tmp_path):
    summary = {"per_task": {"0": {"successes": 3, "trials": 4, "success_rate": 0.75},
                            "1": {"successes": 0, "trials": 4, "success_rate": 0.0}},
               "successes": 3, "trials": 8, "success_rate": 0.375}
    png = success_by_task(summary, tmp_path / "s.png", title="expert")
    with Image.open(png) as im:
        assert im.format == "PNG"
    assert [p.name for p in tmp_path.iterdir()] == ["s.png"]  # written atomically, no leftovers


def test_ranking_scatter_with_and_without_guidance_scales(tmp_path):
    """One series per guidance scale where several were imagined; the same plot without them."""
    from wmrl.plots import ranking_scatter

    def row(name, real, *imagined):
        r = {"name": name, "real": {"success_rate": real}, "imagined": {"success_rate": imagined[0]}}
        if len(imagined) > 1:
            r["imagined_by_guidance"] = {str(w): {"success_rate": x} for w, x in zip((1.0, 2.0), imagined)}
        return r

    guided = {"policies": [row("a", 0.6, 0.4, 0.15), row("hold", 0.0, 0.0, 0.0), row("random", 0.0, 0.0, 0.01)],
              "spearman": 1.0, "spearman_by_guidance": {"1.0": 1.0, "2.0": 0.87}}
    plain = {"policies": [row("a", 0.6, 0.4), row("b", 0.1, 0.2)], "spearman": 1.0}
    for name, ranking in (("guided", guided), ("plain", plain)):
        with Image.open(ranking_scatter(ranking, tmp_path / f"{name}.png")) as im:
            assert im.format == "PNG"
    assert ranking_scatter({"policies": []}, tmp_path / "none.png") is None


def test_sensitivity_scatter_marks_and_nothing_without_corruptions(tmp_path):
    from wmrl.plots import sensitivity_scatter

    row = lambda how, db, gap: {"corruption": how, "psnr_db": db, "horizons": {"1": {"action_gap": gap}}}  # noqa: E731
    result = {"view": "wrist", "episodes": 2, "rows": [row("none", 100.0, 0.0), row("late:1", 17.8, 0.22)],
              "marks": [{"label": "pair", "psnr_db": 15.7, "action_gap": 0.34}]}
    with Image.open(sensitivity_scatter(result, tmp_path / "s.png")) as im:
        assert im.format == "PNG"
    assert sensitivity_scatter({"rows": [row("none", 100.0, 0.0)]}, tmp_path / "none.png") is None
    proprio = {"view": "proprio", "episodes": 2, "rows": [{"corruption": "late:1", "eef_error_mm": 40.0,
                                                          "horizons": {"1": {"action_gap": 0.2}}}]}
    with Image.open(sensitivity_scatter(proprio, tmp_path / "p.png")) as im:
        assert im.format == "PNG"


def test_roc_curves_of_known_rankings(tmp_path):
    """A perfect ranking's curve climbs to (0, 1) first; a tie of a success and a failure is one
    diagonal step; the area under the points is peak_ranking's AUC. A pair with one outcome is left
    out, and with none left no figure is written."""
    import torch

    from wmrl.plots import roc_curves, roc_points
    from wmrl.worldmodel.fidelity import peak_ranking

    assert roc_points([0.9, 0.8, 0.3, 0.1], [True, True, False, False]) == ([0, 0, 0, 0.5, 1], [0, 0.5, 1, 1, 1])
    scores, truth = [0.9, 0.5, 0.5, 0.2, 0.7], [True, True, False, False, False]
    fpr, tpr = roc_points(scores, truth)
    assert (fpr[2], tpr[2]) == (1 / 3, 0.5) and (fpr[3], tpr[3]) == (2 / 3, 1.0)  # 0.7 alone, then the tie at 0.5
    traces = {"imagined": [[0.0, s] for s in scores], "real": [[0.0, 0.0]] * 5, "outcome": truth}
    assert abs(float(torch.trapz(torch.tensor(tpr), torch.tensor(fpr))) - peak_ranking(traces)["auc"]) < 1e-4
    png = roc_curves([("a pair", scores, [0.9, 0.9, 0.1, 0.1, 0.1], truth), ("one outcome", [0.5], [0.5], [True])],
                     tmp_path / "roc.png", "title")
    with Image.open(png) as im:
        assert im.format == "PNG"
    assert roc_curves([("one outcome", [0.5], [0.5], [True])], tmp_path / "none.png") is None
    assert not (tmp_path / "none.png").exists()
