# Two commands: `make train` (the main job) and `make test` (the whole suite); `make docs` builds the site.
# Both create .venv on first use and reuse it afterwards.
VENV  := .venv
PY    := $(VENV)/bin/python
STAMP := $(VENV)/.minidist-installed
# Processes per node: every GPU when nvidia-smi sees some (nccl), else 2 CPU processes (gloo).
GPUS  := $(shell nvidia-smi -L 2>/dev/null | grep -c '^GPU')
NPROC ?= $(if $(filter-out 0,$(GPUS)),$(GPUS),2)
# On GPUs the main job does more work in similar time (configs/experiment/main_gpu.yaml), unless
# ARGS choose an experiment themselves.
MAIN  := $(if $(and $(filter-out 0,$(GPUS)),$(if $(findstring experiment=,$(ARGS)),,yes)),experiment=main_gpu)

.PHONY: train test tour docs docs-serve

# Bytecode is cached under .venv/pycache (out of the source tree), also where the environment sets
# PYTHONDONTWRITEBYTECODE (this machine and CI do): otherwise no .pyc is ever written, and every
# process compiled each module it imported from source again: each torchrun agent and worker
# (~1.4 s of CPU for torch and minidist.train alone), and each pool worker of the suite for what it
# imports after its fork (Hydra, DTensor, the profiler, ...). The suite: ~1,400 -> ~810 s of CPU.
export PYTHONPYCACHEPREFIX := $(abspath $(VENV))/pycache
unexport PYTHONDONTWRITEBYTECODE

# pip through scripts/install_venv.py: pip resolves once, then unpacks the wheels in two processes (pip
# unpacks one wheel after another, ~30 s of one core for the 5.5 GB of torch and CUDA's libraries while
# the other idled); no wheel is kept in ~/.cache (the wheels, 3 GB with CUDA's libraries, are installed
# once: writing them there too cost 17 s; the resolver's PyPI downloads go to a temporary cache the
# installs reuse) and no installed module is compiled (only those imported get compiled, by the first
# process that imports them, into the cache above). A fresh clone's venv on 2 cores: pip 85 s -> 46-52 s
# (no cache, no compile); this rule, warm-up below included, 57.5 s -> 38 s (two processes, pip >= 25
# resolving; one run each on a quiet machine; the script has more).
#
# Then the bytecode of what nearly every process imports is compiled once, in two processes (torch and
# minidist; the libraries beside them): otherwise the first processes of a run all compile the same
# modules at the same time, ~7 s of CPU each (the suite's two workers, their pools and the first
# torchruns' agents and workers; make train's agent and workers). It costs 9-10 s here; measured on a
# fresh clone (one run each): suite 310 -> 295 s, machine CPU 637 -> 626 s, whole run 364 -> 362 s.
$(STAMP): pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) scripts/install_venv.py
	$(PY) -c "import matplotlib.pyplot, hydra, omegaconf, wandb, pytest, xdist" & libs=$$!; \
	$(PY) -c "import torch._dynamo, minidist.train, minidist.compare, minidist.models.resnet, recipes.train" && wait $$libs
	@touch $(STAMP)

# torchrun through minidist.recipes.torchrun: the workers' exit status (64: a bad input, 75: preempted),
# and no launcher traceback after their one-line error.
TORCHRUN := OMP_NUM_THREADS=1 $(PY) -m minidist.recipes.torchrun --standalone --nproc_per_node=$(NPROC)

train: $(STAMP)
	$(TORCHRUN) -m recipes.train $(MAIN) $(ARGS)

# The suite in 2 pytest-xdist workers: one session left ~20% of the 2 cores idle (single-process tests,
# subprocesses starting, ranks waiting on peers), which the other worker's tests fill: 435 -> 368 s of
# suite on 2 cores. Each worker has its own pools; a test whose claim is a measured time is marked
# `alone` and runs with nothing beside it, and the tests marked `launches` (they start interpreters of
# their own, the longest) run first (tests/conftest.py). ARGS="-n 0 ..." runs in one process.
test: $(STAMP)
	$(PY) -m pytest -q -n 2 $(ARGS)

tour: $(STAMP)
	$(TORCHRUN) recipes/collectives_tour.py

docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

docs-serve: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve
