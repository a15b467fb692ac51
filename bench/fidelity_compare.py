"""Two or more evaluations of a model pair side by side (``make wm-eval``'s fidelity.json):
agreement with the simulator with its 95% interval, and each view's open-loop PSNR over the
horizon *above the held start frame* (the baseline that does nothing). Written to compare the
same pair after more training, or pairs of different recipes on the same held-out episodes.

    python bench/fidelity_compare.py "2,123 updates=runs/a/fidelity_2k.json" "3,922 updates=runs/a/model_pair/fidelity.json" \\
        --plot bench/figures/wm_updates.png [--strip runs/a/model_pair/videos/episode_00_real_vs_imagined.gif \\
        --strip-out bench/figures/wm_updates_real_vs_imagined.jpg --frames 6]

``--strip``: a few frames of one of wm-eval's real | imagined GIFs stacked into one image, to
look at without a player.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

from wmrl.plots import _pyplot, _save  # noqa: E402


def read(spec: str) -> tuple[str, dict]:
    label, sep, path = spec.partition("=")
    if not sep or not Path(path).is_file():
        sys.exit(f"error: {spec!r}: write LABEL=path/to/fidelity.json (a file that `make wm-eval` wrote)")
    return label, json.loads(Path(path).read_text())


def table(runs: list[tuple[str, dict]]) -> list[str]:
    lines = ["| | agreement (95%) | timing error (chunks) | " + " | ".join(
        f"{v} +dB @{h}" for v in ("main", "wrist") for h in runs[0][1]["horizons"]) + " |"]
    lines.append("|" + "---|" * (3 + 2 * len(runs[0][1]["horizons"])))
    for label, f in runs:
        a = f["agreement"]
        gains = [f"{hz[f'psnr_{v}'] - hz[f'psnr_{v}_static']:+.1f}" for v in ("main", "wrist") for hz in f["horizons"].values()]
        lines.append(f"| {label} | {a['balanced_accuracy']:.2f} ({a['balanced_accuracy_95'][0]:.2f}-"
                     f"{a['balanced_accuracy_95'][1]:.2f}) | {a.get('timing_error_chunks')} | " + " | ".join(gains) + " |")
    return lines


def plot(runs: list[tuple[str, dict]], out: Path) -> Path | None:
    plt = _pyplot()
    if plt is None:
        return None
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for i, view in enumerate(("main", "wrist")):
        ax = axes[i]
        for label, f in runs:
            hs = [int(h) for h in f["horizons"]]
            ax.plot(hs, [f["horizons"][str(h)][f"psnr_{view}"] - f["horizons"][str(h)][f"psnr_{view}_static"] for h in hs],
                    marker="o", label=label)
        ax.axhline(0, color="grey", lw=1, ls="--")
        ax.axhline(3, color="green", lw=1, ls=":", label="target (+3 dB)")
        ax.set(title=f"{view}: PSNR above the held frame", xlabel="chunks open loop", ylabel="dB")
        ax.legend(fontsize=8)
    ax = axes[2]
    for j, (label, f) in enumerate(runs):
        a = f["agreement"]
        lo, hi = a["balanced_accuracy_95"]
        ax.errorbar([j], [a["balanced_accuracy"]], yerr=[[a["balanced_accuracy"] - lo], [hi - a["balanced_accuracy"]]],
                    fmt="o", capsize=4)
    ax.axhline(0.5, color="grey", lw=1, ls="--", label="chance")
    ax.axhline(0.6, color="red", lw=1, ls=":", label="GRPO's floor")
    ax.set(title=f"agreement ({runs[0][1]['agreement']['episodes']} held-out episodes, 95%)",
           xticks=range(len(runs)), xticklabels=[r[0] for r in runs], xlim=(-0.5, len(runs) - 0.5), ylim=(0, 1))
    ax.legend(fontsize=8)
    return _save(fig, plt, out)


def strip(gif: Path, out: Path, frames: int) -> Path:
    import imageio.v3 as iio
    import numpy as np

    video = iio.imread(gif, index=None)  # (T, H, W, C): real | imagined side by side, one frame per chunk
    picks = np.linspace(0, len(video) - 1, frames).round().astype(int)
    out.parent.mkdir(parents=True, exist_ok=True)
    iio.imwrite(out, np.concatenate([video[i][..., :3] for i in picks], axis=0), quality=85)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="LABEL=fidelity.json, in the order to show")
    ap.add_argument("--plot", type=Path)
    ap.add_argument("--strip", type=Path, help="one of wm-eval's videos/*_real_vs_imagined.gif")
    ap.add_argument("--strip-out", type=Path)
    ap.add_argument("--frames", type=int, default=6)
    a = ap.parse_args()
    runs = [read(s) for s in a.runs]
    if len({tuple(f["horizons"]) for _, f in runs}) > 1:
        sys.exit("error: these evaluations measured different horizons; run `make wm-eval` on each with the same settings")
    print("\n".join(table(runs)))
    if a.plot:
        print(f"[fidelity] {plot(runs, a.plot)}")
    if a.strip:
        if a.strip_out is None:
            sys.exit("error: --strip needs --strip-out PATH.jpg")
        print(f"[fidelity] {strip(a.strip, a.strip_out, a.frames)}")


if __name__ == "__main__":
    main()
