"""Real MuJoCo ALOHA episodes (gym-aloha): the scripted planners succeed, perturbed ones fail.

Episodes run in a subprocess (see ``in_subprocess``) and come back as .npz files."""

import json

import numpy as np
import pytest

from wmrl.bimanual import contract

from .conftest import in_subprocess

pytest.importorskip("gym_aloha")

CODE = """
import json, numpy as np
from wmrl.bimanual.aloha import AlohaSim, run_episode
sim = AlohaSim("transfer_cube", 32)
for name, seed, perturb, stride in (("nominal", 0, False, 40), ("perturbed", 1, True, 80)):
    ep = run_episode(sim, seed, perturb=perturb, frame_stride=stride)
    np.savez(OUT + f"/{name}.npz", frames=ep.frames, actions=ep.actions, mask=ep.mask)
    json.dump({"success": ep.success, **ep.meta}, open(OUT + f"/{name}.json", "w"))
"""


@pytest.fixture(scope="module")
def episodes(tmp_path_factory):
    out = tmp_path_factory.mktemp("aloha")
    in_subprocess(f"OUT = {str(out)!r}\n" + CODE)
    eps = {}
    for name in ("nominal", "perturbed"):
        with np.load(out / f"{name}.npz") as z:
            eps[name] = {k: z[k] for k in z.files} | json.loads((out / f"{name}.json").read_text())
    return eps


def test_nominal_transfer_succeeds_and_maps_to_contract(episodes):
    ep = episodes["nominal"]
    assert ep["success"] and ep["max_reward"] == 4
    assert ep["frames"].shape == (11, 32, 32, 3) and ep["frames"].dtype == np.uint8
    assert ep["actions"].shape == (10, 59)
    L = contract.LAYOUT
    acts, mask = ep["actions"], ep["mask"]
    # both arms fully valid except the 7th joint slot of each 6-DoF arm
    assert mask.sum(1).tolist() == [57] * 10
    for arm in ("left", "right"):
        a = L[f"{arm}.joint_pos"][0]
        assert not mask[:, a + 6].any()
        r = contract.rot6d_to_matrix(acts[:, slice(*L[f"{arm}.eef_rot6d"][:2])])
        np.testing.assert_allclose(np.linalg.det(r), 1.0, atol=1e-6)
        w = acts[:, L[f"{arm}.gripper_width"][0]]
        assert 0.03 < w.min() and w.max() < 0.12  # calibrated finger separation in metres
    np.testing.assert_allclose(acts[:, L["duration"][0]], 40 * 0.02)
    # commanded targets are reached: the next transition starts near the previous target
    d = np.linalg.norm(acts[1:, slice(*L["right.eef_delta_pos"][:2])], axis=1)
    assert np.median(d) < 0.05
    assert ep["frames"].std() > 5  # a real rendered scene, not a blank image


def test_perturbed_grasp_fails(episodes):
    ep = episodes["perturbed"]
    assert not ep["success"] and ep["perturbed"]
