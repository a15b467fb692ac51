"""``collect.py``: the policy's own episodes, shared between temperatures, each in a folder of its own."""

import subprocess
import sys
from pathlib import Path

import pytest

from wmrl.config import ConfigError, get_profile, override
from wmrl.data.trajectory import count_episodes, iter_episodes
from tests.rl.conftest import sft_run  # noqa: F401  (fixture)

ROOT = Path(__file__).resolve().parents[2]


def _collect(run, out, *flags) -> str:
    r = subprocess.run([sys.executable, "python/collect.py", "--run", str(run), "--profile", "tiny", "--ckpt", "sft/10",
                        "--tasks", "0", "--workers", "1", "--max-steps", "16", "--out", str(out), "--no-progress", *flags],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


def test_episodes_shared_between_temperatures_and_resumed(sft_run, tmp_path):  # noqa: F811
    """Three episodes at temperatures 1 and 3: two at the first (it takes the rest), one at the
    second, each temperature in OUT/T<t>/; a rerun collects nothing again; one temperature
    writes into OUT itself as before."""
    out = tmp_path / "c"
    assert "at temperature 3 in" in _collect(sft_run, out, "--episodes", "3", "--extra-temperatures", "3")
    assert count_episodes(out / "T1" / "task_00.hdf5") == 2 and count_episodes(out / "T3" / "task_00.hdf5") == 1
    seeds = {t: [e.attrs["seed"] for e in iter_episodes(out / t / "task_00.hdf5")] for t in ("T1", "T3")}
    assert seeds["T3"][0] // 1_000_000 == seeds["T1"][0] // 1_000_000 + 1000  # placements of its own
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*.hdf5")}
    _collect(sft_run, out, "--episodes", "3", "--extra-temperatures", "3")
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*.hdf5")} == before  # done already: nothing rewritten
    single = tmp_path / "one"
    _collect(sft_run, single, "--episodes", "1", "--extra-temperatures", "")
    assert [p.relative_to(single).as_posix() for p in single.rglob("*.hdf5")] == ["task_00.hdf5"]
    for folder, flags in ((single, ("--extra-temperatures", "3")), (out, ("--extra-temperatures", "")),
                          (out, ("--extra-temperatures", "5"))):  # one layout per OUT: never mixed
        r = subprocess.run([sys.executable, "python/collect.py", "--run", str(sft_run), "--profile", "tiny", "--ckpt",
                            "sft/10", "--out", str(folder), "--episodes", "3", *flags, "--dry-run"],
                           cwd=ROOT, capture_output=True, text=True)
        assert r.returncode == 2 and "another OUT" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_the_split_and_its_refusals():
    cfg = override(get_profile("default").collect, episodes=5)
    assert cfg.temperatures == (1.0, 3.0) and cfg.episodes_at() == {1.0: 3, 3.0: 2}
    assert cfg.seed_at(1.0) == cfg.seed and cfg.seed_at(3.0) == cfg.seed + 1000
    for bad, match in ((dict(extra_temperatures=(1.0,)), "distinct"), (dict(extra_temperatures=(11.0,)), "distinct"),
                       (dict(sampler="ode"), "flow-SDE"), (dict(episodes=1), "at least 2"),
                       (dict(seed=3500), "smaller --seed")):
        with pytest.raises(ConfigError, match=match):
            override(cfg, **bad)
    assert override(cfg, sampler="ode", extra_temperatures=()).temperatures == (1.0,)


def test_dry_run_shows_each_temperatures_share(sft_run, root):  # noqa: F811
    r = subprocess.run([sys.executable, "python/collect.py", "--run", str(sft_run), "--ckpt", "sft/10", "--episodes", "4",
                        "--dry-run"], cwd=root, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert '"1": "2 episodes per task' in r.stdout and '"3": "2 episodes per task' in r.stdout and "T3" in r.stdout
