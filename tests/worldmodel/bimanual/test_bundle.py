import json

import numpy as np
import pytest

from wmrl.bimanual import contract
from wmrl.bimanual.bundle import Bundle, BundleError, cut_windows, validate
from wmrl.bimanual.tokenizer import UNK, CaptionTokenizer
from wmrl.fileio import sha256_file


def rehash(bundle, rel):
    """Keep the manifest's hash of ``rel`` current, so only the intended defect remains."""
    m = json.loads((bundle / "manifest.json").read_text())
    m["files"][rel] = sha256_file(bundle / rel)
    (bundle / "manifest.json").write_text(json.dumps(m))


def kinds(report):
    return {p["kind"] for p in report["problems"]}


def test_fresh_bundle_passes(bundle_dir):
    r = validate(bundle_dir)
    assert r["passed"], r["problems"]
    assert r["windows"]["train"] > 0 and r["windows"]["val"] > 0
    assert set(r["sources"]) == {"aloha_sim", "libero"}
    w = {k: v["normalized_weight"] for k, v in r["sources"].items()}
    assert w["aloha_sim"] == pytest.approx(2 / 3) and w["libero"] == pytest.approx(1 / 3)  # declared 1.0 : 0.5
    assert r["sources"]["aloha_sim"]["domain_id"] != r["sources"]["libero"]["domain_id"]
    for rel in ("manifest.json", "samples.json", "resources/tokenizer/tokenizer.json"):
        assert (bundle_dir / rel).is_file()


def test_episode_level_split(bundle_dir):
    b = Bundle(bundle_dir)
    for src in ("aloha_sim", "libero"):
        splits = {e["split"] for e in b.episodes.values() if e["source"] == src}
        assert splits == {"train", "val"}  # each source keeps a val share
    for w in b.windows:
        e = b.episodes[w["episode"]]
        assert w["split"] == e["split"]
        assert 0 <= w["start"] and w["start"] + w["transitions"] <= e["transitions"]
    # every transition of every episode is covered by its windows
    for e in b.episodes.values():
        covered = set()
        for w in b.windows:
            if w["episode"] == e["id"]:
                covered |= set(range(w["start"], w["start"] + w["transitions"]))
        assert covered == set(range(e["transitions"]))


def test_cut_windows():
    assert cut_windows(3, 4, 2) == [(0, 3)]
    assert cut_windows(10, 4, 3) == [(0, 4), (3, 4), (6, 4)]
    assert cut_windows(11, 4, 3)[-1] == (7, 4)  # the end is covered


def test_timing_and_statistics_match_contract(bundle_dir):
    b = Bundle(bundle_dir)
    for eid, e in b.episodes.items():
        acts, mask = b.read_actions(eid)
        assert b.read_frames(eid).shape[0] == acts.shape[0] + 1 == e["transitions"] + 1
        assert acts.shape[1] == mask.shape[1] == contract.SEMANTIC_DIM
    m = b.manifest
    assert len(m["statistics"]["offset"]) == len(m["statistics"]["scale"]) == 64
    assert m["action_contract"]["rot6d"].startswith("first two columns")


def test_validate_catches_missing_file(bundle_copy):
    b = Bundle(bundle_copy)
    (bundle_copy / next(iter(b.episodes.values()))["media"]).unlink()
    r = validate(bundle_copy)
    assert not r["passed"] and "files" in kinds(r)


def test_validate_catches_hash_mismatch(bundle_copy):
    b = Bundle(bundle_copy)
    e = next(iter(b.episodes.values()))
    frames = b.read_frames(e["id"])
    frames[0, 0, 0, 0] ^= 0xFF
    np.savez_compressed(bundle_copy / e["media"], frames=frames)
    r = validate(bundle_copy)
    assert not r["passed"] and kinds(r) == {"hashes"}


def test_validate_catches_schema_defect(bundle_copy):
    b = Bundle(bundle_copy)
    e = next(iter(b.episodes.values()))
    np.savez_compressed(bundle_copy / e["media"], frames=b.read_frames(e["id"])[:-1])  # T frames for T transitions
    rehash(bundle_copy, e["media"])
    r = validate(bundle_copy)
    assert not r["passed"] and kinds(r) == {"schema"}
    assert "T+1" in r["problems"][0]["message"]


def test_validate_catches_wrong_statistics(bundle_copy):
    m = json.loads((bundle_copy / "manifest.json").read_text())
    m["statistics"]["scale"][0] *= 3
    (bundle_copy / "manifest.json").write_text(json.dumps(m))
    r = validate(bundle_copy)
    assert not r["passed"] and kinds(r) == {"statistics"}


def test_validate_catches_split_leak(bundle_copy):
    s = json.loads((bundle_copy / "samples.json").read_text())
    ep_split = {e["id"]: e["split"] for e in s["episodes"]}
    w = next(w for w in s["windows"] if ep_split[w["episode"]] == "val")
    w["split"] = "train"  # a window of a val episode leaks into train
    (bundle_copy / "samples.json").write_text(json.dumps(s))
    rehash(bundle_copy, "samples.json")
    r = validate(bundle_copy)
    assert not r["passed"] and kinds(r) == {"splits"}


def test_validate_and_loader_refuse_normalised_actions(bundle_copy):
    b = Bundle(bundle_copy)
    e = next(e for e in b.episodes.values() if e["split"] == "train")
    acts, mask = b.read_actions(e["id"])
    norm = contract.normalize(np.pad(acts, ((0, 0), (0, 5))), b.offset, b.scale)[:, :59]
    np.savez_compressed(bundle_copy / e["actions"], actions=norm.astype(np.float32), mask=mask, space=np.array("normalized"))
    rehash(bundle_copy, e["actions"])
    r = validate(bundle_copy)
    assert not r["passed"] and "statistics" in kinds(r)
    assert any("normalised values where raw actions are expected" in p["message"] for p in r["problems"])
    with pytest.raises(BundleError, match="not raw"):
        Bundle(bundle_copy).read_actions(e["id"])


def test_not_a_bundle_inputs(tmp_path, bundle_dir):
    jsonl = tmp_path / "requests.jsonl"
    jsonl.write_text('{"prompt": "x"}\n')
    with pytest.raises(BundleError, match="inference-only JSONL is not a training bundle"):
        validate(jsonl)
    sidecar = tmp_path / "actions.npz"
    np.savez(sidecar, actions=np.zeros((3, 64)))
    with pytest.raises(BundleError, match="action sidecar"):
        validate(sidecar)
    folder = tmp_path / "infer"
    folder.mkdir()
    (folder / "a.jsonl").write_text("{}\n")
    with pytest.raises(BundleError, match="not a training bundle"):
        Bundle(folder)
    with pytest.raises(BundleError, match="no such bundle"):
        validate(tmp_path / "missing")


def test_tokenizer_from_captions(bundle_dir):
    tok = Bundle(bundle_dir).tokenizer()
    ids, mask = tok.encode("The right arm picks up the red cube")
    assert len(ids) == len(mask) == tok.max_length and sum(mask) == 10
    assert UNK not in ids[: sum(mask)]
    assert tok.decode(ids) == "the right arm picks up the red cube"
    ids, _ = tok.encode("a zebra")
    assert UNK in ids
    assert CaptionTokenizer.load(bundle_dir / "resources" / "tokenizer").vocab == tok.vocab


def test_libero_converter_masks_and_units(bundle_dir):
    b = Bundle(bundle_dir)
    e = next(e for e in b.episodes.values() if e["source"] == "libero")
    acts, mask = b.read_actions(e["id"])
    L = contract.LAYOUT
    assert mask[:, slice(*L["left.eef_pos"][:2])].all() and mask[:, slice(*L["left.eef_rot6d"][:2])].all()
    assert not mask[:, 24:48].any()  # no right arm
    assert not mask[:, slice(*L["left.joint_pos"][:2])].any()
    assert not mask[:, slice(*L["rel_pos"][:2])].any() and not mask[:, L["eef_distance"][0]].any()
    np.testing.assert_allclose(acts[:, L["duration"][0]], 8 / 20)  # one chunk of 8 steps at 20 Hz
    g = acts[:, L["left.gripper_width"][0]]
    assert np.all(np.isclose(g, 0.0) | np.isclose(g, 0.08))
    np.testing.assert_allclose(acts[:, L["left.gripper_delta"][0]], g - 0.06, atol=1e-6)
    assert e["domain_id"] == 1 and e["caption"].startswith("pick up the black bowl")


def test_libero_dense_frames_are_thinned_to_chunks():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
    from tests.helpers import synthetic_trajectory
    from wmrl.bimanual.libero import chunk_frames, convert

    dense = synthetic_trajectory(frames=18, chunk=1, size=32, chunk_size=8)  # a frame every step, 17 steps
    ep = convert(dense, 32)
    np.testing.assert_array_equal(chunk_frames(dense.frame_step, 8), [0, 8, 16, 17])
    assert ep.frames.shape[0] == 4 and ep.actions.shape[0] == 3
    np.testing.assert_allclose(ep.actions[:, contract.LAYOUT["duration"][0]], [8 / 20, 8 / 20, 1 / 20])
    np.testing.assert_array_equal(ep.frames[1], dense.main[8])
