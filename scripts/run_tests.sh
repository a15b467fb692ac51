#!/usr/bin/env bash
# Run pytest on the given paths, each in the environment it belongs to: tests/worldmodel
# (and later world-model folders) in .venv/wm (Python 3.10), everything else in .venv/train.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
WM_DIRS=(tests/worldmodel)
paths=("${@:-tests}")
train_args=(); wm_args=()
for p in "${paths[@]}"; do
  is_wm=0
  for d in "${WM_DIRS[@]}"; do [[ "$p" == "$d"* ]] && is_wm=1; done
  if [ $is_wm = 1 ]; then wm_args+=("$p"); else train_args+=("$p"); fi
done
# A whole-suite run (tests/) covers both environments.
if [[ " ${train_args[*]-} " == *" tests "* || " ${train_args[*]-} " == *" tests/ "* ]]; then
  for d in "${WM_DIRS[@]}"; do [ -d "$d" ] && wm_args+=("$d"); done
  ignore=(); for d in "${WM_DIRS[@]}"; do ignore+=(--ignore="$d"); done
else
  ignore=()
fi
# DeepSpeed picks its accelerator at import; without a GPU it must be told to use the CPU.
command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 || export DS_ACCELERATOR="${DS_ACCELERATOR:-cpu}"
status=0
if [ ${#train_args[@]} -gt 0 ]; then
  echo "== tests in .venv/train (Python 3.11): ${train_args[*]}"
  .venv/train/bin/python -m pytest "${train_args[@]}" "${ignore[@]}" || status=1
fi
if [ ${#wm_args[@]} -gt 0 ]; then
  echo "== tests in .venv/wm (Python 3.10): ${wm_args[*]}"
  .venv/wm/bin/python -m pytest "${wm_args[@]}" || status=1
fi
exit $status
