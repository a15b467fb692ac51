# wmrl: every user-facing target. Thin: each calls a script in python/ or scripts/.
# Variables mean the same in every target (see README): RUN OUT PROFILE TASKS EPISODES
# TRIALS SEED DATA POLICY DRY_RUN TESTS WORKERS.
SHELL := /bin/bash
.DEFAULT_GOAL := help

RUN      ?= runs/default
PROFILE  ?= default
POLICY   ?= expert
TESTS    ?= tests
TRAIN_PY := .venv/train/bin/python
WM_PY    := .venv/wm/bin/python

# Optional flags, passed only when the variable is set.
opt = $(if $(strip $(2)),$(1) $(2))
COMMON = --profile $(PROFILE) $(call opt,--tasks,$(TASKS)) $(call opt,--seed,$(SEED)) \
         $(call opt,--workers,$(WORKERS)) $(if $(filter 1 yes true,$(DRY_RUN)),--dry-run) \
         $(if $(filter 1 yes true,$(OVERWRITE)),--overwrite)

# Test folders that need the world-model environment (Python 3.10, DeepSpeed).
WM_TEST_DIRS := tests/worldmodel

.PHONY: help setup lock demo test demos eval validate bench clean

help:
	@echo "make setup      both environments (.venv/train: Python 3.11, .venv/wm: Python 3.10)"
	@echo "make demo       toy-scale run on CPU: expert demonstrations -> validation -> evaluation"
	@echo "make test       the test suite (TESTS=tests/sim for a subset)"
	@echo "make demos      scripted-expert demonstrations (TASKS EPISODES OUT)"
	@echo "make eval       real-simulator evaluation (POLICY=expert|random TRIALS TASKS OUT)"
	@echo "make validate   check trajectory files (DATA=file-or-folder)"
	@echo "make bench      simulator throughput on this machine"
	@echo "make lock       regenerate docker/*.lock from docker/requirements-*.in"

setup: .venv/train/.lock.sha256 .venv/wm/.lock.sha256

.venv/train/.lock.sha256: docker/train.lock scripts/setup_env.sh
	scripts/setup_env.sh train 3.11 docker/train.lock

.venv/wm/.lock.sha256: docker/wm.lock scripts/setup_env.sh
	scripts/setup_env.sh wm 3.10 docker/wm.lock

lock:
	scripts/lock.sh

demo: setup
	$(MAKE) --no-print-directory demos PROFILE=tiny OUT=runs/demo/demos
	$(MAKE) --no-print-directory validate DATA=runs/demo/demos
	$(MAKE) --no-print-directory eval PROFILE=tiny POLICY=expert OUT=runs/demo/eval_expert VIDEOS=1

test: setup
	@scripts/run_tests.sh $(TESTS)

demos: setup
	$(TRAIN_PY) python/collect_demos.py $(COMMON) --out $(or $(OUT),$(RUN)/demos) $(call opt,--episodes,$(EPISODES))

eval: setup
	$(TRAIN_PY) python/evaluate.py $(COMMON) --policy $(POLICY) --out $(or $(OUT),$(RUN)/eval/$(POLICY)) \
		$(call opt,--trials,$(TRIALS)) $(call opt,--videos,$(VIDEOS))

validate: setup
	@test -n "$(DATA)" || { echo "error: give DATA=<file or folder of .hdf5 trajectories>"; exit 2; }
	$(TRAIN_PY) python/validate_data.py $(DATA)

bench: setup
	$(TRAIN_PY) bench/sim_throughput.py $(call opt,--workers,$(WORKERS))

clean:
	rm -rf runs/demo
