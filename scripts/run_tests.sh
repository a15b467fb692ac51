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

# Groups run side by side, TEST_JOBS at a time (default: one per CPU core): a group alone keeps
# about one core busy (simulator workers wait on the policy, pytest waits on subprocesses), so
# two at once on two cores take about half the wall time. Each group's output is printed whole
# when it ends; the slowest groups start first so that the short ones fill in behind them.
jobs="${TEST_JOBS:-$(nproc 2>/dev/null || echo 1)}"
[[ "$jobs" =~ ^[1-9][0-9]*$ ]] || { echo "error: TEST_JOBS must be a whole number >= 1 (got '$jobs')"; exit 2; }
[ "$jobs" -le ${#groups[@]} ] || jobs=${#groups[@]}
# Torch's own threads: one share of the cores per group, so that groups side by side do not
# oversubscribe them (an explicit OMP_NUM_THREADS is kept).
threads=$(( $(nproc 2>/dev/null || echo 1) / jobs )); [ "$threads" -ge 1 ] || threads=1
slow_first=(tests/rl tests/worldmodel tests/sim tests/evaluation tests/offline tests/containers tests/policy)
ordered=()
for s in "${slow_first[@]}"; do for g in "${groups[@]}"; do [ "$g" = "$s" ] && ordered+=("$g"); done; done
for g in "${groups[@]}"; do
  known=0; for s in "${slow_first[@]}"; do [ "$g" = "$s" ] && known=1; done
  [ $known = 1 ] || ordered+=("$g")
done

logs="$(mktemp -d)"
trap 'rm -rf "$logs"; kill $(jobs -p) 2>/dev/null' EXIT
declare -A name_of=() start_of=()
status=0; failed=(); running=0; n=0; started=$SECONDS

run_group() {  # one group's pytest in the environment it belongs to (its header first);
  # a second argument "exec": pytest replaces the background shell (a kill then reaches it)
  local paths env py
  # shellcheck disable=SC2206
  paths=($1)
  if is_wm "${paths[0]}"; then py=.venv/wm/bin/python; env=wm; else py=.venv/train/bin/python; env=train; fi
  echo "== $env: ${paths[*]}"
  OMP_NUM_THREADS="${OMP_NUM_THREADS:-$threads}" ${2:-} "$py" -m pytest -q ${opts[@]+"${opts[@]}"} "${paths[@]}"
}
record() {  # record a group's exit status (5: nothing collected)
  if [ "$1" -ne 0 ] && [ "$1" -ne 5 ]; then status=1; failed+=("$2"); fi
}

pending=()  # pids still running, oldest first
finish_one() {  # wait for a group to end, print its output, record its result
  local pid rc rest=() p
  if (( BASH_VERSINFO[0] * 100 + BASH_VERSINFO[1] >= 501 )); then
    wait -n -p pid "${pending[@]}"; rc=$?  # whichever ends first
  else
    pid="${pending[0]}"; wait "$pid"; rc=$?  # bash < 5.1: oldest first
  fi
  for p in "${pending[@]}"; do [ "$p" = "$pid" ] || rest+=("$p"); done
  pending=(${rest[@]+"${rest[@]}"}); running=$((running - 1))
  cat "$logs/$pid.log"
  echo "   (${name_of[$pid]}: $(( $(date +%s) - start_of[$pid] )) s)"
  record $rc "${name_of[$pid]}"
}

for g in "${ordered[@]}"; do
  if [ "$jobs" -eq 1 ]; then  # one at a time: each group's output streams as it runs
    run_group "$g"; record $? "$g"
    continue
  fi
  [ $running -lt "$jobs" ] || finish_one
  echo "-- started $g"
  n=$((n + 1))
  run_group "$g" exec > "$logs/$n.log" 2>&1 &
  pid=$!; ln -s "$n.log" "$logs/$pid.log"
  name_of[$pid]="$g"; start_of[$pid]=$(date +%s); pending+=("$pid"); running=$((running + 1))
done
while [ $running -gt 0 ]; do finish_one; done
echo "test groups took $(( SECONDS - started )) s, $jobs at a time (TEST_JOBS=N to change)"
if [ $status -ne 0 ]; then echo "FAILED groups: ${failed[*]}"; else echo "all test groups passed"; fi
exit $status
