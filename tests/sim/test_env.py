import contextlib
import dataclasses

import mujoco
import numpy as np
import pytest

from wmrl.config import ConfigError, SimConfig
from wmrl.sim.env import NOOP_ACTION, upright
from wmrl.sim.tasks import get_task, init_states


@contextlib.contextmanager
def restored_cfg(env):
    """Lets a test swap the shared env's SimConfig and gives the old one back, whatever happens."""
    before = env.cfg
    try:
        yield
    finally:
        env.cfg = before


def test_tasks_come_from_libero_with_their_goal():
    tasks = [get_task(i) for i in range(10)]
    assert all(t.instruction.startswith("pick up the black bowl") for t in tasks)
    assert all(t.place_on == "plate_1" and "black_bowl" in t.target_object for t in tasks)
    assert init_states(3).shape[0] == 50


def test_unknown_task_index_is_refused():
    with pytest.raises(ConfigError, match="valid indices are 0..9"):
        get_task(10)


def _mean_rows_by_body_prefix(env, camera):
    sim = env.raw.sim
    seg = upright(sim.render(width=64, height=64, camera_name=camera, segmentation=True))
    model = sim.model._model
    rows: dict[str, list[int]] = {}
    for r, c in zip(*np.nonzero(seg[..., 0] == mujoco.mjtObj.mjOBJ_GEOM)):
        body = mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_BODY, model.geom_bodyid[seg[r, c, 1]])
        rows.setdefault(body.split("_")[0], []).append(r)
    return {k: float(np.mean(v)) for k, v in rows.items()}


def test_images_are_upright(env0):
    env0.reset(init_index=0)
    main = _mean_rows_by_body_prefix(env0, "agentview")
    # The front camera sees the robot beyond the table: robot at the top, table below it.
    assert main["robot0"] < 20 and main["table"] > 32, main
    wrist = _mean_rows_by_body_prefix(env0, "robot0_eye_in_hand")
    # The wrist camera looks down past the fingers, which appear at the bottom edge.
    assert wrist["gripper0"] > 48, wrist


def test_main_camera_projection_is_the_live_agentview_and_lands_on_the_gripper(env0):
    """The world model's constant projection (``wmrl.worldmodel.camera``, kept as numbers
    because the world-model side has no LIBERO) is robosuite's agentview matrix, and on the
    upright image the projected end effector sits on the gripper's pixels as the arm moves."""
    import torch
    from robosuite.utils.camera_utils import get_camera_transform_matrix

    from wmrl.worldmodel import camera

    live = get_camera_transform_matrix(env0.raw.sim, "agentview", 64, 64)[:3]
    live[:2] /= 64
    np.testing.assert_allclose(live, np.array(camera.AGENTVIEW_PROJECTION), atol=1e-6)
    env0.reset(init_index=0)
    points = []
    for move in ([0, 0.8, -0.4, 0, 0, 0, -1], [0.6, -0.8, -0.6, 0, 0, 0, -1]):
        sim = env0.raw.sim
        seg = upright(sim.render(width=64, height=64, camera_name="agentview", segmentation=True))
        model = sim.model._model
        gripper = [(r, c) for r, c in zip(*np.nonzero(seg[..., 0] == mujoco.mjtObj.mjOBJ_GEOM))
                   if mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_BODY, model.geom_bodyid[seg[r, c, 1]]).startswith("gripper0")]
        u, v = (camera.project(torch.tensor(env0.proprio()[:3])) * 64).tolist()
        nearest = min(np.hypot(r + 0.5 - v, c + 0.5 - u) for r, c in gripper)
        assert nearest < 5, (u, v, nearest)  # the point lies between the fingertips
        points.append((u, v))
        env0.step_chunk(np.tile(np.array(move, np.float32), (8, 1)))
    assert np.hypot(*np.subtract(points[0], points[1])) > 3  # the arm moved, and the point with it


def test_wrist_camera_pose_follows_the_proprio_and_its_warp_draws_the_motion(env0):
    """``rotation.matrix_to_axis_angle`` writes the live end effector's orientation as the proprio
    does; ``camera.wrist_camera_pose`` (kept as numbers: the world-model side has no LIBERO) is the
    live wrist camera's pose for the proprio, and warping a wrist frame by the camera's motion
    over a chunk (``camera.wrist_warp``) comes closer to the frame after it than holding it."""
    import torch

    from wmrl.worldmodel import camera
    from wmrl.worldmodel.rotation import matrix_to_axis_angle

    sim = env0.raw.sim
    cam = sim.model.camera_name2id("robot0_eye_in_hand")
    fovy = float(sim.model.cam_fovy[cam])
    assert fovy == camera.WRIST_FOVY_DEGREES
    obs = env0.reset(init_index=0)
    frames, proprio = [obs.wrist], [obs.proprio]
    for move in ([0.6, 0.4, -0.3, 0, 0, 0, -1], [-0.5, 0.6, 0.0, 0, 0, 0.3, -1]):
        # the world model writes orientations as the proprio does (robosuite's mat2quat, w >= 0)
        site = env0.raw.robots[0].eef_site_id
        live = torch.tensor(sim.data.site_xmat[site].reshape(3, 3), dtype=torch.float32)
        np.testing.assert_allclose(matrix_to_axis_angle(live).numpy(), env0.proprio()[3:6], atol=1e-4)
        rotation, position = camera.wrist_camera_pose(torch.tensor(env0.proprio())[None])
        np.testing.assert_allclose(rotation[0].numpy(), sim.data.cam_xmat[cam].reshape(3, 3), atol=1e-4)
        np.testing.assert_allclose(position[0].numpy(), sim.data.cam_xpos[cam], atol=1e-4)
        obs, _ = env0.step_chunk(np.tile(np.array(move, np.float32), (8, 1)))
        frames.append(obs.wrist)
        proprio.append(obs.proprio)
    x = torch.tensor(np.stack(frames)).permute(0, 3, 1, 2).float() / 127.5 - 1
    p = torch.tensor(np.stack(proprio))
    warped = camera.wrist_warp(x[:-1], p[:-1], p[1:])
    mse = lambda a, b: float(((a - b) ** 2).mean())  # noqa: E731
    for i in range(2):
        assert mse(warped[i], x[i + 1]) < 0.8 * mse(x[i], x[i + 1]), i


def test_the_world_models_axis_angle_is_robosuites():
    """``rotation.matrix_to_axis_angle`` writes any rotation as the proprio does (robosuite's
    ``mat2quat``, then the env's axis-angle), the half turns where it flips included."""
    import torch
    from robosuite.utils.transform_utils import mat2quat

    from wmrl.sim.env import quat_xyzw_to_axis_angle
    from wmrl.worldmodel.rotation import axis_angle_to_matrix, matrix_to_axis_angle

    g = torch.Generator().manual_seed(0)
    axis = torch.randn(400, 3, generator=g, dtype=torch.float64)
    angle = torch.cat([torch.rand(200, 1, generator=g, dtype=torch.float64) * np.pi,
                       np.pi - 0.05 * torch.rand(200, 1, generator=g, dtype=torch.float64)])  # near the flip
    mats = axis_angle_to_matrix(axis / axis.norm(dim=-1, keepdim=True) * angle)
    theirs = np.stack([quat_xyzw_to_axis_angle(mat2quat(m)) for m in mats.numpy()])
    np.testing.assert_allclose(matrix_to_axis_angle(mats.float()).numpy(), theirs, atol=1e-4)


def test_observation_shapes_and_types(env0, sim_cfg):
    obs = env0.reset(init_index=1)
    assert obs.main.shape == obs.wrist.shape == (64, 64, 3) and obs.main.dtype == np.uint8
    assert obs.proprio.shape == (8,) and obs.proprio.dtype == np.float32
    assert obs.instruction == get_task(0).instruction and obs.step == 0
    assert 0.5 < obs.proprio[2] < 1.5  # end effector above the table (metres)
    assert "akita_black_bowl_1" in obs.privileged and "plate_1" in obs.privileged


def test_chunks_step_and_render_only_at_boundaries(env0, sim_cfg, monkeypatch):
    env0.reset(init_index=0)
    renders = []
    real_render = env0.render
    monkeypatch.setattr(env0, "render", lambda cam: renders.append(cam) or real_render(cam))
    obs, done = env0.step_chunk(np.tile(NOOP_ACTION, (8, 1)))
    assert obs.step == 8 and not done
    assert renders == ["agentview", "robot0_eye_in_hand"]  # once per camera, after the chunk


def test_episode_ends_at_max_steps_even_mid_chunk(env0, sim_cfg):
    with restored_cfg(env0):
        env0.cfg = dataclasses.replace(sim_cfg, max_steps=20)  # the 220-step convention works the same way
        env0.reset(init_index=0)
        steps = []
        done = False
        while not done:
            obs, done = env0.step_chunk(np.tile(NOOP_ACTION, (8, 1)))
            steps.append(obs.step)
        assert steps == [8, 16, 20] and not env0.success
        with pytest.raises(RuntimeError, match="max_steps"):
            env0.step(NOOP_ACTION)


def test_resets_are_deterministic(env0):
    a = env0.reset(init_index=4).state
    b = env0.reset(init_index=4).state
    np.testing.assert_array_equal(a, b)
    s1 = env0.reset(seed=123).privileged["akita_black_bowl_1"]
    s2 = env0.reset(seed=123).privileged["akita_black_bowl_1"]
    s3 = env0.reset(seed=124).privileged["akita_black_bowl_1"]
    np.testing.assert_allclose(s1, s2)
    assert np.abs(s1[:2] - s3[:2]).max() > 1e-3  # another seed, another placement
    with pytest.raises(ValueError, match="exactly one"):
        env0.reset()


def test_random_placements_jitter_the_arm_as_the_fixed_states_do_and_nothing_else(env0, sim_cfg):
    robot = env0.raw.robots[0]
    joints = robot._ref_joint_pos_indexes
    n = len(env0.raw.sim.data.qpos)
    fixed = np.array([s[1:1 + n][joints] for s in env0._init_states]) - robot.init_qpos
    assert 0.01 < fixed.std() < 0.03  # LIBERO's fixed states: the rest pose plus ~0.02 rad per joint

    def start(cfg, **reset):
        env0.cfg = cfg
        obs = env0.reset(**reset)
        return obs, env0.raw.sim.data.qpos[joints] - robot.init_qpos

    bare_cfg = dataclasses.replace(sim_cfg, robot_init_noise=0.0)
    with restored_cfg(env0):
        bare, bare_off = start(bare_cfg, seed=31)
        jit, jit_off = start(sim_cfg, seed=31)
        again, again_off = start(sim_cfg, seed=31)
        other, other_off = start(sim_cfg, seed=32)
        fixed_bare, _ = start(bare_cfg, init_index=5)
        fixed_jit, _ = start(sim_cfg, init_index=5)
    assert sim_cfg.robot_init_noise == 0.02
    assert np.abs(bare_off).max() < 2e-3  # the wrapper's bare reset: the arm at rest (after settling)
    assert 0.005 < jit_off.std() < 0.06 and np.abs(jit_off - again_off).max() == 0  # jittered, by the seed
    assert np.abs(jit_off - other_off).max() > 1e-3
    for name in bare.privileged:  # the seed's placement is the same with or without the arm's noise
        np.testing.assert_allclose(jit.privileged[name][:2], bare.privileged[name][:2], atol=2e-3)
    assert np.abs(jit.proprio[:3] - bare.proprio[:3]).max() > 1e-3  # the gripper starts elsewhere
    np.testing.assert_array_equal(fixed_jit.state, fixed_bare.state)  # a fixed state holds its own joints
    with pytest.raises(ConfigError, match="robot_init_noise"):
        dataclasses.replace(sim_cfg, robot_init_noise=-0.1)


def test_a_placement_that_throws_an_object_is_drawn_again_and_others_stay_as_they_were(env0, sim_cfg):
    """LIBERO's sampler put task 0's bowl into the plate for seed 1,000,008: the contact throws it
    ~0.6 m while the scene settles. The default draws that seed again; a good seed is untouched."""
    unchecked = dataclasses.replace(sim_cfg, max_settle_shift=0.0)
    with restored_cfg(env0):
        env0.cfg = unchecked
        thrown = env0.reset(seed=1_000_008).privileged
        kept_unchecked = env0.reset(seed=1_000_001)
        env0.cfg = sim_cfg
        redrawn = env0.reset(seed=1_000_008).privileged
        redraws = env0.placement_redraws
        again = env0.reset(seed=1_000_008).privileged
        kept = env0.reset(seed=1_000_001)
        kept_redraws = env0.placement_redraws

    def bowl_to_plate(poses):
        return np.linalg.norm(poses["akita_black_bowl_1"][:2] - poses["plate_1"][:2])

    assert bowl_to_plate(thrown) > 0.4  # thrown across the table
    assert redraws >= 1 and bowl_to_plate(redrawn) < 0.25  # beside the plate, as in the fixed states
    assert all(pose[2] > 0.85 for pose in redrawn.values())  # everything on the table
    np.testing.assert_array_equal(redrawn["akita_black_bowl_1"], again["akita_black_bowl_1"])  # still the seed's
    assert kept_redraws == 0
    np.testing.assert_array_equal(kept.state, kept_unchecked.state)  # a placement that settles is the seed's own
    with pytest.raises(ConfigError, match="max_settle_shift"):
        dataclasses.replace(sim_cfg, max_settle_shift=-0.1)


def test_split_physics_step_matches_robosuite_loop(env0, sim_cfg):
    actions = np.random.default_rng(0).uniform(-1, 1, (24, 7))
    finals = {}
    with restored_cfg(env0):
        for physics in ("stock", "split"):
            env0.cfg = dataclasses.replace(sim_cfg, physics=physics)
            env0.reset(init_index=2)
            for a in actions:
                env0.step(a)
            finals[physics] = env0.proprio()
    np.testing.assert_allclose(finals["split"], finals["stock"], atol=1e-4)


def test_a_lean_training_loop_runs_random_placements_only_and_stays_near_split(env0, sim_cfg):
    actions = np.random.default_rng(1).uniform(-1, 1, (24, 7))

    def final(cfg, **reset):
        env0.cfg = cfg
        env0.reset(**reset)
        for a in actions:
            env0.step(a)
        return env0.raw.sim.data.qpos.copy(), env0._loop

    lean = dataclasses.replace(sim_cfg, physics="split", train_physics="lean")
    with restored_cfg(env0):
        split_train, loop = final(sim_cfg, seed=7)
        lean_train, lean_loop = final(lean, seed=7)
        split_eval, _ = final(sim_cfg, init_index=3)
        lean_cfg_eval, eval_loop = final(lean, init_index=3)
    assert (loop, lean_loop, eval_loop) == ("split", "lean", "split")
    np.testing.assert_array_equal(lean_cfg_eval, split_eval)  # a reported evaluation is untouched
    assert 0 < np.abs(lean_train - split_train).max() < 1e-2  # another warm start: close, not equal
    assert "forward" not in vars(env0.raw.sim)  # no shadow left behind
    with pytest.raises(ConfigError, match="train_physics"):
        dataclasses.replace(sim_cfg, train_physics="fast")


def test_non_finite_actions_are_refused(env0):
    env0.reset(init_index=0)
    with pytest.raises(ValueError, match="non-finite"):
        env0.step(np.full(7, np.nan))


def test_bad_config_says_how_to_fix():
    with pytest.raises(ConfigError, match="osmesa"):
        SimConfig(renderer="vulkan")
    with pytest.raises(ConfigError, match="220 convention"):
        SimConfig(max_steps=0)


def test_committed_task_table_matches_the_installed_libero(root):
    import json

    table = json.loads((root / "data" / "libero_spatial_tasks.json").read_text())["tasks"]
    for row in table:
        t = get_task(row["index"])
        assert (t.name, t.instruction, t.target_object, t.place_on) == (
            row["name"], row["instruction"], row["target_object"], row["place_on"])
        assert init_states(row["index"]).shape[0] == row["fixed_initial_states"] == 50


def test_random_placement_puts_a_bowl_on_its_fixture(sim_cfg):
    """Soft resets used to place objects standing on fixtures ~1 m too high (task 7: stove)."""
    from wmrl.sim.env import SpatialEnv

    env = SpatialEnv(7, sim_cfg)
    try:
        for seed in (1, 2):
            poses = env.reset(seed=seed).privileged
            bowl, stove = poses["akita_black_bowl_1"], poses["flat_stove_1"]
            assert bowl[2] < 1.0, bowl  # resting at burner height, not falling from the sky
            assert np.linalg.norm(bowl[:2] - stove[:2]) < 0.25
        # the fixtures' rest poses, read from the XML's attributes, are exactly what MuJoCo compiles
        import mujoco

        compiled = mujoco.MjModel.from_xml_string(env.raw.model.get_xml())
        sim_model = env.raw.sim.model._model
        assert len(env._fixture_rest_poses) == len(env.raw.fixtures_dict) > 0
        body_kind = mujoco.mjtObj.mjOBJ_BODY
        for body, (pos, quat) in env._fixture_rest_poses.items():
            src = mujoco.mj_name2id(compiled, body_kind, mujoco.mj_id2name(sim_model, body_kind, body))
            assert np.array_equal(pos, compiled.body_pos[src]) and np.array_equal(quat, compiled.body_quat[src])
    finally:
        env.close()


def test_recorded_versions_are_the_running_modules_not_stale_metadata(monkeypatch):
    """A wheel installed over another with pip --target can leave the old dist-info behind: the
    label beside every result must name the physics that ran."""
    import importlib.metadata

    from wmrl.sim.env import simulator_versions

    monkeypatch.setattr(importlib.metadata, "version", lambda pkg: "9.9.9-stale")
    got = simulator_versions()
    assert got["mujoco"] == mujoco.__version__ and got["numpy"] == np.__version__
    assert got["robosuite"] == "9.9.9-stale"  # the bundle's local build tag (1.4.0+spatial) lives only there
