# wmrl: every user-facing target. Thin: each calls a script in python/ or scripts/.
# Variables mean the same in every target (see README): RUN OUT PROFILE TASKS EPISODES
# TRIALS SEED DATA POLICY DRY_RUN TESTS WORKERS CKPT GPUS STEPS.
SHELL := /bin/bash
.DEFAULT_GOAL := help

RUN      ?= runs/default
PROFILE  ?= default
POLICY   ?= expert
TESTS    ?= tests
RUNTIME  ?= local

# ---- Where stages run: RUNTIME=local (the venvs of `make setup`) or RUNTIME=docker (the images) --
# Every stage is started through one of two variables, and that choice is also its image:
#   $(TRAIN_PY) ARGS   policy side, Python 3.11: simulator, demonstrations, policy, GRPO, evaluation
#   $(WM_PY) ARGS      world-model side, Python 3.10: world models, DeepSpeed
# Locally they are the venvs' python; with RUNTIME=docker they are
#   python -m wmrl.containers run --image train|wm -- ARGS
# (repository mounted at its own path, caller's uid, GPUS -> DeviceRequest; see
# python/wmrl/containers/run.py). A new target that calls $(TRAIN_PY)/$(WM_PY) and depends on
# `setup` works in both runtimes without further changes. Host-side targets (setup, lock, test,
# wheelhouse, build, offline-*) always run on the host (test and offline-bundle use the venvs).
DRIVER_PY      := .venv/driver/bin/python
CONTAINERS      = PYTHONPATH=python $(DRIVER_PY) -m wmrl.containers
DRIVER_PYTHON  ?= $(shell python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || echo 3.11)
ifeq ($(RUNTIME),docker)
TRAIN_PY := $(CONTAINERS) run --image train --
WM_PY    := $(CONTAINERS) run --image wm --
SETUP_ENVS := .venv/driver/.lock.sha256
else ifeq ($(RUNTIME),local)
TRAIN_PY := .venv/train/bin/python
WM_PY    := .venv/wm/bin/python
SETUP_ENVS := .venv/train/.lock.sha256 .venv/wm/.lock.sha256
else
$(error RUNTIME=$(RUNTIME): use RUNTIME=local (virtual environments) or RUNTIME=docker (the two images))
endif

# Optional flags, passed only when the variable is set; DRY_RUN=1 / OVERWRITE=1 become flags.
opt = $(if $(strip $(2)),$(1) $(2))
yes = $(filter 1 yes true,$(1))
DRY  = $(if $(call yes,$(DRY_RUN)),--dry-run)
OVER = $(if $(call yes,$(OVERWRITE)),--overwrite)
COMMON = --profile $(PROFILE) $(call opt,--tasks,$(TASKS)) $(call opt,--seed,$(SEED)) \
         $(call opt,--workers,$(WORKERS)) $(DRY) $(OVER)

# Test folders that need the world-model environment (Python 3.10, DeepSpeed).
WM_TEST_DIRS := tests/worldmodel

.PHONY: help setup lock demo test demos eval validate bench clean sft collect grpo cycle speedrun release restore check wheelhouse build images shell

help:
	@echo "make setup      both environments (.venv/train: Python 3.11, .venv/wm: Python 3.10)"
	@echo "make demo       the whole cycle at toy scale on CPU: demos -> SFT -> collect -> world models -> pair -> GRPO -> report"
	@echo "make test       the test suite, its groups side by side (TESTS=tests/sim for a subset, TEST_JOBS=1 one at a time)"
	@echo "make demos      scripted-expert demonstrations (TASKS EPISODES OUT)"
	@echo "make eval       real-simulator evaluation (POLICY=expert|random TRIALS TASKS OUT; CKPT=N [RUN SAMPLER=sde|ode TEMPERATURE]: a policy checkpoint)"
	@echo "make sft        supervised policy training on RUN/demos (DATA STEPS GPUS=0,1 SEED); rerun to resume"
	@echo "make collect    the current policy in the real simulator, success and failure kept (CKPT EPISODES TASKS EXTRA_TEMPERATURES)"
	@echo "make grpo       GRPO to TARGET=M (ENV=sim|wm, RESUME=N, PAIR=dir, FROM=run); rerun to resume"
	@echo "make release    RUN as a bundle with every file's SHA-256 (OUT, DATA=0); make restore BUNDLE=dir: verify, relocate"
	@echo "make speedrun   one GPU from nothing: demos -> SFT -> one cycle -> report (RUN=runs/speedrun, DRY_RUN=1)"
	@echo "make cycle      collect -> world models -> pair -> GRPO -> evaluation (CYCLES GRPO_STEPS EPISODES GPUS); rerun to resume"
	@echo "make validate   check trajectory files (DATA=file-or-folder)"
	@echo "make manifest   world-model data: DATA=new trajectories REPLAY=demos/earlier cycles -> RUN/manifest.json"
	@echo "make wm-update  train both world models with DeepSpeed (STEPS; WM_GPUS_MAIN/WM_GPUS_WRIST); rerun to resume"
	@echo "make wm-reward  train the reward model; make package: RUN/model_pair; make wm-eval: fidelity metrics"
	@echo "make bench      simulator throughput on this machine"
	@echo "make lock       regenerate docker/*.lock from docker/requirements-*.in"
	@echo "make check      environment check as JSON: Python, lock, GPUs, renderer, limits (both environments)"
	@echo "make wheelhouse every locked wheel, hash-checked, into wheelhouse/ (IMAGES=train wm)"
	@echo "make build      the two images from the wheelhouse (IMAGES, BASE_IMAGE); make images: their status; make shell IMAGE=wm"
	@echo "RUNTIME=docker make <target>   run the stages of any target inside the images"

# The environments, then (locally) a rendering backend that works: tried once per machine; when
# none renders, the Debian packages to install are named (installed here when run as root with apt).
setup: $(SETUP_ENVS)
ifeq ($(RUNTIME),local)
	@PYTHONPATH=python .venv/train/bin/python -m wmrl.gl --install
endif

.venv/train/.lock.sha256: docker/train.lock scripts/setup_env.sh
	scripts/setup_env.sh train 3.11 docker/train.lock

.venv/wm/.lock.sha256: docker/wm.lock scripts/setup_env.sh
	scripts/setup_env.sh wm 3.10 docker/wm.lock

lock:
	scripts/lock.sh
	docker/lock-containers.sh

# The whole cycle at toy scale on CPU (tiny profile): demonstrations -> supervised policy ->
# one cycle (collect with that policy -> both world models + reward model -> model pair -> GRPO
# inside the pair -> evaluation -> report), then the same GRPO in the real simulator as the
# control; every stage resumable.
DEMO_RUN ?= runs/demo
SPEEDRUN_RUN = $(if $(filter command line,$(origin RUN)),$(RUN),runs/speedrun)
SPEEDRUN_PROFILE = $(if $(filter command line environment,$(origin PROFILE)),$(PROFILE),speedrun)
demo: setup
	$(MAKE) --no-print-directory demos PROFILE=tiny RUN=$(DEMO_RUN)
	$(MAKE) --no-print-directory validate DATA=$(DEMO_RUN)/demos
	test -f $(DEMO_RUN)/eval_expert/results.json || \
		$(MAKE) --no-print-directory eval PROFILE=tiny POLICY=expert OUT=$(DEMO_RUN)/eval_expert VIDEOS=1
	$(MAKE) --no-print-directory sft PROFILE=tiny RUN=$(DEMO_RUN)
	$(MAKE) --no-print-directory cycle PROFILE=tiny RUN=$(DEMO_RUN)
	$(MAKE) --no-print-directory grpo PROFILE=tiny RUN=$(DEMO_RUN)/control FROM=$(DEMO_RUN) ENV=sim TARGET=2
	@echo "demo: report $(DEMO_RUN)/report.html (and report.md); GRPO in the simulator (control): $(DEMO_RUN)/control/logs/grpo_curves.png"

test: .venv/train/.lock.sha256 .venv/wm/.lock.sha256
	@PYTHONPATH=python .venv/train/bin/python -m wmrl.gl --install
	@scripts/run_tests.sh $(TESTS)

demos: setup
	$(TRAIN_PY) python/collect_demos.py $(COMMON) --out $(or $(OUT),$(RUN)/demos) $(call opt,--episodes,$(EPISODES))

eval: setup
	$(TRAIN_PY) python/evaluate.py $(COMMON) $(if $(CKPT),--ckpt $(CKPT) --run $(RUN) $(call opt,--out,$(OUT)),--policy $(POLICY) --out $(or $(OUT),$(RUN)/eval/$(POLICY))) \
		$(call opt,--trials,$(TRIALS)) $(call opt,--videos,$(VIDEOS)) $(call opt,--sampler,$(SAMPLER)) \
		$(call opt,--temperature,$(TEMPERATURE))

# Supervised policy training; GPUS=0,1 runs one process per GPU through torchrun (PER_GPU_PY; grpo too).
NGPUS = $(words $(subst $(comma), ,$(GPUS)))
comma := ,
PER_GPU_PY = $(if $(GPUS),CUDA_VISIBLE_DEVICES=$(GPUS)) $(if $(filter-out 0 1,$(NGPUS)),$(TRAIN_PY) -m torch.distributed.run --standalone --nproc_per_node=$(NGPUS),$(TRAIN_PY))
sft: setup
	$(PER_GPU_PY) python/sft.py --profile $(PROFILE) --run-dir $(RUN) --data $(or $(DATA),$(RUN)/demos) \
		$(call opt,--tasks,$(TASKS)) $(call opt,--seed,$(SEED)) $(call opt,--steps,$(STEPS)) \
		$(DRY)

# The current policy in the real simulator, success and failure kept (the cycle's collection).
collect: setup
	$(TRAIN_PY) python/collect.py $(COMMON) --run $(RUN) $(call opt,--ckpt,$(CKPT)) $(call opt,--episodes,$(EPISODES)) \
		$(call opt,--out,$(OUT)) $(call opt,--frame-interval,$(FRAME_INTERVAL)) \
		$(if $(filter undefined,$(origin EXTRA_TEMPERATURES)),,--extra-temperatures "$(EXTRA_TEMPERATURES)")

# GRPO: TARGET=M (the step to train to), RESUME=N (continue step N's full state), ENV=sim|wm,
# PAIR=dir (a model pair for ENV=wm; default RUN/model_pair; MIN_AGREEMENT=0 trains in one that
# make wm-eval measured below grpo.min_agreement; REWARD_THRESHOLD=closed-loop: the threshold of
# make wm-calibrate, or a number; START_RECORDED_BY='*-T1': imagined starts only from episodes of a
# policy whose id matches), FROM=run (take step 0 from that
# run's newest supervised checkpoint). GPUS=0 picks the GPU; GPUS=0,1 runs one process per GPU
# through torchrun: each rolls out its share of the groups, rank 0 updates (wmrl/rl/ranks.py).
grpo: setup
	@test -n "$(TARGET)" || { echo "error: give TARGET=<GRPO step to train to> (RESUME=N continues step N)"; exit 2; }
	$(PER_GPU_PY) python/grpo.py --profile $(PROFILE) --run-dir $(RUN) --target $(TARGET) \
		$(call opt,--resume,$(RESUME)) $(call opt,--env,$(ENV)) $(call opt,--pair,$(PAIR)) $(call opt,--from-run,$(FROM)) \
		$(call opt,--seed,$(SEED)) $(call opt,--workers,$(WORKERS)) $(call opt,--tasks,$(TASKS)) \
		$(call opt,--success-chunks,$(SUCCESS_CHUNKS)) $(call opt,--world-noise,$(WORLD_NOISE)) \
		$(call opt,--min-agreement,$(MIN_AGREEMENT)) $(call opt,--reward-threshold,$(REWARD_THRESHOLD)) \
		$(if $(START_RECORDED_BY),--start-recorded-by '$(START_RECORDED_BY)') $(DRY)

# The cycle (seed 000): collect -> manifest -> world models -> reward -> pair -> GRPO -> evaluation,
# RUN/cycle.json records finished stages (a rerun skips them), RUN/report.html after each stage.
# CYCLES=N (finish N cycles), GRPO_STEPS (20), EPISODES (per task), STEPS (world-model updates),
# MAX_MINUTES (world-model update), SUCCESS_CHUNKS (imagined success: chunks in a row at the
# reward's threshold, 1), MIN_AGREEMENT (a cycle whose pair wm-eval measured below it, 0.6, skips GRPO
# and goes on with the same policy; 0: never),
# GPUS, SEED, WORKERS, DRY_RUN=1.
# One GPU from nothing (issue: speedrun): demonstrations -> supervised policy -> one cycle (GRPO in the
# pair, between the 10 x 50 evaluations before (in the background) and after) -> report. Every
# stage resumes; DRY_RUN=1 prints each stage's plan. RUN defaults to runs/speedrun and PROFILE to
# speedrun (the default models, shorter stages: python/wmrl/config.py); the command line's
# variables (WORKERS, GPUS, SEED, STEPS, GRPO_STEPS, DRY_RUN ...) reach every stage.
speedrun: setup
	$(MAKE) --no-print-directory demos RUN=$(SPEEDRUN_RUN) PROFILE=$(SPEEDRUN_PROFILE)
	$(MAKE) --no-print-directory sft RUN=$(SPEEDRUN_RUN) PROFILE=$(SPEEDRUN_PROFILE)
	$(MAKE) --no-print-directory cycle RUN=$(SPEEDRUN_RUN) PROFILE=$(SPEEDRUN_PROFILE) CYCLES=1

# The controller needs only the standard library: it runs on the host (python3) in both runtimes
# and starts each stage with $(TRAIN_PY) / $(WM_PY).
cycle: setup
	python3 python/cycle.py --profile $(PROFILE) --run $(RUN) $(call opt,--cycles,$(CYCLES)) \
		$(call opt,--grpo-steps,$(GRPO_STEPS)) $(call opt,--episodes,$(EPISODES)) $(call opt,--tasks,$(TASKS)) \
		$(call opt,--wm-steps,$(STEPS)) $(call opt,--max-minutes,$(MAX_MINUTES)) $(call opt,--gpus,$(GPUS)) \
		$(call opt,--seed,$(SEED)) $(call opt,--workers,$(WORKERS)) $(call opt,--success-chunks,$(SUCCESS_CHUNKS)) \
		$(call opt,--min-agreement,$(MIN_AGREEMENT)) $(if $(call yes,$(STUDENTS)),--students) \
		$(if $(call yes,$(CLOSED_LOOP)),--closed-loop-threshold) $(if $(call yes,$(OWN_STARTS)),--own-starts) \
		--train-py "$(TRAIN_PY)" --wm-py "$(WM_PY)" $(DRY)

# Release: RUN as a bundle (seed 000's layout, MANIFEST.json with every SHA-256); DATA=0 leaves
# the trajectories out. Restore: verify (resumable), relocate paths, unpack the source.
release: setup
	@test -n "$(OUT)" || { echo "error: give OUT=<bundle folder to write>"; exit 2; }
	$(TRAIN_PY) python/release.py make --run $(RUN) --out $(OUT) --profile $(PROFILE) \
		$(if $(filter 0 no false,$(DATA)),--no-data) $(OVER)

restore: setup
	@test -n "$(BUNDLE)" || { echo "error: give BUNDLE=<a folder make release wrote>"; exit 2; }
	$(TRAIN_PY) python/release.py restore $(BUNDLE) $(if $(call yes,$(REFRESH_SOURCE)),--refresh-source)

validate: setup
	@test -n "$(DATA)" || { echo "error: give DATA=<file or folder of .hdf5 trajectories>"; exit 2; }
	$(TRAIN_PY) python/validate_data.py $(DATA)

bench: setup
	$(TRAIN_PY) bench/sim_throughput.py $(call opt,--workers,$(WORKERS))

clean:
	rm -rf runs/demo

# ---- Offline runtime bundle ----------------------------------------------------------------
# The simulator side for a server with no package index (see python/wmrl/offline/__init__.py).
#   make offline-bundle [OUT=dir] [PYTHON_VERSION=3.12] [WITH_TORCH=0] [SKIP=names]
#       wheels + trimmed LIBERO-Spatial asset pack + MANIFEST.json, built with .venv/train.
#       SKIP: packages the target already has (comma-separated, globs); for PYTHON_VERSION=3.12
#       it defaults to `gpu-server` (what the GPU server's image holds: numpy, scipy, numba, ...);
#       SKIP= ships everything.
#   make offline-install BUNDLE=dir [TARGET=dir] [PYTHON=python3] [TASKS=all] [WORKERS=n] [CHECK_ONLY=1]
#       verify every file, pip install --no-index --no-deps into PYTHON (or --target TARGET),
#       unpack the assets, then build and render every task (TASKS) as a check.
PYTHON_VERSION ?= 3.12
WITH_TORCH     ?= 0
OFFLINE_PY_MM   = $(word 1,$(subst ., ,$(PYTHON_VERSION))).$(word 2,$(subst ., ,$(PYTHON_VERSION)))
OFFLINE_SKIP_3.12 := gpu-server
SKIP           ?= $(OFFLINE_SKIP_$(OFFLINE_PY_MM))

.PHONY: offline-bundle offline-install

offline-bundle: .venv/train/.lock.sha256
	.venv/train/bin/python python/offline_bundle.py build --out $(or $(OUT),.offline/py$(subst .,,$(OFFLINE_PY_MM))) \
		--python-version $(OFFLINE_PY_MM) $(if $(call yes,$(WITH_TORCH)),--with-torch) $(call opt,--skip,$(SKIP))

offline-install:
	@test -n "$(BUNDLE)$(call yes,$(CHECK_ONLY))" || { echo "error: give BUNDLE=<bundle folder> (from make offline-bundle)"; exit 2; }
	$(or $(PYTHON),python3) python/offline_bundle.py install $(call opt,--bundle,$(BUNDLE)) $(call opt,--target,$(TARGET)) \
		$(if $(call yes,$(CHECK_ONLY)),--check-only) $(call opt,--tasks,$(TASKS)) $(call opt,--jobs,$(WORKERS))

# ---- World models (the cycle's steps 2-4; .venv/wm, DeepSpeed) --------------------------------
#   make manifest RUN=r DATA=<new trajectories> [REPLAY=<demos, earlier cycles>]   RUN/manifest.json
#   make wm-update RUN=r [STEPS=n] [SAVE_INTERVAL=n] [MAX_MINUTES=m]   both views; WM_GPUS_MAIN /
#        WM_GPUS_WRIST pick the GPU groups (default half and half, one GPU shared; CPU without GPUs); HOSTFILE=f for
#        several hosts; MAX_MINUTES: a time limit (the wrist model stops, main follows); MORE=1: train a
#        finished update further (to a higher STEPS or MAX_MINUTES more; then wm-reward and package OVERWRITE=1);
#        WRIST_MAIN_AT_END=1: the wrist model sees the main frame of the chunk's end instead of its start;
#        WRIST_WARP=0: the wrist model without its frame warped by the camera's motion (on by default)
#        COMPILE=0: eager training (the default profile compiles the loss: ~45 s first, then 1.2x the samples/s)
#   make wm-reward RUN=r [CONTROL_NEGATIVES=hold,random]  the frozen success classifier  RUN/worldmodels/reward/
#        [GENERATED_SHARE=0.5 GENERATED_SAMPLES=2]  more of the pair's own frames in its training
#        STUDENTS=1: trained on the one-step students' frames, for their pair  RUN/worldmodels/reward_students/
#   make package RUN=r        RUN/model_pair/pair.json (hashes, lineage)
#   make wm-eval RUN=r        PSNR/SSIM after 1/5/10/20 chunks, reward accuracy, videos  PAIR/fidelity.json
#   make wm-distill RUN=r     one-step students of both views                         RUN/worldmodels/*_student/
#   make wm-rank RUN=r POLICIES="sft/1000 sft/4000 sft/4000@T=3 hold ..." [TRIALS=n REAL_TRIALS=n PAIR=d MANIFEST=f]
#        imagined (held-out keyframes) vs real success per policy, Spearman, cost  PAIR/ranking.json
#        (runs in .venv/train: it drives the real simulator too)
#   make wm-calibrate RUN=r POLICY=sft/4000@T=1 [TRIALS=n PAIR=d MANIFEST=f SUCCESS_CHUNKS=k]  the reward's threshold
#        calibrated closed loop (the policy that recorded the held-out episodes acting in the pair)  PAIR/closed_loop.json
#        (make grpo ... REWARD_THRESHOLD=closed-loop uses it; .venv/train: it runs the policy)
WM_FLAGS = --profile $(PROFILE) --run $(RUN) $(DRY)

.PHONY: manifest wm-update wm-reward package wm-eval wm-rank wm-calibrate wm-distill

manifest: setup
	@test -n "$(DATA)$(REPLAY)" || { echo "error: give DATA=<this cycle's trajectories> and/or REPLAY=<demonstrations, earlier cycles>"; exit 2; }
	$(WM_PY) python/make_manifest.py --run $(RUN) $(call opt,--new,$(DATA)) $(call opt,--replay,$(REPLAY)) \
		$(call opt,--seed,$(SEED)) $(DRY) $(OVER)

wm-update: setup
	$(WM_PY) python/wm_update.py $(WM_FLAGS) $(call opt,--steps,$(STEPS)) $(call opt,--save-interval,$(SAVE_INTERVAL)) \
		$(call opt,--max-minutes,$(MAX_MINUTES)) $(call opt,--hostfile,$(HOSTFILE)) $(if $(call yes,$(MORE)),--more) \
		$(if $(call yes,$(WRIST_MAIN_AT_END)),--wrist-main-at-end) $(if $(filter 0 no false,$(WRIST_WARP)),--no-wrist-warp) \
		$(if $(filter 0 no false,$(COMPILE)),--no-compile)

wm-reward: setup
	$(WM_PY) python/wm_reward.py --profile $(PROFILE) --run $(RUN) $(DRY) \
		$(OVER) $(if $(CONTROL_NEGATIVES),--control-negatives $(CONTROL_NEGATIVES)) $(if $(call yes,$(STUDENTS)),--students) \
		$(if $(GENERATED_SHARE),--generated-share $(GENERATED_SHARE)) $(if $(GENERATED_SAMPLES),--generated-samples $(GENERATED_SAMPLES))

package: setup
	$(WM_PY) python/package_pair.py --profile $(PROFILE) --run $(RUN) $(call opt,--out,$(OUT)) $(DRY) \
		$(if $(call yes,$(STUDENTS)),--students) $(OVER)

# Few-step students of both world models (wmrl.worldmodel.distill); STEPS, VIEW, DRY_RUN=1;
# SF_STEPS=N adds N iterations of Stage 3 (self-forcing DMD) after them. Then
# `make wm-reward STUDENTS=1` (a reward on the students' frames) and `make package STUDENTS=1
# OVERWRITE=1` pack them as the pair GRPO imagines in.
wm-distill: setup
	$(WM_PY) python/wm_distill.py --profile $(PROFILE) --run $(RUN) $(call opt,--steps,$(STEPS)) \
		$(call opt,--self-forcing-steps,$(SF_STEPS)) $(call opt,--view,$(VIEW)) $(DRY)

wm-eval: setup
	$(WM_PY) python/wm_eval.py --run $(RUN) $(DRY)

wm-rank: setup
	@test -n "$(POLICIES)" || { echo 'error: give POLICIES="sft/1000 sft/4000 sft/4000@T=3 ..." (2 or more; 4+ to mean much)'; exit 2; }
	$(TRAIN_PY) python/wm_rank.py --profile $(PROFILE) --run $(RUN) $(foreach p,$(POLICIES),--policy $(p)) \
		$(call opt,--pair,$(PAIR)) $(call opt,--manifest,$(MANIFEST)) $(call opt,--trials,$(TRIALS)) \
		$(call opt,--real-trials,$(REAL_TRIALS)) $(call opt,--workers,$(WORKERS)) $(DRY)

wm-calibrate: setup
	@test "$(origin POLICY)" != file || { echo 'error: give POLICY=<the checkpoint that recorded the held-out episodes>@T=<its temperature>, e.g. sft/4000@T=1'; exit 2; }
	$(TRAIN_PY) python/wm_calibrate.py --run $(RUN) --policy $(POLICY) $(call opt,--pair,$(PAIR)) \
		$(call opt,--manifest,$(MANIFEST)) $(call opt,--trials,$(TRIALS)) $(call opt,--success-chunks,$(SUCCESS_CHUNKS)) \
		$(OVER) $(DRY)

# ---- Containers (Dockerfile.train, Dockerfile.wm; README "Containers") -----------------------
#   make wheelhouse [IMAGES="train wm"]        download every locked file (hash-checked), host side
#   make build [IMAGES=...] [BASE_IMAGE=...]   build from the wheelhouse (offline: --no-index --require-hashes)
#   make images                                which images exist and whether they match the locks
#   RUNTIME=docker make check                  the check stage inside both images
IMAGES ?= train wm

.venv/driver/.lock.sha256: docker/driver.lock scripts/setup_env.sh
	scripts/setup_env.sh driver $(DRIVER_PYTHON) docker/driver.lock

wheelhouse: .venv/driver/.lock.sha256
	$(CONTAINERS) wheelhouse $(IMAGES)

build: wheelhouse
	$(CONTAINERS) build $(IMAGES) $(call opt,--base-image,$(BASE_IMAGE))

images: .venv/driver/.lock.sha256
	@$(CONTAINERS) status

# An interactive shell in an image (IMAGE=train|wm), with the settings stages get.
shell: .venv/driver/.lock.sha256
	$(CONTAINERS) shell --image $(or $(IMAGE),train)

# Environment check of both environments (JSON); REQUIRE_GPU=1 fails without a visible GPU.
check: setup
	$(TRAIN_PY) python/check.py --env train $(if $(call yes,$(REQUIRE_GPU)),--require-gpu) $(call opt,--out,$(if $(OUT),$(OUT)/check_train.json))
	$(WM_PY) python/check.py --env wm $(if $(call yes,$(REQUIRE_GPU)),--require-gpu) $(call opt,--out,$(if $(OUT),$(OUT)/check_wm.json))

# ---- Bimanual world-model recipe (Stages 0-3, student export, few-step generation) ----------
# Runs in .venv/wm. The bundle lives in RUN/bimanual/bundle unless OUT/DATA say otherwise.
#   make bimanual-bundle [PROFILE=tiny] [OUT=dir] [DATA=libero.hdf5|folder] [EPISODES=n] [SEED=s] [OVERWRITE=1] [DRY_RUN=1]
#   make bimanual-validate [DATA=bundle] [OUT=preview dir]     JSON, exits 1 unless passed
#   make bimanual-materialize [DATA=bundle] [OUT=preview dir]  one packed Stage 0 batch, JSON
#   make bimanual-train STAGE=0|1|2|3 [PROFILE=tiny] [DATA=bundle] [PARENT=iteration root] [CONFIG=toml] [GPUS=0,1]
#                       [SMOKE=1: 12 iterations, save at 12, own run name] [OVERRIDES="trainer.lr=1e-4"] [DRY_RUN=1]
#       PARENT: Stage 1 <- Stage 0 root, Stage 2 (TF-dCM) <- Stage 1 root, Stage 3 (SF-DMD) <- Stage 2 root;
#       Stage 3 also REFERENCE=<Stage 0 root> (real score and critic). Stages 2 and 3 run on one GPU.
#       Checkpoints: RUN/bimanual/<job.name>/checkpoints/iter_*. Rerun the same command to resume.
#   make bimanual-eval STAGE=1 CKPT_ROOT=<iteration root>   held-out next-chunk PSNR vs copying the last frame
#   make wm-export STAGE3_CHECKPOINT_ROOT=<last root of a finished Stage 3 run> STUDENT_EXPORT=<new folder>
#                  [STAGE3_CONFIG=<its TOML or config.json; default: the run's config.json>]
#       the portable student: EMA weights (safetensors), the saved step schedule, action metadata, no local paths
#   make bimanual-generate STUDENT=<export> CONTEXT="<bundle>:<episode> | <bundle> | clip.npz ..." OUT=<x.mp4|folder>
#                  [TEACHER=<Stage 1 root>] [SEED=s] [GPUS=0]   MP4 + frames + PSNR and frames/s per clip
STAGE          ?= 0
BIMANUAL_DATA   = $(or $(DATA),$(RUN)/bimanual/bundle)
BIMANUAL_CONFIG = $(or $(CONFIG),$(firstword $(wildcard data/configs/stage$(STAGE)_*.toml)))
BIMANUAL_ENV    = BIMANUAL_BUNDLE=$(BIMANUAL_DATA) BIMANUAL_OUTPUT_ROOT=$(RUN)/bimanual
# GPUS=0,1,...: one process per GPU through torchrun; the trainer then uses DeepSpeed ZeRO.
BIMANUAL_PY     = $(if $(GPUS),CUDA_VISIBLE_DEVICES=$(GPUS)) $(BIMANUAL_ENV) \
                  $(if $(filter-out 0 1,$(NGPUS)),$(WM_PY) -m torch.distributed.run --standalone --nproc_per_node=$(NGPUS),$(WM_PY))
BIMANUAL_OVR    = $(subst checkpoint.reference= ,checkpoint.reference=,$(subst checkpoint.load_path= ,checkpoint.load_path=,\
                  $(call opt,checkpoint.load_path=,$(PARENT)) $(call opt,checkpoint.reference=,$(REFERENCE)))) $(OVERRIDES) \
                  $(if $(call yes,$(SMOKE)),trainer.max_iter=12 checkpoint.save_iter=12 job.name=bimanual_stage$(STAGE)_smoke)

.PHONY: bimanual-bundle bimanual-validate bimanual-materialize bimanual-train bimanual-eval wm-export bimanual-generate

bimanual-bundle: setup
	$(WM_PY) python/bimanual.py bundle --profile $(PROFILE) --out $(or $(OUT),$(RUN)/bimanual/bundle) $(call opt,--data,$(DATA)) \
		$(call opt,--episodes,$(EPISODES)) $(call opt,--seed,$(SEED)) $(DRY) \
		$(OVER)

bimanual-validate: setup
	$(WM_PY) python/bimanual.py validate $(BIMANUAL_DATA) $(call opt,--out,$(OUT))

bimanual-materialize: setup
	$(WM_PY) python/bimanual.py materialize $(BIMANUAL_DATA) $(call opt,--out,$(OUT))

bimanual-train: setup
	@test -n "$(BIMANUAL_CONFIG)" || { echo "error: no data/configs/stage$(STAGE)_*.toml; give STAGE=0|1|2|3 or CONFIG=<toml>"; exit 2; }
	$(BIMANUAL_PY) python/bimanual.py train --stage $(STAGE) --config $(BIMANUAL_CONFIG) --profile $(PROFILE) \
		$(DRY) $(BIMANUAL_OVR)

bimanual-eval: setup
	@test -n "$(CKPT_ROOT)" || { echo "error: give CKPT_ROOT=<an iteration root, e.g. RUN/bimanual/bimanual_stage1/checkpoints/iter_000008000>"; exit 2; }
	$(BIMANUAL_ENV) $(WM_PY) python/bimanual.py evaluate --config $(BIMANUAL_CONFIG) --profile $(PROFILE) --checkpoint $(CKPT_ROOT) \
		$(call opt,--out,$(OUT)) $(BIMANUAL_OVR)

wm-export: setup
	@test -n "$(STAGE3_CHECKPOINT_ROOT)" -a -n "$(STUDENT_EXPORT)" || { echo "error: give STAGE3_CHECKPOINT_ROOT=<the last iteration root of a finished Stage 3 run> and STUDENT_EXPORT=<a new folder>"; exit 2; }
	$(BIMANUAL_ENV) $(WM_PY) python/bimanual.py export --checkpoint $(STAGE3_CHECKPOINT_ROOT) --out $(STUDENT_EXPORT) \
		--config $(or $(STAGE3_CONFIG),$(STAGE3_CHECKPOINT_ROOT)/../../config.json) --profile $(PROFILE) $(OVERRIDES)

bimanual-generate: setup
	@test -n "$(STUDENT)" -a -n "$(CONTEXT)" -a -n "$(OUT)" || { echo "error: give STUDENT=<export folder> CONTEXT=\"<bundle>:<episode> | <bundle> | clip.npz\" OUT=<x.mp4 | folder> [TEACHER=<Stage 1 root>]"; exit 2; }
	$(if $(GPUS),CUDA_VISIBLE_DEVICES=$(GPUS)) $(WM_PY) python/bimanual.py generate --student $(STUDENT) --context $(CONTEXT) \
		--out $(OUT) $(call opt,--teacher,$(TEACHER)) $(call opt,--seed,$(SEED))
