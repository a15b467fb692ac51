"""MuJoCo's Python bindings alone, without LIBERO: a free box and a hinged capsule stepped 500 times
under applied forces, then a site Jacobian; prints the version, NumPy's, and a digest of every
step's qpos, qvel and sensor readings. Two builds of the same mujoco print the same digest when their
bindings hand the same numbers through (a built wheel against the official one, NumPy 1 against 2):

    python bench/mujoco_bindings_check.py        # in each environment; compare the digests
"""

import hashlib

import mujoco
import numpy as np

XML = """<mujoco><option timestep="0.002"/><worldbody><light pos="0 0 3"/><geom type="plane" size="2 2 .1"/>
<body pos="0 0 1"><freejoint/><geom type="box" size=".1 .2 .3" mass="1"/><site name="s"/></body>
<body pos="0.3 0 0.5"><joint type="hinge" axis="0 1 0"/><geom type="capsule" fromto="0 0 0 0 0 -.4" size=".05"/></body>
</worldbody><sensor><accelerometer site="s"/><gyro site="s"/></sensor></mujoco>"""


def main() -> str:
    m = mujoco.MjModel.from_xml_string(XML)
    d = mujoco.MjData(m)
    h = hashlib.sha256()
    for i in range(500):
        d.qfrc_applied[:] = np.sin(i * 0.01 + np.arange(m.nv))
        mujoco.mj_step(m, d)
        for a in (d.qpos, d.qvel, d.sensordata):
            h.update(a.tobytes())
    jac = np.zeros((3, m.nv))
    mujoco.mj_jacSite(m, d, jac, None, 0)
    h.update(jac.tobytes())
    print(f"mujoco {mujoco.__version__} ({mujoco.__file__}), numpy {np.__version__}: digest {h.hexdigest()[:16]}")
    return h.hexdigest()


if __name__ == "__main__":
    main()
