import subprocess
import sys

import h5py
import numpy as np
import pytest

from tests.helpers import synthetic_trajectory
from wmrl.data.trajectory import TrajectoryWriter
from wmrl.data.validate import validate_file


@pytest.fixture
def good_file(tmp_path):
    path = tmp_path / "good.hdf5"
    w = TrajectoryWriter(path)
    for i in range(2):
        w.append(synthetic_trajectory(frames=4, seed=i))
    w.finalize()
    return path


def test_a_good_file_passes(good_file):
    r = validate_file(good_file)
    assert r.ok, r.problems
    assert r.episodes == 2 and r.frames == 8 and r.steps == 48


def _edit(path, fn):
    with h5py.File(path, "a") as f:
        fn(f["data/demo_1"])


def test_truncated_file_is_caught(good_file):
    data = good_file.read_bytes()
    good_file.write_bytes(data[: len(data) // 2])
    r = validate_file(good_file)
    assert not r.ok
    assert "truncated" in r.problems[0] or "unreadable" in r.problems[0]


def test_wrong_image_shape_is_caught(good_file):
    def fn(g):
        del g["obs/agentview_rgb"]
        g["obs"].create_dataset("agentview_rgb", data=np.zeros((4, 16, 12, 3), np.uint8))
    _edit(good_file, fn)
    r = validate_file(good_file)
    assert any("demo_1" in p and "agentview_rgb" in p for p in r.problems), r.problems


def test_wrong_dtype_is_caught(good_file):
    def fn(g):
        a = g["actions"][()]
        del g["actions"]
        g.create_dataset("actions", data=a.astype(np.float64))
    _edit(good_file, fn)
    assert any("actions must be float32" in p for p in validate_file(good_file).problems)


def test_missing_key_is_caught(good_file):
    _edit(good_file, lambda g: g.__delitem__("states"))
    assert any("missing dataset(s) states" in p for p in validate_file(good_file).problems)


def test_missing_attribute_is_caught(good_file):
    _edit(good_file, lambda g: g.attrs.__delitem__("policy_id"))
    assert any("missing attribute 'policy_id'" in p for p in validate_file(good_file).problems)


def test_nan_actions_are_caught(good_file):
    def fn(g):
        a = g["actions"][()]
        a[3, 2] = np.nan
        g["actions"][...] = a
    _edit(good_file, fn)
    assert any("actions holds NaN" in p for p in validate_file(good_file).problems)


def test_inconsistent_frame_counts_are_caught(good_file):
    def fn(g):
        p = g["obs/proprio"][()]
        del g["obs/proprio"]
        g["obs"].create_dataset("proprio", data=p[:-1])
    _edit(good_file, fn)
    assert any("obs/proprio has 3 frames" in p for p in validate_file(good_file).problems)


def test_action_count_must_match_the_last_frame(good_file):
    def fn(g):
        a = g["actions"][()]
        del g["actions"]
        g.create_dataset("actions", data=a[:-1])
    _edit(good_file, fn)
    assert any("actions has 23 steps" in p for p in validate_file(good_file).problems)


def test_cli_exit_code_and_report(good_file, tmp_path, root):
    script = root / "python" / "validate_data.py"
    ok = subprocess.run([sys.executable, script, str(good_file)], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert "ok - 2 episodes" in ok.stdout
    _edit(good_file, lambda g: g.__delitem__("rewards"))
    bad = subprocess.run([sys.executable, script, str(tmp_path)], capture_output=True, text=True)
    assert bad.returncode == 1
    assert "missing dataset(s) rewards" in bad.stdout
    missing = subprocess.run([sys.executable, script, str(tmp_path / "nope.hdf5")], capture_output=True, text=True)
    assert missing.returncode == 2 and missing.stderr.startswith("error: ") and "no such file" in missing.stderr


def test_one_flipped_bit_in_the_actions_is_caught_by_the_checksum(good_file):
    with h5py.File(good_file, "r") as f:
        ds = f["data/demo_0/actions"]
        assert ds.fletcher32 and f.attrs["checksums"] == "fletcher32"
        offset = ds.id.get_chunk_info(0).byte_offset
    with open(good_file, "r+b") as fh:
        fh.seek(offset + 5)
        byte = fh.read(1)[0]
        fh.seek(offset + 5)
        fh.write(bytes([byte ^ 0x10]))
    r = validate_file(good_file)
    assert not r.ok
    assert any("demo_0: damaged data: a checksum" in p for p in r.problems)


def test_a_dataset_without_its_promised_checksum_is_caught(good_file):
    with h5py.File(good_file, "r+") as f:
        g = f["data/demo_0"]
        data = g["rewards"][()]
        del g["rewards"]
        g.create_dataset("rewards", data=data)  # rewritten without fletcher32
    r = validate_file(good_file)
    assert any("rewards carry no checksum" in p for p in r.problems)
