#!/usr/bin/env bash
# Several machines: run this once on every node, with the same MASTER (host:port of any one
# node, reachable from all), RUN and NNODES. torchrun's c10d rendezvous assigns the ranks.
#   node A:  NNODES=2 MASTER=10.0.0.1:29500 RUN=gpt-2n launch/multinode.sh strategy=hybrid_shard
#   node B:  NNODES=2 MASTER=10.0.0.1:29500 RUN=gpt-2n launch/multinode.sh strategy=hybrid_shard
# The c10d rendezvous numbers the nodes itself (torchrun ignores --node_rank with it, and warns).
# $OUT/$RUN (OUT defaults to <repo>/outputs) must be on a filesystem every node sees (checkpoints
# are written per rank and read back by all on restart). NPROC = processes per node (default: 1
# per GPU, else 1). Exit status as launch/local.sh's (0, 64 bad input, 75 preempted, 1 error).
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}  # torchrun would set 1 itself, with a warning
OUT=${OUT:-$PWD/outputs}
: "${NNODES:?set NNODES}" "${MASTER:?set MASTER=host:port}" "${RUN:?set RUN (the same on every node)}"
PYTHON=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
NPROC=${NPROC:-$(nvidia-smi -L 2>/dev/null | grep -c "^GPU" || true)}
[ "${NPROC:-0}" -gt 0 ] || NPROC=1  # no GPU: CPU processes with gloo
exec "$PYTHON" -m minidist.recipes.torchrun --nnodes="$NNODES" --nproc_per_node="$NPROC" \
    --shutdown-timeout="${SHUTDOWN_TIMEOUT:-60}" \
    --rdzv_backend=c10d --rdzv_endpoint="$MASTER" --rdzv_id="$RUN" --max-restarts="${MAX_RESTARTS:-3}" \
    -m "${ENTRY:-recipes.train}" out_dir="$OUT" name="$RUN" resume=auto trainer.ckpt_interval="${CKPT_INTERVAL:-100}" "$@"
