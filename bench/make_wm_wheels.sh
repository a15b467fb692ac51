#!/usr/bin/env bash
# DeepSpeed and its pure-Python needs as wheels for a GPU server with torch but no package
# index (the H200 host: Python 3.12). Carried with the run as .offline/wm312 (~6 MB) and
# installed there by `bench/prepare_gpu.sh` (called by `bench/gpu.py`) with pip --no-index --target.
#   bash bench/make_wm_wheels.sh [OUT=.offline/wm312] [PYTHON_VERSION=3.12]
set -euo pipefail
out="${1:-.offline/wm312}"; py="${PYTHON_VERSION:-3.12}"
# DeepSpeed's wheel is built with the kit's world-model Python: without it, stop before anything
# is written (a folder of wheels without DeepSpeed once travelled to a GPU machine and failed there)
[ -x .venv/wm/bin/python ] || { echo "error: .venv/wm is missing: make .venv/wm/.lock.sha256 first" >&2; exit 2; }
tmp="$out.partial"; rm -rf "$tmp"; mkdir -p "$tmp"
ver() { sed -n "s/^$1==\([^ ]*\).*/\1/p" docker/wm.lock; }  # the versions of the wm lock
python3 -m pip download --only-binary=:all: --python-version "$py" --implementation cp --no-deps \
  --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 -d "$tmp" \
  "hjson==$(ver hjson)" "py-cpuinfo==$(ver py-cpuinfo)" "msgpack==$(ver msgpack)" "ninja==$(ver ninja)" \
  "einops==$(ver einops)" "pydantic==$(ver pydantic)" "pydantic-core==$(ver pydantic-core)" \
  "annotated-types==$(ver annotated-types)" "typing-inspection==$(ver typing-inspection)"
# DeepSpeed is an sdist on PyPI; with DS_BUILD_OPS=0 it builds into a pure-Python wheel.
src=$(mktemp -d)
python3 -m pip download --no-deps --no-binary :all: "deepspeed==$(ver deepspeed)" -d "$src"
DS_BUILD_OPS=0 UV_NATIVE_TLS=1 .venv/tools/bin/uv build --wheel --python .venv/wm/bin/python "$src"/deepspeed-*.tar.gz -o "$tmp"
rm -rf "$src"
ls "$tmp"/deepspeed-*.whl >/dev/null  # complete: only now does it replace the old folder
rm -rf "$out"; mv "$tmp" "$out"
ls -la "$out"
