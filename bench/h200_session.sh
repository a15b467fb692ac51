#!/usr/bin/env bash
# The GPU measurements of bench/RESULTS.md, as run on the lent H200 machine (Python 3.12,
# torch present, no package index). Carried: the working tree, .offline/py312 (made by
# `make offline-bundle PYTHON_VERSION=3.12 OUT=.offline/py312`) and .gl (EGL loader debs).
#   bash bench/h200_session.sh sim      # bundle install, throughput, expert 10x50, demos; starts SFT
#   bash bench/h200_session.sh policy   # waits for SFT, evaluates the policy 10x50 (ODE sampler),
#                                       # then with the flow-SDE at T=1.6 (the original's evaluation)
#   bash bench/h200_session.sh learn    # only demos and SFT (a fresh machine); DEMO_ARGS="--action-noise 0.2"
#                                       # for DART demonstrations
#                                       # (SDE=0: ODE only; the wm phase can run the SDE with SDE_BG=1)
#   bash bench/h200_session.sh wm       # world models: speed benchmark, then a real update on the
#                                       # demonstrations (manifest, both views on the one GPU,
#                                       # reward model, pair, fidelity); also carry .offline/wm312
#                                       # (bash bench/make_wm_wheels.sh: DeepSpeed wheels); a call
#                                       # that runs out of time is continued by running it again.
#                                       # Knobs: WM_BENCH=0 (no speed benchmark), NO_SIM=1, WM_EPISODES,
#                                       # WM_STEPS, WM_MINUTES (time limit), WM_MICRO, WM_ACCUM,
#                                       # WM_GPUS_MAIN / WM_GPUS_WRIST, WM_ONLY_UPDATE=1
#   bash bench/h200_session.sh bimanual # Stage 0 and Stage 1 on a carried ALOHA bundle, then the
#                                       # held-out next-chunk PSNR against copying the last frame
# The phases run as consecutive calls on one warm machine. Results are copied to $OUT (the
# device tool brings that folder back), episode logs every 10 s, so a cut-off call still
# returns what it finished. The device tool brings back only a few files: point OUT at a
# scratch folder and tar it into the tool's $OUT at the end (bench/RESULTS.md's calls do).
set -euo pipefail
phase="${1:?sim|learn|policy|wm|bimanual}"
OUT="${OUT:-runs/h200/out}"
RUN=runs/h200
mkdir -p "$OUT" "$RUN"
export MUJOCO_GL=egl PYTHONUNBUFFERED=1 TQDM_DISABLE=1
if [ "$phase" != bimanual ]; then  # the LIBERO side: EGL loader and the offline bundle
  for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
  [ -d /tmp/sim/robosuite ] || python3 python/offline_bundle.py install --bundle .offline/py312 --target /tmp/sim --no-check
fi
export PYTHONPATH=/tmp/sim:$PWD/python
W=$(nproc)
t() { local s=$EPOCHREALTIME; "$@"; echo "[time] $(python3 -c "print(round($EPOCHREALTIME - $s, 1))") s: $*" | tee -a "$OUT/times.txt"; }
# Copy a growing file to $OUT every 10 s while the rest of the phase runs.
# The loops must not hold this script's stdout (a reader would wait for them) and end with it.
MIRRORS=()
mirror() { ( while true; do [ -f "$1" ] && cp "$1" "$OUT/$2"; sleep 10; done ) >/dev/null 2>&1 & MIRRORS+=($!); }
trap '[ ${#MIRRORS[@]} -eq 0 ] || kill "${MIRRORS[@]}" 2>/dev/null; cp "$RUN"/logs/*.out "$OUT/" 2>/dev/null || true' EXIT
exec 2> >(tee -a "$OUT/stderr.txt" >&2)  # errors come back even when the call is cut off
newest() { python3 -c "import json; print(json.load(open('$RUN/latest_policy.json'))['step'])"; }

case "$phase" in
sim|learn)
  { nvidia-smi -L; echo "cores: $W"; python3 -c "import mujoco, robosuite, torch; print('mujoco', mujoco.__version__, 'robosuite', robosuite.__version__, 'torch', torch.__version__)"; } | tee "$OUT/machine.txt"
  # Throughput and the expert first, on an otherwise idle host; SFT starts after the demos.
  [ "$phase" = learn ] || t python3 bench/sim_throughput.py --workers "$W" --sizes 128,256 --steps 480 --json "$OUT/throughput.json"
  if [ "$phase" = sim ]; then
    t python3 python/evaluate.py --policy expert --workers "$W" --out "$RUN/eval_expert" --no-progress | tee "$OUT/eval_expert.txt"
    cp "$RUN/eval_expert/results.json" "$OUT/eval_expert.json"
  fi
  t python3 python/collect_demos.py --workers "$W" --out "$RUN/demos" --no-progress ${DEMO_ARGS:-} > "$OUT/demos.json"
  # SFT in its own session, so it outlives this command (the next phase waits for it).
  setsid nohup python3 python/sft.py --run "$RUN" --data "$RUN/demos" --steps "${SFT_STEPS:-4000}" \
      --no-progress --no-tensorboard > "$RUN/sft.log" 2>&1 < /dev/null &
  sleep 20; tail -3 "$RUN/sft.log" || true
  ;;
policy)
  mirror "$RUN/logs/sft.jsonl" sft.jsonl
  while pgrep -f python/sft.py >/dev/null; do sleep 3; done
  tail -20 "$RUN/sft.log" | tee "$OUT/sft_tail.txt"
  cp "$RUN/logs/sft.jsonl" "$OUT/"
  step=$(newest)
  ev=$RUN/evidence/evaluations/global_step_$step.json
  mirror "$RUN/eval_ode/episodes.jsonl" episodes_ode.jsonl
  t python3 python/evaluate.py --policy checkpoint --run "$RUN" --ckpt "$step" --workers "$W" --no-progress \
      --sampler ode --out "$RUN/eval_ode" --videos 2 | tee "$OUT/eval_ode.txt"
  cp "$ev" "$OUT/eval_ode.json"
  mkdir -p "$OUT/videos" && cp "$RUN"/eval_ode/videos/* "$OUT/videos/" 2>/dev/null || true  # GIFs without imageio-ffmpeg
  [ "${SDE:-1}" = 1 ] || exit 0  # SDE=0: the flow-SDE evaluation runs in the wm phase instead
  mirror "$RUN/eval_sde/episodes.jsonl" episodes_sde.jsonl
  t python3 python/evaluate.py --policy checkpoint --run "$RUN" --ckpt "$step" --workers "$W" --no-progress \
      --sampler sde --temperature 1.6 --out "$RUN/eval_sde" --overwrite | tee "$OUT/eval_sde.txt"
  cp "$ev" "$OUT/eval_sde.json"
  ;;
wm)
  [ -d /tmp/wm/deepspeed ] || pip install -q --no-index --no-deps --target /tmp/wm .offline/wm312/*.whl
  export PYTHONPATH=/tmp/sim:/tmp/wm:$PWD/python
  # NO_SIM=1: no simulator comparison (the host is busy; compare with RESULTS.md's figure instead)
  if [ "${NO_SIM:-0}" = 1 ]; then SIM=(); else
    [ -f "$OUT/throughput.json" ] || t python3 bench/sim_throughput.py --workers "$W" --sizes 128 --steps 480 --json "$OUT/throughput.json"
    SIM=(--sim-json "$OUT/throughput.json"); fi
  # WM_BENCH=0: the update alone (the speed figures are already in RESULTS.md)
  if [ "${WM_BENCH:-1}" = 1 ]; then
    [ -f "$RUN/wm_throughput.json" ] || t python3 bench/wm_throughput.py "${SIM[@]}" --json "$RUN/wm_throughput.json"
    cp "$RUN/wm_throughput.json" "$OUT/"
  fi
  if [ "${SDE_BG:-0}" = 1 ] && [ -f "$RUN/latest_policy.json" ]; then
    # the policy's flow-SDE evaluation (T=1.6) on half the cores, alongside the world-model
    # update below (whose wall times are then not those of an idle host)
    mirror "$RUN/eval_sde/episodes.jsonl" episodes_sde.jsonl
    python3 python/evaluate.py --policy checkpoint --run "$RUN" --ckpt "$(newest)" --workers $((W / 2)) --no-progress \
        --sampler sde --temperature 1.6 --out "$RUN/eval_sde" --overwrite > "$OUT/eval_sde.txt" 2>&1 &
    SDE_PID=$!
  fi
  # the world models read the cameras at chunk boundaries only (--frame-interval 0 records just those)
  [ -d "$RUN/demos" ] && ls "$RUN"/demos/*.hdf5 >/dev/null 2>&1 || \
    t python3 python/collect_demos.py --workers "$W" --out "$RUN/demos" --episodes "${WM_EPISODES:-20}" \
      --frame-interval 0 --no-progress > "$OUT/demos.json"
  # a cut-off call is continued by running this phase again: the manifest is kept (a new one
  # would not resume) and the update resumes from its last save
  [ -f "$RUN/manifest.json" ] || t python3 python/make_manifest.py --run "$RUN" --replay "$RUN/demos" | tee "$OUT/manifest.txt"
  mirror "$RUN/logs/wm_main.jsonl" wm_main.jsonl; mirror "$RUN/logs/wm_wrist.jsonl" wm_wrist.jsonl
  # the reward model learns from real frames only: it trains alongside the world models
  [ "${WM_ONLY_UPDATE:-0}" = 1 ] || [ -f "$RUN/worldmodels/reward/config.json" ] || \
    { t python3 python/wm_reward.py --run "$RUN" --no-progress > "$OUT/wm_reward.txt" 2>&1 & REWARD_PID=$!; }
  # both views share the one GPU by default: ~0.5 s per update of 16 x 4 samples each (measured);
  # on two GPUs: WM_GPUS_MAIN=0 WM_GPUS_WRIST=1. WM_MINUTES: a time limit for the update (then
  # both stop by the seed's rule and are packaged); WM_ONLY_UPDATE=1: nothing after the update
  WM_GPUS_MAIN=${WM_GPUS_MAIN:-0} WM_GPUS_WRIST=${WM_GPUS_WRIST:-0} t python3 python/wm_update.py --run "$RUN" --steps "${WM_STEPS:-400}" \
      --micro-batch "${WM_MICRO:-16}" --grad-accum "${WM_ACCUM:-4}" --save-interval 100 --no-progress \
      ${WM_MINUTES:+--max-minutes "$WM_MINUTES"} | tee "$OUT/wm_update.txt"
  [ "${WM_ONLY_UPDATE:-0}" = 0 ] || exit 0
  [ -z "${REWARD_PID:-}" ] || wait "$REWARD_PID"
  t python3 python/package_pair.py --run "$RUN" --overwrite | tee "$OUT/package.txt"
  t python3 python/wm_eval.py --run "$RUN" --videos 4 | tee "$OUT/wm_eval.txt"
  cp "$RUN/model_pair/fidelity.json" "$RUN/model_pair/pair.json" "$RUN/train/selected_world_models.json" "$OUT/"
  cp "$RUN"/model_pair/videos/* "$OUT/" 2>/dev/null || true
  if [ -n "${SDE_PID:-}" ]; then wait "$SDE_PID" || true; cp "$RUN"/evidence/evaluations/*.json "$OUT/" || true; fi
  ;;
bimanual)
  # Stage 0 then Stage 1 on an ALOHA bundle made beforehand on any machine
  # (`make bimanual-bundle RUN=r && cp -r r/bimanual/bundle .offline/aloha_bundle`), carried
  # with .offline/wm312; reference budgets are 35,000 / 8,000 iterations, these runs are short.
  # Rerunning the phase resumes both stages.
  [ -d /tmp/wm/deepspeed ] || pip install -q --no-index --no-deps --target /tmp/wm .offline/wm312/*.whl
  export PYTHONPATH=/tmp/wm:$PWD/python
  B=${BIM_BUNDLE:-.offline/aloha_bundle} I0=${BIM_ITERS0:-2000} I1=${BIM_ITERS1:-1000}
  export BIMANUAL_BUNDLE=$B BIMANUAL_OUTPUT_ROOT=$RUN/bimanual
  t python3 python/bimanual.py validate "$B" --no-preview > "$OUT/bimanual_validate.json"
  mirror "$RUN/bimanual/bimanual_stage0/log.jsonl" stage0.jsonl
  t python3 python/bimanual.py train --stage 0 --config data/configs/stage0_bidir.toml --no-progress \
      trainer.max_iter="$I0" checkpoint.save_iter=500 | tee "$OUT/stage0.txt"
  root0=$RUN/bimanual/bimanual_stage0/checkpoints/iter_$(printf %09d "$I0")
  mirror "$RUN/bimanual/bimanual_stage1/log.jsonl" stage1.jsonl
  t python3 python/bimanual.py train --stage 1 --config data/configs/stage1_tf.toml --no-progress \
      checkpoint.load_path="$root0" trainer.max_iter="$I1" checkpoint.save_iter=500 | tee "$OUT/stage1.txt"
  root1=$RUN/bimanual/bimanual_stage1/checkpoints/iter_$(printf %09d "$I1")
  t python3 python/bimanual.py evaluate --config data/configs/stage1_tf.toml --checkpoint "$root1" \
      checkpoint.load_path="$root0" --out "$OUT/stage1_eval.json" | tee "$OUT/stage1_eval.txt"
  ;;
*) echo "unknown phase $phase: sim, learn, policy, wm or bimanual" >&2; exit 2 ;;
esac
