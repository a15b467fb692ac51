#!/usr/bin/env bash
# Regenerate the container-side lock files (part of `make lock`; scripts/lock.sh does
# docker/train.lock and docker/wm.lock):
#   docker/build.lock           pip/setuptools/wheel installed first in both images (universal)
#   docker/driver.lock          docker-py for the host-side driver, .venv/driver (universal)
#   docker/test-cpu-train.lock  CPU-only stand-ins used by tests/containers (see their .in files)
#   docker/test-cpu-wm.lock
# TORCH_CPU_WHEELS: a folder holding torch's CPU wheel (not on PyPI), default /opt/wheels.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
uv="$(scripts/ensure_uv.sh)"
export UV_NATIVE_TLS=1
compile() { "$uv" pip compile --quiet --generate-hashes --custom-compile-command "make lock" "$@"; }
compile --universal --python-version 3.10 docker/requirements-build.in -o docker/build.lock
compile --universal --python-version 3.10 docker/requirements-driver.in -o docker/driver.lock
wheels="${TORCH_CPU_WHEELS:-/opt/wheels}"
if ls "$wheels"/torch-*+cpu-cp311-*.whl >/dev/null 2>&1; then
  compile --python-version 3.11 --python-platform x86_64-manylinux_2_28 --find-links "$wheels" \
    docker/requirements-test-cpu-train.in -o docker/test-cpu-train.lock
else
  echo "note: no torch CPU wheel in $wheels (TORCH_CPU_WHEELS): docker/test-cpu-train.lock left as it is" >&2
fi
compile --python-version 3.10 --python-platform x86_64-manylinux_2_28 docker/requirements-test-cpu-wm.in -o docker/test-cpu-wm.lock
for f in build driver test-cpu-train test-cpu-wm; do
  echo "docker/$f.lock: $(grep -c '^[a-zA-Z]' "docker/$f.lock") packages"
done
