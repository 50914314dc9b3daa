#!/usr/bin/env bash
# The device check, one short script: every engine and the recipe on CUDA/NCCL at world 1 (and world 2
# where two GPUs exist), FSDP's stream path included (checks/cuda_check.py).
#   bash checks/gpu.sh     (the project's .venv when there is one, else python3 with torch; PY=... to choose;
#                           hydra wheels in .whl/ are installed to /tmp/site when present)
# Without a CUDA GPU it fails at once with one line: a check that cannot fail checks nothing.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
GPUS=$($PY -c "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)" 2>/dev/null || echo 0)
if [ "${GPUS:-0}" -lt 1 ]; then
  echo "checks/gpu.sh: FAILED: no CUDA GPU visible to torch ($PY); run it on a GPU machine" >&2
  exit 1
fi
if [ -d .whl ]; then $PY -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site; fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1
TR="$PY -m torch.distributed.run --standalone --nproc_per_node=1"
RUNS=$(mktemp -d)  # fresh run directories: a finished run is not re-run
nvidia-smi -L; $PY -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())"
rc=0
$TR checks/cuda_check.py || rc=1
if [ "$GPUS" -ge 2 ]; then  # real NCCL traffic between two GPUs: the collectives' streams overlap for real
  $PY -m torch.distributed.run --standalone --nproc_per_node=2 checks/cuda_check.py || rc=1
fi
$TR recipes/collectives_tour.py --numel 4194304 2>&1 | tail -9 || rc=1
for s in ddp zero1 zero2 full_shard; do
  $TR -m recipes.train experiment=gpt_tiny strategy=$s trainer.precision=bf16 trainer.steps=40 \
      logger.mode=disabled out_dir=$RUNS name=$s 2>&1 | grep -E "final|baseline|error" || rc=1
done
$TR -m recipes.train experiment=gpt_tiny strategy=zero2 trainer.precision=fp16 trainer.steps=40 \
    logger.mode=disabled out_dir=$RUNS name=zero2-fp16 2>&1 | grep -E "final|baseline|error" || rc=1
[ $rc = 0 ] && echo "checks/gpu.sh: all checks passed" || echo "checks/gpu.sh: FAILED (see above)" >&2
exit $rc
