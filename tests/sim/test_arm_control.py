import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest

from wmrl.sim.arm_control import ArmControl


def _play(env, actions, *, robosuite_only: bool) -> list[np.ndarray]:
    env.reset(init_index=2)
    if robosuite_only:  # as if ArmControl had declined: robosuite's own _pre_action in every substep
        env._arm, env._arm_controller = None, env.raw.robots[0].controller
    states = []
    for i, a in enumerate(actions):
        env.step(a)
        if (i + 1) % env.cfg.chunk_size == 0:
            states.append(env.raw.sim.get_state().flatten().copy())
    return states


@pytest.mark.parametrize("physics", ["split", "lean"])
def test_arm_control_leaves_the_physics_robosuites_bit_for_bit(env0, sim_cfg, physics):
    actions = np.random.default_rng(3).uniform(-1, 1, (32, 7))
    actions[:, 6] = np.where(np.arange(32) // 8 % 2 == 0, 1.0, -1.0)  # the gripper closes and opens (stateful)
    before = env0.cfg
    try:
        env0.cfg = dataclasses.replace(sim_cfg, physics=physics)
        fast = _play(env0, actions, robosuite_only=False)
        assert isinstance(env0._arm, ArmControl)  # the fast substeps did run
        stock = _play(env0, actions, robosuite_only=True)
    finally:
        env0.cfg = before
    assert any(not np.array_equal(fast[0], s) for s in fast[1:])  # the arm moved: the comparison means something
    for chunk, (a, b) in enumerate(zip(fast, stock)):
        np.testing.assert_array_equal(a, b, err_msg=f"chunk {chunk}")


def test_arm_control_declines_a_setup_it_does_not_reproduce(env0):
    robot = env0.raw.robots[0]
    assert ArmControl.for_env(SimpleNamespace(robots=[robot, robot])) is None  # two arms
    other = SimpleNamespace(controller=SimpleNamespace(name="JOINT_VELOCITY"), gripper=robot.gripper)
    assert ArmControl.for_env(SimpleNamespace(robots=[other])) is None  # another controller
    assert ArmControl.for_env(env0.raw) is not None
