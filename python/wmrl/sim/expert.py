"""Privileged-state scripted expert for the ten LIBERO-Spatial tasks.

The expert reads the MuJoCo state (object poses, the robot's end effector and joints, the
scene's collision geometry) and never looks at images. Every task is the same job: pick up
the target black bowl and put it on the plate, so one state machine serves all ten:

    approach  move above the chosen pinch, gripper partly open, hand already oriented
    descend   straight down the bowl's axis until the finger pads straddle the rim wall
    close     pinch the wall; both fingers must touch the bowl, else try another pinch
    lift      straight up to the carry height (try another pinch if the bowl stayed down)
    carry     level the bowl and move it over the plate centre at the carry height
    lower     go down until the bowl is a few cm above the plate
    release   open and let the bowl drop the last few cm onto the plate
    retreat   move up and wait (the episode's success flag is set once the bowl rests)
    backoff   (after a failed pinch) open, rise, re-plan from the bowl's new pose

Grasp. The bowl (11 cm wide) is wider than the open gripper (8 cm), so the hand pinches the
rim wall from above: finger axis radial, one finger inside the bowl, one outside, the pads
centred on one of the flat boxes that make up the wall (a pinch across a seam slips).
Candidates are 12 directions around the rim x 5 variants (wrist lean of 15, 7.5 or 0 deg
outward; pinch height) x 2 finger-axis signs x 2 finger openings. Each is scored by how
comfortable the arm is, at the bowl and later over the plate (the wrist's distance from
the robot base: far reaches lock the elbow at joint 4's limit and make the hand sway, very
close ones fold the arm), how far the wrist must turn, and the variant (the 15-deg lean
lays the pads flat on the flared wall and holds best); finger-axis signs that would take
joint 7 near its limits are dropped. Candidates are checked best first by casting rays
(``mujoco.mj_ray``) along the paths that the fingers, the palm and the wrist sweep on the
way down: the drawer walls of task 4 stand higher than the rim, the wrist can catch on the
cabinet, and the ramekin, cookie box, stove and the other bowl crowd the rest. The hand
follows the bowl's resting tilt (task 5's bowl leans ~16 deg on the ramekin).

Carry. The carry height makes every point of the load (the bowl's rim circle at its foot's
height, the fingers, the palm, the wrist) clear whatever lies under the straight path to the plate,
sampled every centimetre. The bowl (not the hand) is servoed over the plate centre and
released ~3 cm above it.

Control. Actions are OSC_POSE deltas (+-1 = +-5 cm / +-0.5 rad goal offset from the
current pose, world-frame axis-angle). A constant offset moves the hand at about a quarter
of the offset per 50 ms step and the arm coasts about one step after the offset drops, so
the offset is a PD law on the pose error (gain 2, damping by the last step's motion) plus
a 1 cm push toward the target that overcomes joint friction, which otherwise leaves the
hand ~1 cm short. Offsets are capped per phase (~1.3 cm/step in free space, half that near
contacts). Straight moves (descent, lift, lowering) cap only the speed along their line and
correct sideways error with a stiffer gain: the arm otherwise drifts ~1.5 cm sideways on the
way down. Phases advance only when the hand is close to its target and nearly still, so
contacts happen slowly; every phase has a step budget so nothing stalls.

Gripper. The Panda gripper integrates the sign of the action (-1 open, +1 close, 0 hold) by
a quarter of its range per step. The expert reads the integrated command (privileged) and
drives it to a named opening.

All choices are deterministic; the seed only breaks exact ties between equal-cost grasps.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # the expert only touches the env through its attributes
    from wmrl.sim.env import SpatialEnv

# ------------------------------------------------------------------------------ constants
POS_SCALE = 0.05  # metres of goal offset per unit action (OSC_POSE output_max)
ROT_SCALE = 0.5  # radians of goal offset per unit action
POS_GAIN = 2.0  # goal offset per metre of position error
POS_DAMP = 2.0  # steps of velocity subtracted from the error (the arm coasts ~1 step)
POS_BIAS = 0.01  # extra offset toward the target: joint friction otherwise stalls it ~1 cm short
CROSS_GAIN = 4.0  # goal offset per metre of sideways error on straight-line moves
ROT_GAIN = 1.5  # goal offset per radian of orientation error
ROT_DAMP = 1.0

FAST = 0.05  # goal-offset caps (m): ~1.3 cm/step in free space
SLOW = 0.025  # ~0.6 cm/step near contacts

# Pinch variants: (wrist lean in rad, grip-site height above the bowl's foot in m, extra
# cost in m). Leaning 15 deg lays the pads flat on the flared wall (rim top at 0.052) and
# holds best; leaning less lowers the palm's outer end less (task 4's drawer walls end just
# above the rim), as does pinching higher. Upright pads touch the wall along two edges and
# hold only when low (upright and high, 0 of 8 lifts held).
GRASP_VARIANTS = (
    (0.26, 0.038, 0.0),
    (0.26, 0.045, 0.02),
    (0.13, 0.038, 0.02),
    (0.13, 0.045, 0.03),
    (0.0, 0.038, 0.04),
)
PREGRASP_DIST = 0.09  # start of the straight descent, along the bowl axis above the grasp
# Gripper geometry in the grip-site frame (x: finger axis, z: approach, pointing down).
FINGER_WIDTH = 0.026  # finger body thickness outside the pad's inner face
FINGER_TIP = 0.009  # finger bottom below the grip site
FINGER_HALF_DEPTH = 0.010
HAND_BOTTOM = 0.031  # hand (palm) bottom above the grip site
HAND_HALF_LENGTH = 0.102  # along the finger axis
HAND_HALF_DEPTH = 0.032
WRIST_BOTTOM = 0.152  # link 6's bottom above the grip site
WRIST_RADIUS = 0.05  # link 6 around joint 7's axis (the hand axis) ...
WRIST_REACH = 0.136  # ... and its lobe toward joint 6
WRIST_LOBE_ANGLE, WRIST_LOBE_Q7 = -1.841, 0.79  # lobe direction in the grip-site frame at this q7
# Free distance required beyond the pinch along the descent, for points on the fingers and
# on the palm and wrist bottoms. The hand tracks its target to ~5 mm and ~2 deg, which moves
# the ends of the 20 cm palm by more; a palm clearance under the comfortable one is allowed
# but costs (m of cost per m short).
FINGER_CLEARANCE = 0.008
PALM_CLEARANCE_MIN = 0.009
PALM_CLEARANCE = 0.015
TIGHT_PALM_COST = 10.0

GRASP_DIRECTIONS = 12  # candidate pinch points around the rim
TURN_COST = 0.02  # cost (m) per radian the wrist must turn to the grasp
Q7_SAFE = 2.4  # keep joint 7 within +-this (limit 2.9) at the grasp
WRIST_OFFSET = 0.25  # wrist centre above the grip site along the hand axis
REACH_BAND = (0.45, 0.52, 0.60)  # comfortable horizontal wrist distance from the base (m)
OPENINGS = (0.015, 0.010)  # finger-pad half gap while approaching (m); smaller = less outer reach

BOWL_RADIUS = 0.056  # widest radius of the bowl (at the rim)
CARRY_MARGIN = 0.03  # every load point above the tallest obstacle under the path to the plate
RELEASE_HEIGHT = 0.03  # bowl foot above the plate's surface when the gripper opens
RELEASE_XY = 0.012  # bowl centre within this of the plate centre to release
PLATE_SURFACE = 0.006  # plate centre surface above the plate's origin

STILL = 0.003  # m/step: the hand is "nearly still"
APPROACH_ROT_TOL = 0.05  # rad: hand orientation settled before descending
LIFT_CHECK = 0.035  # after the hand rose this much ...
LIFT_MIN = 0.015  # ... the bowl must have risen at least this much, else regrasp
LOST_DIST = 0.04  # bowl moved this far relative to the hand since the pinch: it is lost

PHASE_TIMEOUT = {  # steps; a phase that cannot finish moves on (or regrasps) instead of stalling
    "approach": 45,
    "descend": 25,
    "close": 12,
    "lift": 30,
    "carry": 50,
    "lower": 30,
    "release": 6,
}

UP = np.array([0.0, 0.0, 1.0])
ROBOT_PREFIXES = ("robot0_", "gripper0_", "mount0_")
RAY_GROUPS = np.array([1, 0, 0, 0, 0, 0], dtype=np.uint8)  # collision geoms only (group 0)


# ------------------------------------------------------------------------------ rotations
def quat_wxyz_to_mat(q: np.ndarray) -> np.ndarray:
    w, x, y, z = q
    return np.array(
        [
            [1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)],
            [2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)],
            [2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)],
        ]
    )


def mat_to_axis_angle(rot: np.ndarray) -> np.ndarray:
    """Rotation vector (axis * angle, angle in [0, pi]) of a rotation matrix."""
    cos = np.clip((np.trace(rot) - 1.0) / 2.0, -1.0, 1.0)
    angle = np.arccos(cos)
    if angle < 1e-6:
        return np.zeros(3)
    if angle > np.pi - 1e-4:  # axis from the symmetric part
        axis = np.sqrt(np.maximum((np.diag(rot) + 1.0) / 2.0, 0.0))
        i = int(np.argmax(axis))
        axis[(i + 1) % 3] *= np.sign(rot[i, (i + 1) % 3] + rot[(i + 1) % 3, i]) or 1.0
        axis[(i + 2) % 3] *= np.sign(rot[i, (i + 2) % 3] + rot[(i + 2) % 3, i]) or 1.0
        return axis / np.linalg.norm(axis) * angle
    axis = np.array([rot[2, 1] - rot[1, 2], rot[0, 2] - rot[2, 0], rot[1, 0] - rot[0, 1]])
    return axis / (2.0 * np.sin(angle)) * angle


def angle_between(r1: np.ndarray, r2: np.ndarray) -> float:
    """Angle (rad) of the rotation from orientation r1 to r2."""
    return float(np.arccos(np.clip((np.trace(r2 @ r1.T) - 1.0) / 2.0, -1.0, 1.0)))


def rotation_between(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Smallest rotation taking unit vector a onto unit vector b."""
    v = np.cross(a, b)
    c = float(np.dot(a, b))
    s = np.linalg.norm(v)
    if s < 1e-9:
        return np.eye(3)  # (anti-parallel never happens here: bowls are never upside down)
    k = np.array([[0, -v[2], v[1]], [v[2], 0, -v[0]], [-v[1], v[0], 0]])
    return np.eye(3) + k + k @ k * ((1 - c) / s**2)


def unit(v: np.ndarray) -> np.ndarray:
    return v / np.linalg.norm(v)


# ------------------------------------------------------------------------------ scene
class Scene:
    """Ids and geometry looked up once per env (the model never changes between resets)."""

    def __init__(self, env: SpatialEnv):
        import mujoco

        raw = self.raw = env.raw
        self.m = raw.sim.model._model
        self.d = raw.sim.data._data
        self.robot = raw.robots[0]
        self.eef_site = self.robot.eef_site_id
        self.bowl = raw.obj_body_id[env.task.target_object]
        self.plate = raw.obj_body_id[env.task.place_on]
        self.finger_qpos = list(self.robot._ref_gripper_joint_pos_indexes)
        names = [mujoco.mj_id2name(self.m, mujoco.mjtObj.mjOBJ_BODY, i) or "" for i in range(self.m.nbody)]
        self.robot_bodies = {i for i, n in enumerate(names) if n.startswith(ROBOT_PREFIXES)}
        # finger bodies (link and pad tip) -> which finger
        self.finger_bodies = {
            i: ("left" if "leftfinger" in n or "joint1_tip" in n else "right")
            for i, n in enumerate(names)
            if n.startswith("gripper0_") and ("finger" in n)
        }
        self.q7_index = int(self.robot._ref_joint_pos_indexes[6])  # qpos index of joint 7
        self.robot_base_xy = np.array(self.d.xpos[names.index("robot0_base")][:2])
        self.wall = self._rim_wall()

    def _rim_wall(self) -> tuple[float, float, float]:
        """Centre line of the bowl's side wall in its body frame: r(h) = r0 + slope * (h - h0).

        The wall is a ring of thin tilted boxes (the bowl flares outward); the boxes whose
        centres are highest form it."""
        m = self.m
        geoms = [g for g in range(m.ngeom) if m.geom_bodyid[g] == self.bowl and m.geom_group[g] == 0]
        top = max(m.geom_pos[g][2] for g in geoms)
        wall = [g for g in geoms if m.geom_pos[g][2] > top - 1e-4]
        g = wall[0]
        rot = quat_wxyz_to_mat(m.geom_quat[g])
        long_axis = rot[:, int(np.argmax(m.geom_size[g]))]
        centre = np.array(m.geom_pos[g])
        radial = unit(np.array([centre[0], centre[1], 0.0]))
        slope = abs(np.dot(long_axis, radial) / long_axis[2])
        r0 = float(np.mean([np.hypot(*m.geom_pos[w][:2]) for w in wall]))
        # Facets for the 16 mm pads: the regular boxes, except the two beside the narrow
        # filler box that closes the ring. The filler sits ~1 mm further in, so the inner
        # pad would catch its edge while the outer one presses the neighbour: a pinch on
        # two different boxes that lets the bowl pivot out as it lifts.
        angle = {w: np.arctan2(m.geom_pos[w][1], m.geom_pos[w][0]) for w in wall}
        widest = max(sorted(m.geom_size[w])[1] for w in wall)
        narrow = [w for w in wall if sorted(m.geom_size[w])[1] < 0.8 * widest]
        spacing = 2 * np.pi / len(wall)
        facets = [
            w for w in wall
            if w not in narrow and all(abs(wrap(angle[w] - angle[n])) > spacing for n in narrow)
        ]
        self.wall_angles = np.unique(np.round([angle[w] for w in facets], 3))
        return r0, float(centre[2]), float(slope)

    def wall_facet(self, angle: float) -> float:
        """The centre angle (bowl frame) of the wall box nearest ``angle``. The wall is a
        polygon of ~20-deg flat boxes: pads centred on one press flat against it (several
        contact points, a pinch that holds the bowl's weight), pads across a seam touch two
        edges and the bowl pivots out of them as it lifts."""
        diff = (self.wall_angles - angle + np.pi) % (2 * np.pi) - np.pi
        return float(self.wall_angles[int(np.argmin(np.abs(diff)))])

    def rim_radius(self, h: float) -> float:
        r0, h0, slope = self.wall
        return r0 + slope * (h - h0)

    # ---------------------------------------------------------------- state
    def eef(self) -> tuple[np.ndarray, np.ndarray]:
        return np.array(self.d.site_xpos[self.eef_site]), np.array(self.d.site_xmat[self.eef_site]).reshape(3, 3)

    def body(self, body_id: int) -> tuple[np.ndarray, np.ndarray]:
        return np.array(self.d.xpos[body_id]), np.array(self.d.xmat[body_id]).reshape(3, 3)

    def gripper_command(self) -> float:
        """The gripper's integrated command for finger 1: +1 fully open, -1 fully closed."""
        return float(self.robot.gripper.current_action[0])

    def wrist_joint(self) -> float:
        return float(self.d.qpos[self.q7_index])

    def finger_gap(self) -> float:
        q = self.d.qpos
        return float(q[self.finger_qpos[0]] - q[self.finger_qpos[1]])

    def pinching(self) -> bool:
        """Both fingers touch the bowl (a pinch, not a push)."""
        touched = set()
        for c in self.d.contact[: self.d.ncon]:
            b1, b2 = int(self.m.geom_bodyid[c.geom1]), int(self.m.geom_bodyid[c.geom2])
            if b1 == self.bowl and b2 in self.finger_bodies:
                touched.add(self.finger_bodies[b2])
            elif b2 == self.bowl and b1 in self.finger_bodies:
                touched.add(self.finger_bodies[b1])
        return len(touched) == 2

    # ---------------------------------------------------------------- ray casts
    def ray(self, start: np.ndarray, direction: np.ndarray, length: float, skip: set[int]) -> float | None:
        """Distance to the first collision geom along the ray (bodies in ``skip`` and the
        robot are transparent), or None if nothing is hit within ``length``."""
        import mujoco

        geom = np.zeros(1, dtype=np.int32)
        travelled = 0.0
        while travelled < length:
            p = start + direction * travelled
            dist = mujoco.mj_ray(self.m, self.d, p, direction, RAY_GROUPS, 1, -1, geom)
            if dist < 0 or travelled + dist > length:
                return None
            body = int(self.m.geom_bodyid[geom[0]])
            if body in self.robot_bodies or body in skip:
                travelled += dist + 1e-4
                continue
            return travelled + dist
        return None

    def height_below(self, xy: np.ndarray, skip: set[int], top: float = 1.6) -> float:
        """Height of the highest surface under a point (the table if nothing else)."""
        hit = self.ray(np.array([xy[0], xy[1], top]), np.array([0.0, 0.0, -1.0]), 1.2, skip)
        return top - hit if hit is not None else 0.0


# ------------------------------------------------------------------------------ grasps
@dataclass
class Grasp:
    pos: np.ndarray  # grip-site position at the pinch
    rot: np.ndarray  # grip-site orientation (columns: finger axis, side, hand axis)
    descent: np.ndarray  # unit, down the bowl's axis: the straight path into the pinch
    opening: float  # pad half gap while approaching (m)
    slot: int  # index of the rim direction (0 .. GRASP_DIRECTIONS-1)
    pitch: float  # lean of the wrist away from the bowl's centre (rad)
    height: float  # of the pinch above the bowl's foot (m)
    q7: float  # predicted joint 7 angle at the pinch (rad)
    cost: float

    @property
    def pregrasp(self) -> np.ndarray:
        return self.pos - self.descent * PREGRASP_DIST


def yaw(v: np.ndarray) -> float:
    return float(np.arctan2(v[1], v[0]))


def wrap(angle: float) -> float:
    """Angle in (-pi, pi]."""
    return float(-((-angle + np.pi) % (2 * np.pi) - np.pi))


def finger_signs(scene: Scene, pos: np.ndarray, finger: np.ndarray) -> list[tuple[np.ndarray, float, float]]:
    """Both signs of the (symmetric) finger axis for a pinch at ``pos``, each with the wrist
    turn (rad) it needs and the predicted joint 7 angle; signs that would take joint 7
    (range +-2.9 rad) past ``Q7_SAFE`` are dropped unless both do.

    Joint 7 takes up the hand's yaw change minus the part that the arm's swing about its
    base provides: the hand keeps its yaw relative to the base-to-hand direction unless
    joint 7 turns (q7 falls as that relative yaw grows). Good to ~0.3 rad."""
    eef, eef_rot = scene.eef()
    swing = wrap(yaw(pos[:2] - scene.robot_base_xy) - yaw(eef[:2] - scene.robot_base_xy))
    options = []
    for x in (finger, -finger):
        turn = wrap(yaw(x) - yaw(eef_rot[:, 0]))
        options.append((x, abs(turn), scene.wrist_joint() - (turn - swing)))
    safe = [o for o in options if abs(o[2]) <= Q7_SAFE]
    return safe or [min(options, key=lambda o: abs(o[2]))]


def grasp_poses(
    scene: Scene, slot: int, pitch: float, height: float
) -> list[tuple[np.ndarray, np.ndarray, np.ndarray, float, float]]:
    """Pinch poses on the rim in world direction ``slot`` around the bowl's axis, ``height``
    above the bowl's foot: one per usable finger-axis sign.

    The hand follows the bowl's tilt (task 5's bowl rests ~16 deg tilted on the ramekin):
    with ``pitch`` 0 the hand axis is the bowl's axis and the finger axis is radial. ``pitch``
    leans the wrist outward about the rim's tangent: at ~15 deg the pads lie parallel to the
    flared wall, the palm's inner half clears the rim by more, and on the robot's side of a
    far bowl the wrist comes ~6 cm closer to the robot. Whatever the lean, the hand descends
    along the bowl's axis, so the inner finger drops straight into the bowl.

    Each pose is (grip-site position, orientation, descent direction, wrist turn, joint 7)."""
    origin, rot = scene.body(scene.bowl)
    axis = rot[:, 2]
    direction = 2 * np.pi * slot / GRASP_DIRECTIONS
    u = rot.T @ np.array([np.cos(direction), np.sin(direction), 0.0])  # in the bowl's frame
    facet = scene.wall_facet(float(np.arctan2(u[1], u[0])))
    radial = rot @ np.array([np.cos(facet), np.sin(facet), 0.0])
    pos = origin + axis * height + radial * scene.rim_radius(height)
    c, s = np.cos(pitch), np.sin(pitch)
    approach = -c * axis - s * radial
    poses = []
    for x, turn, q7 in finger_signs(scene, pos, c * radial - s * axis):
        y = np.cross(approach, x)
        poses.append((pos, np.column_stack([x, y, approach]), -axis, turn, q7))
    return poses


def swept_points(
    pos: np.ndarray, rot: np.ndarray, opening: float, q7: float
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Points on the bottom of the hand with the grip site at ``pos``, ``rot``, the pads
    ``opening`` from the site and joint 7 at ``q7``: (finger points, palm and wrist points).

    The fingers are sampled at their tips and halfway up (a leaning finger's upper part
    reaches further out than its tip). The wrist (link 6, ~15 cm above the grip site) sits
    on joint 7's axis with a lobe reaching 13.6 cm sideways toward joint 6; joint 7 turns the
    lobe about the hand axis, so it is sampled over +-50 deg around its predicted direction
    (the prediction of joint 7 is good to ~0.5 rad)."""
    fingers = [
        pos + rot @ np.array([side * (opening + dx), dy, dz])
        for side in (-1.0, 1.0)
        for dx in (0.0, FINGER_WIDTH / 2, FINGER_WIDTH)
        for dy in (-FINGER_HALF_DEPTH, 0.0, FINGER_HALF_DEPTH)
        for dz in (FINGER_TIP, (FINGER_TIP - HAND_BOTTOM) / 2)
    ]
    hand = [
        pos + rot @ np.array([dx, dy, -HAND_BOTTOM])
        for dx in np.linspace(-HAND_HALF_LENGTH, HAND_HALF_LENGTH, 7)
        for dy in (-HAND_HALF_DEPTH, 0.0, HAND_HALF_DEPTH)
    ]
    lobe = WRIST_LOBE_ANGLE - (q7 - WRIST_LOBE_Q7)
    hand += [pos + rot @ np.array([0.0, 0.0, -WRIST_BOTTOM])]
    hand += [
        pos + rot @ np.array([r * np.cos(a), r * np.sin(a), -WRIST_BOTTOM])
        for a in lobe + np.array([-0.9, -0.45, 0.0, 0.45, 0.9, np.pi / 2 + 0.9, np.pi, -np.pi / 2 - 0.9])
        for r in ((WRIST_RADIUS, WRIST_REACH / 2, WRIST_REACH) if abs(wrap(a - lobe)) < 1.0 else (WRIST_RADIUS,))
    ]
    return fingers, hand


def descent_clearance(scene: Scene, grasp: Grasp) -> tuple[float, float]:
    """Free distance beyond the pinch (capped at ``PALM_CLEARANCE``) along the descent, for
    the fingers and for the palm and wrist: rays from the pregrasp pose of each swept point
    down to its pinch pose and on. The bowl itself counts: a finger landing on the rim is
    blocked."""

    def clearance(points: list[np.ndarray]) -> float:
        worst = PALM_CLEARANCE
        for p in points:
            hit = scene.ray(p - grasp.descent * PREGRASP_DIST, grasp.descent, PREGRASP_DIST + worst, set())
            if hit is not None:
                worst = hit - PREGRASP_DIST
                if worst < 0:
                    break
        return worst

    fingers, hand = swept_points(grasp.pos, grasp.rot, grasp.opening, grasp.q7)
    return clearance(fingers), clearance(hand)


def reach_cost(scene: Scene, pos: np.ndarray, hand_axis: np.ndarray) -> float:
    """How awkward the arm pose with the grip site at ``pos`` is, from the wrist's horizontal
    distance to the robot base.

    Far reaches straighten the elbow against joint 4's limit (the hand then lags and sways
    by ~1 cm); very close ones fold the arm so much that the hand drifts. Both work, only
    worse, so they cost more rather than being ruled out."""
    wrist = pos - hand_axis * WRIST_OFFSET
    r = float(np.linalg.norm(wrist[:2] - scene.robot_base_xy))
    lo, best, hi = REACH_BAND
    return abs(r - best) + 2.0 * max(0.0, r - hi) + 2.0 * max(0.0, lo - r)


def plan_grasp(scene: Scene, tried: set[int], rng: np.random.Generator) -> Grasp:
    """The cheapest pinch whose descent is clear. Candidates are all rim directions (except
    those already tried) x pinch variants x finger-axis signs x openings. Costs are cheap, ray casts are not, so
    candidates are checked best first; a tight palm clearance adds to a candidate's cost,
    so the search goes on until no unchecked candidate can beat the best one found."""
    bowl, _ = scene.body(scene.bowl)
    plate, _ = scene.body(scene.plate)
    candidates = []
    for slot, (pitch, height, variant_cost) in itertools.product(range(GRASP_DIRECTIONS), GRASP_VARIANTS):
        if slot in tried:
            continue
        for pos, rot, descent, turn, q7 in grasp_poses(scene, slot, pitch, height):
            # The hand keeps its offset from the bowl while carrying, so the same grasp
            # decides the arm's reach over the plate too. Turning the wrist is slow
            # (~4 deg/step), which matters when retrying from the other side.
            at_plate = pos - bowl + plate
            cost = (
                reach_cost(scene, pos, rot[:, 2])
                + reach_cost(scene, at_plate, rot[:, 2])
                + variant_cost
                + TURN_COST * turn
            )
            for k, opening in enumerate(OPENINGS):
                tie = rng.random() * 1e-6  # seeded tie break between equal costs
                candidates.append(Grasp(pos, rot, descent, opening, slot, pitch, height, q7, cost + 0.01 * k + tie))
    candidates.sort(key=lambda g: g.cost)
    best, best_cost = None, np.inf
    for g in candidates:
        if g.cost >= best_cost:
            break
        finger_clear, palm_clear = descent_clearance(scene, g)
        if finger_clear < FINGER_CLEARANCE or palm_clear < PALM_CLEARANCE_MIN:
            continue
        cost = g.cost + TIGHT_PALM_COST * max(0.0, PALM_CLEARANCE - palm_clear)
        if cost < best_cost:
            best, best_cost = g, cost
    if best is not None:
        return best
    # Nothing clear (never seen on the fixed initial states): the cheapest untried one.
    if candidates:
        return candidates[0]
    pitch, height, _ = GRASP_VARIANTS[0]
    pos, rot, descent, _, q7 = grasp_poses(scene, 0, pitch, height)[0]
    return Grasp(pos, rot, descent, OPENINGS[-1], 0, pitch, height, q7, np.inf)


# ------------------------------------------------------------------------------ carrying
def load_points(scene: Scene) -> list[np.ndarray]:
    """Points of the load while carrying, as offsets from the bowl's origin: the bowl's
    widest ring at its foot's height, and the finger and palm bottoms (on the outer side of
    a pitched hand the palm hangs nearly as low as the bowl)."""
    bowl, bowl_rot = scene.body(scene.bowl)
    eef, eef_rot = scene.eef()
    pts = []
    for k in range(16):
        a = 2 * np.pi * k / 16
        pts.append(bowl_rot @ np.array([BOWL_RADIUS * np.cos(a), BOWL_RADIUS * np.sin(a), 0.0]))
    fingers, hand = swept_points(eef, eef_rot, 0.005, scene.wrist_joint())
    pts += [p - bowl for p in fingers + hand]
    return pts


def carry_height(scene: Scene, points: list[np.ndarray]) -> float:
    """Bowl-origin height at which every load point clears everything under the straight
    path to the plate by ``CARRY_MARGIN``. The path is sampled every centimetre: the drawer
    walls of task 4 are less than a centimetre thick."""
    bowl, _ = scene.body(scene.bowl)
    plate, _ = scene.body(scene.plate)
    travel = plate[:2] - bowl[:2]
    skip = {scene.bowl}
    need = plate[2] + PLATE_SURFACE + RELEASE_HEIGHT
    for t in np.linspace(0.0, 1.0, int(np.linalg.norm(travel) / 0.01) + 2):
        for p in points:
            ground = scene.height_below(bowl[:2] + t * travel + p[:2], skip)
            need = max(need, ground - p[2] + CARRY_MARGIN)
    return need


# ------------------------------------------------------------------------------ expert
class ScriptedExpert:
    """Pick-and-place state machine on privileged simulator state (see module docstring)."""

    policy_id = "scripted-expert-v1"

    def __init__(self, seed: int = 0):
        self.seed = int(seed)
        self.scene: Scene | None = None
        self.phase = "approach"

    # ------------------------------------------------------------------ episode
    def reset(self, env: SpatialEnv) -> None:
        if self.scene is None or self.scene.raw is not env.raw:  # ids are looked up once per env
            self.scene = Scene(env)
        self.rng = np.random.default_rng(self.seed)
        self.tried: set[int] = set()
        self.prev_eef, self.prev_rot = self.scene.eef()
        self._choose_grasp()
        self._enter("approach")

    def act(self, env: SpatialEnv) -> np.ndarray:
        s = self.scene
        eef, eef_rot = s.eef()
        self.vel = eef - self.prev_eef
        self.ang_vel = mat_to_axis_angle(eef_rot @ self.prev_rot.T)
        self.speed = float(np.linalg.norm(self.vel))
        self.prev_eef, self.prev_rot = eef, eef_rot
        self.phase_steps += 1
        self.line = None  # set by phases that move along a straight line
        pos, rot, cap, opening = getattr(self, "_" + self.phase)(eef, eef_rot)
        action = np.zeros(7)
        action[:3] = self._servo_pos(pos - eef, self.vel, cap, self.line)
        action[3:6] = self._servo_rot(rot @ eef_rot.T, self.ang_vel)
        action[6] = self._gripper_action(opening)
        return np.clip(action, -1.0, 1.0).astype(np.float32)

    # ------------------------------------------------------------------ low-level control
    @staticmethod
    def _servo_pos(err: np.ndarray, vel: np.ndarray, cap: float, line: np.ndarray | None = None) -> np.ndarray:
        """Goal offset: PD on the position error plus a small push through joint friction,
        capped to ``cap``. With a ``line`` (unit direction of a straight move), the cap
        limits only the speed along it and the sideways error gets a stiffer PD of its own:
        the arm drifts sideways by over a centimetre on fast vertical moves otherwise."""
        n_err = np.linalg.norm(err)
        bias = POS_BIAS * err / n_err if n_err > 0.002 else np.zeros(3)
        if line is None:
            offset = POS_GAIN * (err - POS_DAMP * vel) + bias
            n = np.linalg.norm(offset)
            if n > cap:
                offset *= cap / n
            return offset / POS_SCALE
        along, v_along = float(np.dot(err, line)), float(np.dot(vel, line))
        cross, v_cross = err - along * line, vel - v_along * line
        offset_along = np.clip(POS_GAIN * (along - POS_DAMP * v_along) + np.dot(bias, line), -cap, cap)
        offset_cross = CROSS_GAIN * (cross - POS_DAMP * v_cross)
        return (offset_along * line + offset_cross) / POS_SCALE

    @staticmethod
    def _servo_rot(rot_err: np.ndarray, ang_vel: np.ndarray) -> np.ndarray:
        offset = ROT_GAIN * (mat_to_axis_angle(rot_err) - ROT_DAMP * ang_vel)
        n = np.linalg.norm(offset)
        if n > ROT_SCALE:
            offset *= ROT_SCALE / n
        return offset / ROT_SCALE

    def _gripper_action(self, opening: float | None) -> float:
        """Drive the gripper to a pad half gap (m); None closes fully."""
        if opening is None:
            return 1.0
        target = np.clip(opening / 0.02 - 1.0, -1.0, 1.0)  # finger 1 ctrl = 0.02 * (1 + command)
        cmd = self.scene.gripper_command()
        if cmd < target - 0.05:
            return -1.0
        if cmd > target + 0.05:
            return 1.0
        return 0.0

    # ------------------------------------------------------------------ helpers
    def _choose_grasp(self) -> None:
        if len(self.tried) >= GRASP_DIRECTIONS:
            self.tried.clear()
        s = self.scene
        self.grasp = plan_grasp(s, self.tried, self.rng)
        self.tried.add(self.grasp.slot)
        # Carry the bowl level: undo its resting tilt (task 5's bowl leans ~16 deg on the
        # ramekin). Computed once from the resting pose; the live tilt of a held bowl wobbles.
        _, bowl_rot = s.body(s.bowl)
        self.carry_rot = rotation_between(bowl_rot[:, 2], UP) @ self.grasp.rot
        self.bowl_rest_z = s.body(s.bowl)[0][2]

    def _enter(self, phase: str) -> None:
        self.phase = phase
        self.phase_steps = 0
        self.prev_gap = self.scene.finger_gap()

    def _settled(self, eef: np.ndarray, target: np.ndarray, tol: float) -> bool:
        return np.linalg.norm(target - eef) < tol and self.speed < STILL

    def _bowl_lost(self, eef: np.ndarray) -> bool:
        """The bowl moved relative to the hand since the pinch: it slipped out or was
        knocked off."""
        bowl, _ = self.scene.body(self.scene.bowl)
        return np.linalg.norm(bowl - eef - self.hold_offset) > LOST_DIST

    def _over_plate(self, eef: np.ndarray, bowl_z: float) -> np.ndarray:
        """Hand position that puts the held bowl's origin over the plate centre at ``bowl_z``."""
        s = self.scene
        bowl, _ = s.body(s.bowl)
        plate, _ = s.body(s.plate)
        return np.array([eef[0] + plate[0] - bowl[0], eef[1] + plate[1] - bowl[1], eef[2] + bowl_z - bowl[2]])

    # ------------------------------------------------------------------ phases
    # Each returns (target position, target orientation, offset cap, gripper opening).
    def _approach(self, eef, eef_rot):
        g = self.grasp
        target = g.pregrasp
        # Stay high while far away so the fingers do not sweep through neighbours.
        if np.linalg.norm((target - eef)[:2]) > 0.04:
            target = np.array([target[0], target[1], max(target[2], eef[2])])
        elif (
            self._settled(eef, target, 0.01) and angle_between(eef_rot, g.rot) < APPROACH_ROT_TOL
        ) or self.phase_steps > PHASE_TIMEOUT["approach"]:
            self._enter("descend")
        return target, g.rot, FAST, g.opening

    def _descend(self, eef, eef_rot):
        g = self.grasp
        if self._settled(eef, g.pos, 0.004) or self.phase_steps > PHASE_TIMEOUT["descend"]:
            self._enter("close")
        cap = FAST if np.linalg.norm(g.pos - eef) > 0.04 else SLOW
        self.line = g.descent
        return g.pos, g.rot, cap, g.opening

    def _close(self, eef, eef_rot):
        g = self.grasp
        s = self.scene
        gap = s.finger_gap()
        # Lifting before the fingers stop lets the wall slip out of a half-made pinch.
        closed = s.gripper_command() <= -1.0 + 1e-6 and abs(gap - self.prev_gap) < 0.0005
        self.prev_gap = gap
        if closed or self.phase_steps > PHASE_TIMEOUT["close"]:
            if not s.pinching():  # the wall is not between the fingers
                return self._regrasp(eef, eef_rot)
            bowl, _ = s.body(s.bowl)
            self.lift_from = eef.copy()
            self.hold_offset = bowl - eef
            self.carry_z = carry_height(s, load_points(s))
            self._enter("lift")
        return g.pos, g.rot, SLOW, None

    def _lift(self, eef, eef_rot):
        """Straight up until the load clears everything on the way to the plate."""
        bowl, _ = self.scene.body(self.scene.bowl)
        if eef[2] - self.lift_from[2] > LIFT_CHECK and bowl[2] - self.bowl_rest_z < LIFT_MIN or self._bowl_lost(eef):
            return self._regrasp(eef, eef_rot)
        target = np.array([self.lift_from[0], self.lift_from[1], eef[2] + self.carry_z - bowl[2]])
        if bowl[2] > self.carry_z - 0.01 or self.phase_steps > PHASE_TIMEOUT["lift"]:
            self._enter("carry")
        cap = SLOW if self.phase_steps < 3 else FAST  # let the pinch take the weight first
        self.line = UP
        return target, self.grasp.rot, cap, None

    def _carry(self, eef, eef_rot):
        if self._bowl_lost(eef):
            return self._regrasp(eef, eef_rot)
        s = self.scene
        bowl, _ = s.body(s.bowl)
        plate, _ = s.body(s.plate)
        near = np.linalg.norm(plate[:2] - bowl[:2]) < 0.02
        if (near and self.speed < 2 * STILL) or self.phase_steps > PHASE_TIMEOUT["carry"]:
            self._enter("lower")
        return self._over_plate(eef, self.carry_z), self.carry_rot, FAST, None

    def _lower(self, eef, eef_rot):
        if self._bowl_lost(eef):
            return self._regrasp(eef, eef_rot)
        s = self.scene
        bowl, _ = s.body(s.bowl)
        plate, _ = s.body(s.plate)
        release_z = plate[2] + PLATE_SURFACE + RELEASE_HEIGHT
        target = self._over_plate(eef, release_z)
        low = bowl[2] < release_z + 0.005
        if (low and np.linalg.norm(plate[:2] - bowl[:2]) < RELEASE_XY) or self.phase_steps > PHASE_TIMEOUT["lower"]:
            self.release_at = target.copy()
            self._enter("release")
        cap = FAST if bowl[2] > release_z + 0.04 else SLOW
        self.line = -UP
        return target, self.carry_rot, cap, None

    def _release(self, eef, eef_rot):
        """Open in place; the bowl drops the last few centimetres onto the plate."""
        if self.phase_steps > PHASE_TIMEOUT["release"]:
            self._enter("retreat")
        return self.release_at, eef_rot, SLOW, 0.04

    def _retreat(self, eef, eef_rot):
        return self.release_at + np.array([0.0, 0.0, 0.08]), eef_rot, SLOW, 0.04

    def _regrasp(self, eef, eef_rot):
        """The bowl did not come along: open, back off upward and try the next direction."""
        self._enter("backoff")
        return self._backoff(eef, eef_rot)

    def _backoff(self, eef, eef_rot):
        target = np.array([eef[0], eef[1], max(eef[2], self.grasp.pregrasp[2])])
        if self.scene.gripper_command() >= 1.0 - 1e-6 and eef[2] > self.grasp.pregrasp[2] - 0.02:
            self._choose_grasp()
            self._enter("approach")
        return target, eef_rot, SLOW, 0.04
