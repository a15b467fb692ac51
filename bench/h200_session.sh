#!/usr/bin/env bash
# The GPU measurements of bench/RESULTS.md, as run on the lent H200 machine (Python 3.12,
# torch present, no package index). Carried: the working tree, .offline/py312 (made by
# `make offline-bundle PYTHON_VERSION=3.12 OUT=.offline/py312`) and .gl (EGL loader debs).
#   bash bench/h200_session.sh sim      # bundle install, throughput, expert 10x50, demos, start SFT
#   bash bench/h200_session.sh policy   # wait for SFT, evaluate the policy 10x50
# Results are copied to $OUT (the device tool brings that folder back).
set -euo pipefail
phase="${1:?sim|policy}"
OUT="${OUT:-runs/h200/out}"
RUN=runs/h200
mkdir -p "$OUT" "$RUN"
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export MUJOCO_GL=egl PYTHONUNBUFFERED=1 TQDM_DISABLE=1
[ -d /tmp/sim/robosuite ] || python3 python/offline_bundle.py install --bundle .offline/py312 --target /tmp/sim --no-check
export PYTHONPATH=/tmp/sim:$PWD/python
W=$(nproc)
t() { local s=$EPOCHREALTIME; "$@"; echo "[time] $(python3 -c "print(round($EPOCHREALTIME - $s, 1))") s: $*" | tee -a "$OUT/times.txt"; }

if [ "$phase" = sim ]; then
  nvidia-smi -L | tee "$OUT/machine.txt"; nproc >> "$OUT/machine.txt"
  t python3 python/collect_demos.py --workers "$W" --out "$RUN/demos" --no-progress > "$OUT/demos.json" || true
  # SFT on the GPU in the background (its own session, so it outlives this command).
  setsid nohup python3 python/sft.py --run "$RUN" --data "$RUN/demos" --steps "${SFT_STEPS:-4000}" \
      --no-progress --no-tensorboard > "$RUN/sft.log" 2>&1 < /dev/null &
  t python3 bench/sim_throughput.py --workers "$W" --sizes 128,256 --steps 480 --json "$OUT/throughput.json"
  t python3 python/evaluate.py --policy expert --workers "$W" --out "$RUN/eval_expert" --no-progress | tee "$OUT/eval_expert.txt"
  cp "$RUN/eval_expert/results.json" "$OUT/eval_expert.json"
  tail -5 "$RUN/sft.log" || true
else
  while pgrep -f python/sft.py >/dev/null; do sleep 5; done
  tail -20 "$RUN/sft.log" | tee "$OUT/sft_tail.txt"
  cp "$RUN/logs/sft.jsonl" "$OUT/" || true
  step=$(python3 -c "import json; print(json.load(open('$RUN/latest_policy.json'))['step'])" 2>/dev/null || ls "$RUN/weights/policy" | sed 's/global_step_//' | sort -n | tail -1)
  t python3 python/evaluate.py --policy checkpoint --run "$RUN" --ckpt "$step" --workers "$W" --no-progress \
      ${EVAL_ARGS:-} | tee "$OUT/eval_policy.txt"
  cp "$RUN/evidence/evaluations/global_step_${step}.json" "$OUT/eval_policy.json" || true
fi
