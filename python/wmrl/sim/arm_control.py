"""robosuite's arm control for the substeps inside one control step, without its wrappers.

A LIBERO control step is 25 physics substeps (500 Hz under a 20 Hz policy), and robosuite runs
its operational-space controller before every one of them. Most of that controller's time is
Python around the arithmetic: names looked up on every call, the site Jacobian computed four
times, an action-dimension property rebuilt three times, the torque and gripper limits read
again from the model. ``ArmControl.substep`` does what robosuite's ``_pre_action(action,
policy_step=False)`` does for LIBERO's one Panda arm with the ``OSC_POSE`` controller and
the Panda gripper, with those lookups made once and the same floating-point operations in the
same order: the physics stays robosuite's bit for bit (``tests/sim/test_arm_control.py`` steps
both side by side and compares the whole MuJoCo state; ``bench/arm_control.py`` measures the
speed). The first substep of a control step, which sets the controller's goal and fills
robosuite's observation buffers, still goes through robosuite itself.

``ArmControl.for_env`` returns None for any other setup (another controller, an interpolator,
several arms), and the caller keeps robosuite's own loop.
"""

from __future__ import annotations

import numpy as np


class ArmControl:
    def __init__(self, raw):
        # imported here, as everywhere in wmrl.sim: MuJoCo reads its rendering backend (MUJOCO_GL) at
        # import, which configure_renderer sets first; kept on the instance for the substeps
        import mujoco
        from robosuite.utils.control_utils import nullspace_torques, opspace_matrices, orientation_error

        self._mujoco = mujoco
        self._opspace, self._nullspace, self._ori_error = opspace_matrices, nullspace_torques, orientation_error
        self.robot = robot = raw.robots[0]
        self.ctrl = ctrl = robot.controller
        model = raw.sim.model
        self._m, self._d = model._model, raw.sim.data._data
        self._sim = raw.sim  # forward() is looked up at each call: a "lean" step shadows it on the instance
        self._site = model.site_name2id(ctrl.eef_name)
        self._nv = model.nv
        self._qpos_index, self._qvel_index = ctrl.qpos_index, ctrl.qvel_index
        self._control_dim = ctrl.control_dim
        # the model's limits, as robosuite reads them on every substep (Robot.torque_limits, grip_action)
        self._torque_low, self._torque_high = robot.torque_limits
        self._joint_actuators = robot._ref_joint_actuator_indexes
        self._gripper_actuators = [model.actuator_name2id(a) for a in robot.gripper.actuators]
        ctrl_range = model.actuator_ctrlrange[self._gripper_actuators]
        self._gripper_bias = 0.5 * (ctrl_range[:, 1] + ctrl_range[:, 0])
        self._gripper_weight = 0.5 * (ctrl_range[:, 1] - ctrl_range[:, 0])

    @classmethod
    def for_env(cls, raw) -> "ArmControl | None":
        """The fast path for ``raw`` (a robosuite env), or None where its setup is not LIBERO's."""
        from robosuite.controllers.osc import OperationalSpaceController
        from robosuite.models.grippers.panda_gripper import PandaGripper

        if len(raw.robots) != 1:
            return None
        robot = raw.robots[0]
        ctrl = getattr(robot, "controller", None)
        if (type(ctrl) is not OperationalSpaceController or ctrl.name != "OSC_POSE"
                or ctrl.interpolator_pos is not None or ctrl.interpolator_ori is not None
                or type(getattr(robot, "gripper", None)) is not PandaGripper):
            return None
        return cls(raw)

    def _update(self) -> None:
        """``Controller.update``: the arm's state from the simulator."""
        c, d, qvel_index = self.ctrl, self._d, self._qvel_index
        self._sim.forward()
        c.ee_pos = np.array(d.site_xpos[self._site])
        c.ee_ori_mat = np.array(d.site_xmat[self._site].reshape([3, 3]))
        # one mj_jacSite for both halves: robosuite makes four calls for the same two matrices
        jacp, jacr = np.zeros((3, self._nv)), np.zeros((3, self._nv))
        self._mujoco.mj_jacSite(self._m, d, jacp, jacr, self._site)
        c.ee_pos_vel = np.dot(jacp, d.qvel)
        c.ee_ori_vel = np.dot(jacr, d.qvel)
        # Indexed exactly as robosuite indexes: a fancy index returns these in Fortran order, and
        # numba's kernels below (and the BLAS calls in them) are chosen by memory layout; the
        # same values in C order round differently (seen: 1e-6 in the state within 120 steps).
        c.joint_pos = np.array(d.qpos[self._qpos_index])
        c.joint_vel = np.array(d.qvel[qvel_index])
        c.J_pos = jacp[:, qvel_index]
        c.J_ori = jacr[:, qvel_index]
        c.J_full = np.concatenate((c.J_pos, c.J_ori))  # np.vstack's own operation on 2-D arrays
        mass_matrix = np.ndarray(shape=(self._nv, self._nv), dtype=np.float64, order="C")
        self._mujoco.mj_fullM(self._m, mass_matrix, d.qM)
        c.mass_matrix = mass_matrix[qvel_index, :][:, qvel_index]
        c.new_update = False

    def _torques(self) -> np.ndarray:
        """``OperationalSpaceController.run_controller`` without interpolators."""
        c = self.ctrl
        self._update()
        ori_error = self._ori_error(c.goal_ori, c.ee_ori_mat)
        desired_force = np.multiply(c.goal_pos - c.ee_pos, c.kp[0:3]) + np.multiply(-c.ee_pos_vel, c.kd[0:3])
        desired_torque = np.multiply(ori_error, c.kp[3:6]) + np.multiply(-c.ee_ori_vel, c.kd[3:6])
        lambda_full, lambda_pos, lambda_ori, nullspace_matrix = self._opspace(c.mass_matrix, c.J_full, c.J_pos, c.J_ori)
        if c.uncoupling:
            wrench = np.concatenate([np.dot(lambda_pos, desired_force), np.dot(lambda_ori, desired_torque)])
        else:
            wrench = np.dot(lambda_full, np.concatenate([desired_force, desired_torque]))
        c.torques = np.dot(c.J_full.T, wrench) + self._d.qfrc_bias[self._qvel_index]
        c.torques += self._nullspace(c.mass_matrix, nullspace_matrix, c.initial_joint, c.joint_pos, c.joint_vel)
        c.new_update = True
        return c.torques

    def substep(self, action: np.ndarray) -> None:
        """``robot_env._pre_action(action, policy_step=False)``: torques and gripper into ``data.ctrl``."""
        robot, d = self.robot, self._d
        robot.torques = np.clip(self._torques(), self._torque_low, self._torque_high)
        # Manipulator.grip_action (the gripper's format_action keeps state: called once a substep, as there)
        closing = robot.gripper.format_action(action[self._control_dim:])
        d.ctrl[self._gripper_actuators] = self._gripper_bias + self._gripper_weight * closing
        d.ctrl[self._joint_actuators] = robot.torques

