#!/usr/bin/env bash
# One machine, NPROC processes (all GPUs with nccl when CUDA is present, else CPU + gloo).
#   launch/local.sh strategy=full_shard trainer.steps=2000
#   NPROC=8 RUN=gpt-fsdp launch/local.sh strategy=full_shard
# Every launch names one run directory ($OUT/$RUN; OUT defaults to <repo>/outputs, absolute, so
# the paths printed are valid from anywhere) and resumes from its latest complete checkpoint
# (resume=auto); a worker that crashes makes torchrun restart all workers (up to MAX_RESTARTS
# times), and they continue from that checkpoint (every CKPT_INTERVAL steps, default 100).
# ENTRY=module runs another entry point (default recipes.train).
# torchrun runs through minidist.recipes.torchrun, so the script exits with the workers' status:
# 0 done, 64 a bad input (one line, before any worker starts), 75 preempted after a checkpoint
# (SIGTERM to this script: torchrun forwards it and waits SHUTDOWN_TIMEOUT s, default 60), 1 an error.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}  # torchrun would set 1 itself, with a warning
OUT=${OUT:-$PWD/outputs}
PYTHON=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
NPROC=${NPROC:-$(nvidia-smi -L 2>/dev/null | grep -c "^GPU" || true)}
[ "${NPROC:-0}" -gt 0 ] || NPROC=2  # no GPU: CPU processes with gloo
RUN=${RUN:-local-$(date +%Y%m%d-%H%M%S)}
exec "$PYTHON" -m minidist.recipes.torchrun --standalone --nproc_per_node="$NPROC" --max-restarts="${MAX_RESTARTS:-3}" \
    --shutdown-timeout="${SHUTDOWN_TIMEOUT:-60}" \
    -m "${ENTRY:-recipes.train}" out_dir="$OUT" name="$RUN" resume=auto trainer.ckpt_interval="${CKPT_INTERVAL:-100}" "$@"
