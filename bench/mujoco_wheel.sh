#!/usr/bin/env bash
# The pinned simulator (mujoco 2.3.7) for a Python that PyPI has no 2.3.7 wheel for (the lent GPU
# machine's 3.12): the same libmujoco.so.2.3.7 as the official wheels, with its Python bindings
# compiled for that Python. The physics is that library's, so it is the pin's, bit for bit; only the
# pybind11 glue is rebuilt (under NumPy 2.5 robosuite's controller rounds differently, 3e-16 after one
# chunk: bench/RESULTS.md, "Run 20"). Two steps:
#
#   bash bench/mujoco_wheel.sh fetch [OUT=.offline/mujoco237]
#       here (PyPI and Debian reachable): the 2.3.7 sdist (the bindings' sources), the official cp311
#       wheel (library, headers, Python files), pybind11's sdist and Abseil and Eigen from Debian's
#       archive (~9.5 MB), each checked against the checksum below
#   bash bench/mujoco_wheel.sh build SRC [WHEEL_DIR=SRC/wheels]   (PYTHON=python3: the target Python)
#       on the machine of the target Python (needs cmake, a C++17 compiler, the Python headers and the
#       `wheel` package): writes mujoco-2.3.7-cpXY-cpXY-linux_x86_64.whl (3.8 minutes on 2 cores here,
#       292 s with the install on the lent H100 host). The lent machine's cp312 wheel is built here, with
#       pyenv's 3.12.1 (PYTHON=~/.pyenv/versions/3.12.1/bin/python3; glibc 2.34 and GLIBCXX 3.4.29 at
#       least), and kept in git history (bench/prepare_carry.sh restores it; bench/prepare_gpu.sh builds
#       one there only where it does not load)
#
# The interactive viewer (mujoco.viewer, module _simulate) is left out: it needs GLFW and lodepng
# sources, and the kit renders offscreen only. Abseil and Eigen are Debian's releases (20220623.1,
# 3.4.0), not the commits the 2.3.7 sources name (20230125.3, an Eigen master commit): the bindings use
# only flat_hash_map, span and Eigen's maps, which both provide. pybind11 is 2.13.6, not 2.11.1: the
# first releases that read NumPy 2's arrays are 2.12 on (the lent machine has NumPy 2.5).
set -euo pipefail
cd "$(dirname "$0")/.."
mode="${1:-}"

# name  url  sha256
SOURCES="
mujoco-2.3.7.tar.gz pypi:mujoco==2.3.7:sdist 422041f1ce37c6d151fbced1048df626837e94fe3cd9f813585907046336a7d0
mujoco-2.3.7-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl pypi:mujoco==2.3.7:cp311 426af8965f8636d94a0f75740c3024a62b3e585020ee817ef5208ec844a1ad94
pybind11-2.13.6.tar.gz pypi:pybind11==2.13.6:sdist ba6af10348c12b24e92fa086b39cfba0eff619b61ac77c406167d813b096d39a
abseil_20220623.1.orig.tar.gz http://deb.debian.org/debian/pool/main/a/abseil/abseil_20220623.1.orig.tar.gz abfe2897f3a30edaa74bc34365afe3c2a3cd012091a97dc7e008f7016adcd5fe
eigen3_3.4.0.orig.tar.bz2 http://deb.debian.org/debian/pool/main/e/eigen3/eigen3_3.4.0.orig.tar.bz2 b4c198460eba6f28d34894e3a5710998818515104d6e74e5cc331ce31e46e626
"

fetch() {
  local out="${1:-.offline/mujoco237}" tmp
  tmp="$out.partial"; rm -rf "$tmp"; mkdir -p "$tmp"
  while read -r name url sha; do
    [ -n "$name" ] || continue
    case "$url" in
      pypi:*:sdist) python3 -m pip download -q --no-deps --no-binary :all: -d "$tmp" "$(cut -d: -f2 <<<"$url")" ;;
      pypi:*:cp311) python3 -m pip download -q --no-deps --only-binary :all: --python-version 3.11 \
                      --implementation cp --platform manylinux2014_x86_64 -d "$tmp" "$(cut -d: -f2 <<<"$url")" ;;
      *) curl -fsSL -o "$tmp/$name" "$url" ;;
    esac
    echo "$sha  $name" | (cd "$tmp" && sha256sum -c --quiet -) \
      || { echo "error: $name does not match its checksum in bench/mujoco_wheel.sh: not used" >&2; exit 2; }
  done <<<"$SOURCES"
  rm -rf "$out"; mv "$tmp" "$out"   # complete: only now does it replace an older folder
  ls -la "$out"
}

build() {
  local src="${1:?usage: bash bench/mujoco_wheel.sh build SRC [WHEEL_DIR]}" py="${PYTHON:-python3}" work
  local wheel_dir="${2:-$src/wheels}"
  [ -d "$src" ] || { echo "error: no folder $src: run 'bash bench/mujoco_wheel.sh fetch $src' where PyPI is reachable, and carry it" >&2; exit 2; }
  src="$(cd "$src" && pwd)"; mkdir -p "$wheel_dir"; wheel_dir="$(cd "$wheel_dir" && pwd)"
  # Everything the build needs, checked before anything is unpacked or compiled.
  while read -r name _ sha; do
    [ -n "$name" ] || continue
    echo "$sha  $name" | (cd "$src" && sha256sum -c --quiet -) \
      || { echo "error: $src/$name is missing or changed: run 'bash bench/mujoco_wheel.sh fetch $src' where PyPI is reachable" >&2; exit 2; }
  done <<<"$SOURCES"
  command -v cmake >/dev/null || { echo "error: no cmake on PATH (pip install cmake)" >&2; exit 2; }
  "$py" -c "import wheel" 2>/dev/null || { echo "error: $py has no 'wheel' package (pip install wheel)" >&2; exit 2; }
  local include; include=$("$py" -c "import sysconfig; print(sysconfig.get_paths()['include'])")
  [ -f "$include/Python.h" ] || { echo "error: no Python.h in $include: install $py's development headers" >&2; exit 2; }
  local tag; tag=$("$py" -c "import sys; print(f'cp{sys.version_info[0]}{sys.version_info[1]}')")

  work=$(mktemp -d); trap "rm -rf '$work'" EXIT   # expanded now: the function's locals are gone at exit
  tar -xzf "$src/mujoco-2.3.7.tar.gz" -C "$work"
  mkdir "$work/absl" "$work/eigen" "$work/pybind11"
  tar -xzf "$src/abseil_20220623.1.orig.tar.gz" -C "$work/absl" --strip-components=1
  tar -xjf "$src/eigen3_3.4.0.orig.tar.bz2" -C "$work/eigen" --strip-components=1
  tar -xzf "$src/pybind11-2.13.6.tar.gz" -C "$work/pybind11" --strip-components=1
  "$py" -m wheel unpack -d "$work/wheel" "$src"/mujoco-2.3.7-cp311-*.whl >/dev/null
  local pkg="$work/wheel/mujoco-2.3.7"
  mkdir "$work/lib"; ln -s "$pkg/mujoco/libmujoco.so.2.3.7" "$work/lib/libmujoco.so"

  # The bindings' CMake project without the viewer, and without -Werror (a newer compiler's new
  # warnings are not errors of this build).
  local cm="$work/mujoco-2.3.7/mujoco/CMakeLists.txt"
  "$py" - "$cm" <<'EOF'
import re, sys
path = sys.argv[1]
text = open(path).read()
text = text.replace("add_subdirectory(simulate)\n", "")
text = re.sub(r"mujoco_pybind11_module\(_simulate simulate\.cc\)\ntarget_link_libraries\(\n  _simulate\n.*?\)\n", "", text,
              count=1, flags=re.S)
text = text.replace("-Werror\n", "\n")
# pybind11 from its PyPI sdist, which carries its CMake package (not the repository's CMakeLists.txt)
text = text.replace("USE_SYSTEM_PACKAGE\n  OFF\n  PACKAGE_NAME\n  pybind11\n", "USE_SYSTEM_PACKAGE\n  ON\n  PACKAGE_NAME\n  pybind11\n")
assert "_simulate simulate.cc" not in text and "add_subdirectory(simulate)" not in text, "unexpected CMakeLists.txt"
assert "ON\n  PACKAGE_NAME\n  pybind11\n" in text, "unexpected CMakeLists.txt (pybind11)"
open(path, "w").write(text)
EOF
  # CMAKE_INTERPROCEDURAL_OPTIMIZATION=OFF keeps pybind11 from adding -flto: its serial link-time
  # step took most of the 8-33 minutes on two cores, and the bindings only marshal arguments into the
  # official libmujoco.so, which does the physics (bench/physics_fingerprint.py checks it stays bit for bit).
  cmake -S "$work/mujoco-2.3.7/mujoco" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_INTERPROCEDURAL_OPTIMIZATION=OFF \
    -DCMAKE_MODULE_PATH="$work/mujoco-2.3.7/cmake" -DPython3_EXECUTABLE="$(command -v "$py")" \
    -DMUJOCO_LIBRARY_DIR="$work/lib" -DMUJOCO_INCLUDE_DIR="$pkg/mujoco/include" -DBUILD_TESTING=OFF \
    -DFETCHCONTENT_FULLY_DISCONNECTED=ON -DFETCHCONTENT_SOURCE_DIR_ABSEIL-CPP="$work/absl" \
    -DFETCHCONTENT_SOURCE_DIR_EIGEN="$work/eigen" -Dpybind11_DIR="$work/pybind11/pybind11/share/cmake/pybind11" >"$work/cmake.log" \
    || { tail -30 "$work/cmake.log" >&2; exit 1; }
  # Some images' compilers carry a dangling libstdc++.so (seen on the lent GPU machine: /opt/gcc's
  # points at a libstdc++.so.6 that is not there, and every module's link failed): then link against
  # the system's libstdc++.so.6, the library the modules load at run time anyway. The compiler asked
  # is the one CMake chose (there: /opt/gcc's, while `c++` on PATH was the system's, whose link is whole).
  local cxx cxx_lib
  cxx=$(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' "$work/build/CMakeCache.txt")
  cxx_lib=$("${cxx:-c++}" -print-file-name=libstdc++.so 2>/dev/null || true)
  if [ -L "$cxx_lib" ] && [ ! -e "$cxx_lib" ]; then
    local system_lib; system_lib=$(ldconfig -p | awk '/libstdc\+\+\.so\.6 .*x86-64/ {print $NF; exit}')
    [ -n "$system_lib" ] || { echo "error: $cxx_lib is a dangling link and ldconfig knows no libstdc++.so.6: install libstdc++" >&2; exit 2; }
    mkdir -p "$work/stdcxx" && ln -sf "$system_lib" "$work/stdcxx/libstdc++.so"
    echo "note: $cxx ($cxx_lib) is a dangling link; linking against $system_lib" >&2
    local flags; flags="-L$work/stdcxx $(sed -n 's/^CMAKE_MODULE_LINKER_FLAGS:[A-Z]*=//p' "$work/build/CMakeCache.txt")"
    cmake -S "$work/mujoco-2.3.7/mujoco" -B "$work/build" -DCMAKE_MODULE_LINKER_FLAGS="$flags" -DCMAKE_SHARED_LINKER_FLAGS="$flags" >>"$work/cmake.log" \
      || { tail -30 "$work/cmake.log" >&2; exit 1; }
  fi
  local modules="_callbacks _constants _enums _errors _functions _render _rollout _structs"
  # shellcheck disable=SC2086
  cmake --build "$work/build" -j "$(nproc)" --target $modules

  # The official wheel's files with the new bindings in place of the cp311 ones.
  rm -f "$pkg"/mujoco/_*.cpython-311-*.so
  for m in $modules; do cp "$work/build/$m".cpython-*.so "$pkg/mujoco/"; done
  sed -i "s/^Tag: .*/Tag: $tag-$tag-linux_x86_64/" "$pkg/mujoco-2.3.7.dist-info/WHEEL"
  "$py" -m wheel pack -d "$wheel_dir" "$pkg"
  ls -la "$wheel_dir"/mujoco-2.3.7-"$tag"-*.whl
}

case "$mode" in
  fetch) fetch "${2:-}" ;;
  build) shift; build "$@" ;;
  *) echo "usage: bash bench/mujoco_wheel.sh fetch [OUT] | build SRC [WHEEL_DIR]" >&2; exit 2 ;;
esac
