#!/usr/bin/env bash
# Run pytest on the given paths (default: tests; options such as -x or -k EXPR pass through),
# each in the environment it belongs to:
# tests/worldmodel in .venv/wm (Python 3.10), everything else in .venv/train (Python 3.11).
#
# A whole-suite run gives every test folder its own pytest process. MuJoCo's software
# renderer (OSMesa, llvmpipe) and Triton each load their own LLVM; a process that rendered
# and then imports Triton (torch does, when it builds an optimizer) crashes. The kit never
# does both in one process (simulators live in worker processes), and neither do the tests.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
WM_DIRS=(tests/worldmodel)
# DeepSpeed picks its accelerator at import; without a GPU it must be told to use the CPU.
command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 || export DS_ACCELERATOR="${DS_ACCELERATOR:-cpu}"

is_wm() { local d; for d in "${WM_DIRS[@]}"; do [[ "$1" == "$d"* ]] && return 0; done; return 1; }

# Options (-x, -k EXPR, ...) go to every group's pytest; everything else is a test path.
opts=(); targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    -k|-m) opts+=("$1" "$2"); shift 2 ;;
    -*) opts+=("$1"); shift ;;
    *) targets+=("$1"); shift ;;
  esac
done
[ ${#targets[@]} -gt 0 ] || targets=(tests)

groups=()
for p in "${targets[@]}"; do
  p="${p%/}"
  if [ "$p" = tests ]; then
    for d in tests/*/; do
      d="${d%/}"; [ "$(basename "$d")" = __pycache__ ] || groups+=("$d")
    done
    top=(tests/test_*.py); [ -e "${top[0]}" ] && groups+=("${top[*]}")
  else
    groups+=("$p")
  fi
done

status=0; failed=()
for g in "${groups[@]}"; do
  # shellcheck disable=SC2206
  paths=($g)
  if is_wm "${paths[0]}"; then py=.venv/wm/bin/python; env=wm; else py=.venv/train/bin/python; env=train; fi
  echo "== $env: ${paths[*]}"
  "$py" -m pytest -q ${opts[@]+"${opts[@]}"} "${paths[@]}"
  rc=$?
  if [ $rc -ne 0 ] && [ $rc -ne 5 ]; then status=1; failed+=("${paths[*]}"); fi  # 5: nothing collected
done
if [ $status -ne 0 ]; then echo "FAILED groups: ${failed[*]}"; else echo "all test groups passed"; fi
exit $status
