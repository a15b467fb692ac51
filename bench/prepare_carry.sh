#!/usr/bin/env bash
# What a lent GPU machine's calls carry with the tree (bench/gpu.py's docstring), rebuilt in a
# checkout that has none of it (these folders are ignored by git and do not outlive a checkout):
#   .offline/policy/sft4000_run12.tar.xz  the supervised policy of run 12 (demonstrations at rest), from git history
#   .offline/policy/sft4000_run17.tar.xz  the supervised policy of run 17 (the default, jittered starts), from git history
#   .offline/policy/sft4000_run21.tar.xz  the supervised policy of run 21 (the whole recipe in the pinned mujoco 2.3.7), from git history
#   .offline/state/grpo_run21_seed0_step3_state_delta.tar.xz  GRPO from run 21 at step 3, to resume (a delta against it)
#   .offline/py312                        the simulator side for the GPU host's Python 3.12
#   .offline/wm312                        DeepSpeed wheels for its world-model phases
#   .offline/mujoco237                    the pinned mujoco's sources (bench/mujoco_wheel.sh) and its wheel built for
#                                         Python 3.12 on this CPU machine, from git history (installed there without a build)
#   .gl/*.deb                             the EGL/Vulkan loaders MuJoCo renders through there
# Idempotent: what is present is kept (the policy pack's SHA-256 is checked either way).
#   bash bench/prepare_carry.sh
set -euo pipefail
cd "$(dirname "$0")/.."
for p in /.gl/ /.offline/; do  # never committed (they would travel with every call and exceed its 64 MiB)
  grep -qxF "$p" .git/info/exclude 2>/dev/null || echo "$p" >> .git/info/exclude
done

make --no-print-directory .venv/train/.lock.sha256 .venv/wm/.lock.sha256 >/dev/null
[ -f .offline/py312/MANIFEST.json ] || make --no-print-directory offline-bundle PYTHON_VERSION=3.12 OUT=.offline/py312
ls .offline/wm312/deepspeed-*.whl >/dev/null 2>&1 || bash bench/make_wm_wheels.sh .offline/wm312
[ -f .offline/mujoco237/mujoco-2.3.7.tar.gz ] || PATH="$PWD/.venv/tools/bin:$PATH" bash bench/mujoco_wheel.sh fetch .offline/mujoco237

# folder under .offline, file, commit that holds bench/packs/<file>, its SHA-256 (bench/RESULTS.md
# "Run 12" / "Run 17" / "Run 21"; state: a GRPO run's full state to resume, a delta; the wheel:
# bench/mujoco_wheel.sh's build for the GPU host's Python 3.12, which bench/prepare_gpu.sh tries before
# building one there). After the fetch above, which replaces .offline/mujoco237 whole.
while read -r dir file commit sha; do
  path=.offline/$dir/$file
  if [ ! -f "$path" ]; then
    mkdir -p ".offline/$dir"
    git show "$commit:bench/packs/$file" > "$path.tmp" && mv "$path.tmp" "$path"
  fi
  echo "$sha  $path" | sha256sum -c --quiet || { echo "error: $path is not the file kept in $commit: delete it and rerun" >&2; exit 2; }
done <<'PACKS'
policy sft4000_run12.tar.xz 9352d953 e702c253518abaf499119befa5486ce9c6ef619d6adf9ca2b3c94d419a669ae7
policy sft4000_run17.tar.xz 7ba21dfb 6ce1054c485409807b28fedd392db381e439814b6b174269467242f11cf02a02
policy sft4000_run21.tar.xz 40957923 f0380c696cd00d8d9082bb31ae2a6e975880b362220c17eacbec405ec60f9104
state grpo_run21_seed0_step3_state_delta.tar.xz 3c664dd6 edb8e42c698c011a86db045934edc26cad681ba7df8428b752cd0d6a5f23479c
mujoco237 mujoco-2.3.7-cp312-cp312-linux_x86_64.whl 6fc06cf5 2360bda15d8f5acf7ece066d2f18a4a09cae45e533dd9f8524b795d62cb30afe
PACKS

if ! ls .gl/libegl1_*.deb >/dev/null 2>&1; then  # Debian's loaders, as the device README says (any host arch)
  mkdir -p .gl /tmp/amd64/partial
  o=(-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64)
  apt-get "${o[@]}" update -qq
  (cd .gl && apt-get "${o[@]}" download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2)
fi
du -sh .offline/* .gl
