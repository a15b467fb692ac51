#!/usr/bin/env bash
# Prepare a lent GPU machine for the kit's stages (its Python 3.12 has torch, h5py, imageio,
# matplotlib, tensorboard; no package index). Carried with the working tree:
#   .gl/*.deb          EGL loader debs (libegl1, libglvnd0, ...), unpacked into /
#   .offline/py312     the simulator side (make offline-bundle PYTHON_VERSION=3.12 OUT=.offline/py312)
#   .offline/wm312     DeepSpeed wheels for the world-model phases (bash bench/make_wm_wheels.sh), optional
#   .offline/mujoco237 the pinned mujoco's sources (bash bench/mujoco_wheel.sh fetch) and, where kept, its
#                      wheel built for Python 3.12; optional: without it the simulator is the bundle's
#                      mujoco 3.3.7 (PyPI has no 2.3.7 wheel for Python 3.12)
# Idempotent; prints the environment the stages need (bench/gpu.py sources it itself).
set -euo pipefail
cd "$(dirname "$0")/.."
# two phases started at once (grpo and grpo TAG=_b) both prepare: the second waits for the first,
# whose half-unpacked files it would otherwise trip over (seen: exit 2 in dpkg -x)
exec 9>/tmp/wmrl_prepare_gpu.lock
flock 9
if [ -d .gl ]; then for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig; fi
[ -d /tmp/sim/robosuite ] || python3 python/offline_bundle.py install --bundle .offline/py312 --target /tmp/sim --no-check >&2
# The pinned physics, mujoco 2.3.7, which PyPI has no wheel of for this Python, installed over the
# bundle's mujoco; bench/physics_fingerprint.py checks it against the CPU's. With .offline/mujoco237
# carried (bash bench/mujoco_wheel.sh fetch): a wheel for this Python among its files (built by
# bench/mujoco_wheel.sh on another machine and kept there: bench/prepare_carry.sh) is tried first; where
# none is, or it does not load here (other system libraries), the bindings are built here, once per
# machine (~5 minutes of device time), and a copy of the wheel goes into the bench output folder, which
# the call brings back, so that it can be kept.
mujoco_237() {  # 2.3.7 is what /tmp/sim imports, and its compiled bindings load and step a model
  MUJOCO_GL=disable PYTHONPATH=/tmp/sim python3 - 2>/dev/null <<'EOF'
import sys, mujoco
model = mujoco.MjModel.from_xml_string("<mujoco/>")
mujoco.mj_step(model, mujoco.MjData(model))
sys.exit(mujoco.__version__ != "2.3.7")
EOF
}
install_mujoco() {  # the bundle's 3.3.7 removed first: pip --target --upgrade keeps its old dist-info
  rm -rf /tmp/sim/mujoco /tmp/sim/mujoco-*.dist-info
  python3 -m pip install -q --no-index --no-deps --target /tmp/sim "$1" >&2 && mujoco_237
}
if [ -d .offline/mujoco237 ] && ! mujoco_237; then
  tag=$(python3 -c "import sys; print(f'cp{sys.version_info[0]}{sys.version_info[1]}')")
  carried=$(ls .offline/mujoco237/mujoco-2.3.7-"$tag"-"$tag"-*.whl 2>/dev/null | head -1 || true)
  if [ -n "$carried" ] && install_mujoco "$carried"; then
    echo "note: mujoco 2.3.7 from the carried $carried (no build)" >&2
  else
    [ -z "$carried" ] || echo "note: the carried $carried does not load here: building the bindings" >&2
    ls /tmp/mujoco237_wheel/mujoco-2.3.7-"$tag"-*.whl >/dev/null 2>&1 || bash bench/mujoco_wheel.sh build .offline/mujoco237 /tmp/mujoco237_wheel >&2
    built=$(ls /tmp/mujoco237_wheel/mujoco-2.3.7-"$tag"-*.whl | head -1)
    install_mujoco "$built" || { echo "error: $built does not load: delete /tmp/mujoco237_wheel and rerun, which builds it again" >&2; exit 2; }
    keep="${BENCH_OUT:-runs/gpu_out}"; mkdir -p "$keep" && cp "$built" "$keep"/
    echo "note: built $built; a copy is in $keep: keep it in .offline/mujoco237 (bench/prepare_carry.sh) to skip this build next time" >&2
  fi
fi
if [ -d .offline/wm312 ] && [ ! -d /tmp/wm/deepspeed ]; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/wm .offline/wm312/*.whl >&2
fi
if [ -d .offline/wm312 ] && ! PYTHONPATH=/tmp/wm python3 -c "import deepspeed" 2>/dev/null; then
  echo "error: .offline/wm312 brought no working DeepSpeed (rebuild it here: bash bench/make_wm_wheels.sh)" >&2; exit 2
fi
echo "PYTHONPATH=/tmp/sim:/tmp/wm:$PWD/python MUJOCO_GL=egl PYTHONUNBUFFERED=1 TQDM_DISABLE=1"
