"""Real bimanual data: MuJoCo ALOHA (the ``gym-aloha`` package) driven by scripted policies.

Two tasks, both with two 6-DoF ViperX arms and the assets inside the package:

- ``transfer_cube``: the right arm picks up a red cube and hands it to the left arm.
- ``insertion``: the left arm grasps a socket, the right arm a peg; they meet and insert.

The scripted policies are the waypoint planners of the original ALOHA work, run in the
end-effector (mocap) variant of each scene: targets are interpolated linearly between
waypoints and gripper openings likewise. A failed episode comes from the same planner with
its grasp target shifted by a few centimetres (``fail_fraction`` of the episodes); success
is the task's own reward reaching its maximum (4) at any step, so a perturbed episode that
still succeeds is labelled a success.

Physics runs at 50 Hz (the package's DT); a frame is rendered from the ``top`` camera every
``frame_stride`` control steps, and one contract transition covers those steps: the
commanded target at its end, the measured pose at its start, measured joints at its end.
"""

from __future__ import annotations

import numpy as np

from wmrl.bimanual import contract
from wmrl.bimanual.bundle import Episode
from wmrl.config import BIMANUAL_TASKS as TASKS

CAPTIONS = {
    "transfer_cube": "the right arm picks up the red cube and hands it over to the left arm",
    "insertion": "the left arm picks up the blue socket, the right arm the red peg, and they insert the peg into the socket",
}
EPISODE_STEPS = 400  # the planners' horizon (8 s at 50 Hz)
MAX_REWARD = 4
WELD_SOLIMP = (0.9, 0.95, 0.001, 0.5, 2.0)  # MuJoCo's default impedance (see AlohaSim)


def _quat_mul(a, b):
    w1, x1, y1, z1 = a
    w2, x2, y2, z2 = b
    return np.array([w1 * w2 - x1 * x2 - y1 * y2 - z1 * z2, w1 * x2 + x1 * w2 + y1 * z2 - z1 * y2,
                     w1 * y2 - x1 * z2 + y1 * w2 + z1 * x2, w1 * z2 + x1 * y2 - y1 * x2 + z1 * w2])


def _axis_quat(axis, degrees):
    half = np.deg2rad(degrees) / 2
    return np.concatenate([[np.cos(half)], np.sin(half) * np.asarray(axis, float)])


def plan(task: str, init_left: np.ndarray, init_right: np.ndarray, objects: np.ndarray, shift: np.ndarray) -> tuple[list, list]:
    """Waypoints ``(t, xyz, quat, gripper)`` for each arm; ``gripper`` 1 = open, 0 = closed.

    ``shift`` (3,) moves the grasp targets (zero for the nominal plan)."""
    left_q, right_q = init_left[3:], init_right[3:]
    if task == "transfer_cube":
        box = objects[:3] + shift
        pick_q = _quat_mul(right_q, _axis_quat([0, 1, 0], -60))
        meet_q = _axis_quat([1, 0, 0], 90)
        meet = np.array([0.0, 0.5, 0.25])
        left = [(0, init_left[:3], left_q, 0), (100, meet + [-0.1, 0, -0.02], meet_q, 1),
                (260, meet + [0.02, 0, -0.02], meet_q, 1), (310, meet + [0.02, 0, -0.02], meet_q, 0),
                (360, meet + [-0.1, 0, -0.02], meet_q, 0), (400, meet + [-0.1, 0, -0.02], meet_q, 0)]
        right = [(0, init_right[:3], right_q, 0), (90, box + [0, 0, 0.08], pick_q, 1),
                 (130, box + [0, 0, -0.015], pick_q, 1), (170, box + [0, 0, -0.015], pick_q, 0),
                 (200, meet + [0.05, 0, 0], pick_q, 0), (220, meet, pick_q, 0), (310, meet, pick_q, 1),
                 (360, meet + [0.1, 0, 0], pick_q, 1), (400, meet + [0.1, 0, 0], pick_q, 1)]
    elif task == "insertion":
        peg, socket = objects[:3] + shift, objects[7:10]
        right_pick = _quat_mul(right_q, _axis_quat([0, 1, 0], -60))
        left_pick = _quat_mul(left_q, _axis_quat([0, 1, 0], 60))
        meet = np.array([0.0, 0.5, 0.15])
        lift = 0.00715
        left = [(0, init_left[:3], left_q, 0), (120, socket + [0, 0, 0.08], left_pick, 1),
                (170, socket + [0, 0, -0.03], left_pick, 1), (220, socket + [0, 0, -0.03], left_pick, 0),
                (285, meet + [-0.1, 0, 0], left_pick, 0), (340, meet + [-0.05, 0, 0], left_pick, 0),
                (400, meet + [-0.05, 0, 0], left_pick, 0)]
        right = [(0, init_right[:3], right_q, 0), (120, peg + [0, 0, 0.08], right_pick, 1),
                 (170, peg + [0, 0, -0.03], right_pick, 1), (220, peg + [0, 0, -0.03], right_pick, 0),
                 (285, meet + [0.1, 0, lift], right_pick, 0), (340, meet + [0.05, 0, lift], right_pick, 0),
                 (400, meet + [0.05, 0, lift], right_pick, 0)]
    else:
        raise ValueError(f"unknown ALOHA task {task!r}; choose one of {TASKS}")
    return left, right


def interpolate(waypoints: list, t: int) -> tuple[np.ndarray, np.ndarray, float]:
    for (t0, x0, q0, g0), (t1, x1, q1, g1) in zip(waypoints[:-1], waypoints[1:]):
        if t0 <= t <= t1:
            f = (t - t0) / max(t1 - t0, 1)
            q = (1 - f) * np.asarray(q0) + f * np.asarray(q1)
            return (1 - f) * np.asarray(x0, float) + f * np.asarray(x1, float), q / np.linalg.norm(q), (1 - f) * g0 + f * g1
    _, x, q, g = waypoints[-1]
    return np.asarray(x, float), np.asarray(q, float), float(g)


class AlohaSim:
    """One end-effector ALOHA scene, stepped directly (no per-step 640x480 renders)."""

    def __init__(self, task: str, image_size: int):
        from wmrl.gl import configure_renderer

        configure_renderer("auto")
        from dm_control import mujoco
        from gym_aloha.constants import ASSETS_DIR, DT
        from gym_aloha.tasks.sim_end_effector import InsertionEndEffectorTask, TransferCubeEndEffectorTask

        if task not in TASKS:
            raise ValueError(f"unknown ALOHA task {task!r}; choose one of {TASKS}")
        self.task_name, self.image_size, self.dt = task, image_size, DT
        self.physics = mujoco.Physics.from_xml_path(str(ASSETS_DIR / f"bimanual_viperx_end_effector_{task}.xml"))
        self.task = TransferCubeEndEffectorTask() if task == "transfer_cube" else InsertionEndEffectorTask()
        self.substeps = int(round(DT / self.physics.timestep()))
        # The scene's mocap welds use solimp ".25 .25 0.001", which under MuJoCo 3.x lets the
        # grippers sag centimetres behind their targets and the planners then miss (0 of 10
        # successes measured). MuJoCo's default impedance keeps the weld's solref and brings
        # the nominal plans to 9/10 (transfer 5/5, insertion 4/5). Recorded in the bundle.
        self.physics.model.eq_solimp[:] = WELD_SOLIMP

    def reset(self, seed: int) -> np.ndarray:
        from gym_aloha.utils import sample_box_pose, sample_insertion_pose

        p = self.physics
        with p.reset_context():
            self.task.initialize_episode(p)
            # the package samples object poses unseeded; replace them with seeded ones
            pose = sample_box_pose(seed) if self.task_name == "transfer_cube" else np.concatenate(sample_insertion_pose(seed))
            p.data.qpos[16 : 16 + len(pose)] = pose
        return p.data.qpos[16:].copy()

    def mocap(self) -> tuple[np.ndarray, np.ndarray]:
        d = self.physics.data
        return np.concatenate([d.mocap_pos[0], d.mocap_quat[0]]), np.concatenate([d.mocap_pos[1], d.mocap_quat[1]])

    def measure(self) -> dict[str, np.ndarray]:
        """Measured state: end-effector poses (world), finger separation, arm joints.

        The end-effector frame is the one the mocap target commands: the weld's ``relpose``
        is the gripper link's pose in the mocap frame, so the measured end effector is the
        gripper link composed with its inverse (about 13.5 cm ahead of the link, between the
        fingers). Commanded and measured poses are then directly comparable.
        """
        p = self.physics
        out = {}
        for i, (arm, q0) in enumerate((("left", 0), ("right", 8))):
            rel_p, rel_q = p.model.eq_data[i, 3:6], p.model.eq_data[i, 6:10]
            rot_g = p.named.data.xmat[f"vx300s_{arm}/gripper_link"].reshape(3, 3)
            rot_e = rot_g @ contract.quat_to_matrix(rel_q).T
            out[f"{arm}_rot"] = rot_e
            out[f"{arm}_pos"] = p.named.data.xpos[f"vx300s_{arm}/gripper_link"] - rot_e @ rel_p
            out[f"{arm}_width"] = float(p.data.qpos[q0 + 6] - p.data.qpos[q0 + 7])
            out[f"{arm}_joints"] = p.data.qpos[q0 : q0 + 6].copy()
        return out

    def step(self, action: np.ndarray) -> int:
        self.task.before_step(action, self.physics)
        self.physics.step(self.substeps)
        self.task.after_step(self.physics)
        return int(self.task.get_reward(self.physics))

    def render(self) -> np.ndarray:
        return self.physics.render(height=self.image_size, width=self.image_size, camera_id="top")


def commanded_width(g: float) -> float:
    """Normalised gripper command (0 closed, 1 open) -> commanded finger separation in m."""
    from gym_aloha.constants import unnormalize_puppet_gripper_position

    return 2.0 * float(unnormalize_puppet_gripper_position(g))  # each finger moves by the ctrl value


def run_episode(sim: AlohaSim, seed: int, *, perturb: bool, frame_stride: int, max_steps: int = EPISODE_STEPS) -> Episode:
    """One scripted episode in contract form."""
    rng = np.random.default_rng(seed)
    objects = sim.reset(seed)
    init_left, init_right = sim.mocap()
    shift = np.zeros(3)
    if perturb:  # grasp 3-6 cm off in a random horizontal direction: usually a miss
        ang = rng.uniform(0, 2 * np.pi)
        shift[:2] = rng.uniform(0.03, 0.06) * np.array([np.cos(ang), np.sin(ang)])
    left_wp, right_wp = plan(sim.task_name, init_left, init_right, objects, shift)
    steps = min(max_steps, EPISODE_STEPS)
    frames = [sim.render()]
    starts = [sim.measure()]
    ends, targets = [], []
    best = 0
    for t in range(steps):
        lx, lq, lg = interpolate(left_wp, t)
        rx, rq, rg = interpolate(right_wp, t)
        best = max(best, sim.step(np.concatenate([lx, lq, [lg], rx, rq, [rg]])))
        if (t + 1) % frame_stride == 0:
            frames.append(sim.render())
            ends.append(sim.measure())
            targets.append((lx, lq, lg, rx, rq, rg))
            starts.append(ends[-1])
    n = len(targets)
    row = contract.ActionRow(n)
    for arm, k in (("left", 0), ("right", 3)):
        contract.arm_fields(
            row, arm,
            target_pos=np.stack([tg[k] for tg in targets]),
            target_rot=contract.quat_to_matrix(np.stack([tg[k + 1] for tg in targets])),
            target_width=np.array([commanded_width(tg[k + 2]) for tg in targets]),
            start_pos=np.stack([s[f"{arm}_pos"] for s in starts[:n]]),
            start_rot=np.stack([s[f"{arm}_rot"] for s in starts[:n]]),
            start_width=np.array([s[f"{arm}_width"] for s in starts[:n]]),
            joint_pos=np.stack([e[f"{arm}_joints"] for e in ends]),  # 6 joints: slot 7 stays masked
        )
    contract.shared_fields(
        row,
        left_pos=np.stack([e["left_pos"] for e in ends]), left_rot=np.stack([e["left_rot"] for e in ends]),
        right_pos=np.stack([e["right_pos"] for e in ends]), right_rot=np.stack([e["right_rot"] for e in ends]),
    )
    row.set("duration", np.full(n, frame_stride * sim.dt))
    return Episode(
        frames=np.stack(frames[: n + 1]).astype(np.uint8), actions=row.values, mask=row.mask,
        caption=CAPTIONS[sim.task_name], success=best >= MAX_REWARD,
        meta={"task": sim.task_name, "seed": seed, "perturbed": perturb, "max_reward": best,
              "frame_stride": frame_stride, "control_hz": round(1 / sim.dt), "camera": "top"},
    )
