"""The main job's sweep: each candidate trained as `make train` trains it, timed, and scored several ways.

    python benchmarks/main_job_sweep.py run NAME "what changed" [overrides ...]   # one run (minutes)
    python benchmarks/main_job_sweep.py table                                     # the table, from the records

`run` trains with `python -m minidist.recipes.torchrun --standalone --nproc_per_node=2 -m recipes.train
<overrides>` (make train's command, OMP_NUM_THREADS=1) under the machine's CPU lock (flock on
/tmp/minidist-cpu.lock: runs of other jobs do not share the cores with it), and records its wall time,
its CPU time (user + system of torchrun and its workers, from the kernel: getrusage of the children),
the load average before and after, the step time the run logged, and the final validation bits per
byte it printed. It then scores the saved model (<run>/model.pt) on the same validation split with
validation windows that start every `stride` bytes (trainer.eval_stride; TokenWindows): the
non-overlapping windows score the first byte of each with no context, a stride s < block_size
scores each byte once with at least block_size - s bytes before it. One JSON line per run is
appended to benchmarks/results/main_job_sweep.jsonl.

`table` prints the records as the markdown table docs/recipes.md includes (scripts/gen_docs_numbers.py
main_job_sweep writes it to docs/generated/main_job_sweep.md): no number of it is typed by hand.
CPU seconds, not wall seconds, rank runs made while other jobs shared the machine; the load beside
each says how shared it was.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import math
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's minidist, as its recipes (run from ROOT) use
RECORDS = ROOT / "benchmarks" / "results" / "main_job_sweep.jsonl"
LOCK = "/tmp/minidist-cpu.lock"
STRIDES = (0, 32, 16)
"""Validation strides each saved model is scored with (0: non-overlapping windows)."""


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


@contextlib.contextmanager
def _cpu_lock():
    with open(LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield  # closing the file releases it


def train(overrides: list[str], out_dir: Path, name: str) -> dict:
    """One run of the recipe (the caller holds the CPU lock): wall and CPU seconds, load, what it printed."""
    cmd = [sys.executable, "-m", "minidist.recipes.torchrun", "--standalone", "--nproc_per_node=2", "-m",
           "recipes.train", *overrides, f"out_dir={out_dir}", f"name={name}", "trainer.progress_bar=false"]
    load = os.getloadavg()[0]
    cpu0, t0 = _children_cpu(), time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=os.environ | {"OMP_NUM_THREADS": "1"}, capture_output=True, text=True)
    wall, cpu = time.perf_counter() - t0, _children_cpu() - cpu0
    loads = [load, os.getloadavg()[0]]
    if proc.returncode != 0:
        raise SystemExit(f"the run failed (exit {proc.returncode}):\n{(proc.stdout + proc.stderr)[-2000:]}")
    bpb = float(re.search(r"^final .*val/bits_per_byte ([\d.]+)", proc.stdout, re.M).group(1))
    return {"wall_s": wall, "cpu_s": cpu, "load": loads, "printed_bpb": bpb, "output": proc.stdout}


def score(run_dir: Path, strides=STRIDES) -> dict[str, float]:
    """Validation bits per byte of <run_dir>/model.pt at each stride, in this process (one thread)."""
    import torch

    from minidist.models import load
    from minidist.train.data import IGNORE, TokenWindows, stdlib_corpus

    torch.set_num_threads(1)
    model = load(run_dir)
    data = _data_cfg(run_dir)
    _, val = stdlib_corpus(data["max_bytes"], data["val_percent"])
    out = {}
    for stride in strides:
        ds = TokenWindows(val, model.cfg.block_size, stride or None)
        nats = count = 0.0
        with torch.no_grad():
            for i in range(0, len(ds), 256):
                x, y = ds.get(torch.arange(i, min(i + 256, len(ds))))
                _, loss = model(x, y)
                n = int((y != IGNORE).sum())
                nats, count = nats + float(loss) * n, count + n
        out[str(stride)] = nats / count / math.log(2)
    return out


def _data_cfg(run_dir: Path) -> dict:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.load(run_dir / ".hydra" / "config.yaml"))["data"]


def _step_ms(run_dir: Path) -> float:
    """Median of the logged step times (train/step_s rows of metrics.jsonl), in ms."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    times = sorted(r["train/step_s"] for r in rows if "train/step_s" in r)
    return 1e3 * times[len(times) // 2]


def cmd_run(args) -> None:
    out_dir = Path(args.out_dir)
    run_dir = out_dir / args.name
    with _cpu_lock():  # flock(1)'s lock: other jobs' runs wait while this one trains
        result = train(args.overrides, out_dir, args.name)
    (run_dir / "printed.txt").write_text(result["output"])  # what the run printed, its sample included
    with _cpu_lock():  # a minute of one core: a hold of its own
        scores = score(run_dir)
    record = {"name": args.name, "change": args.change, "overrides": args.overrides,
              "steps": _steps(run_dir), "wall_s": round(result["wall_s"], 1), "cpu_s": round(result["cpu_s"], 1),
              "step_ms": round(_step_ms(run_dir), 1), "load": [round(x, 1) for x in result["load"]],
              "printed_bpb": result["printed_bpb"], "unigram_bpb": _unigram(result["output"]),
              "bpb_by_stride": {k: round(v, 4) for k, v in scores.items()},
              "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                       text=True).stdout.strip()}
    RECORDS.parent.mkdir(parents=True, exist_ok=True)
    with open(RECORDS, "a") as f:
        f.write(json.dumps(record) + "\n")
    print(json.dumps(record))


def _steps(run_dir: Path) -> int:
    from omegaconf import OmegaConf

    return int(OmegaConf.load(run_dir / ".hydra" / "config.yaml").trainer.steps)


def _unigram(output: str) -> float:
    return float(re.search(r"unigram baseline ([\d.]+)", output).group(1))


def is_main_job(record: dict, defaults) -> bool:
    """Whether the record's overrides are all the main job's values (configs/: what `make train` composes)."""
    from omegaconf import OmegaConf

    pairs = [o.split("=", 1) for o in record["overrides"]]
    return all(str(OmegaConf.select(defaults, key)) == value for key, value in pairs)


def table(records: list[dict]) -> str:
    """The records as a markdown table: bits per byte and their ratio to the unigram baseline at each stride
    (0: non-overlapping windows); the main job's rows in bold."""
    from minidist.cli.compose import compose_config

    defaults = compose_config([], world=(2, 2))
    head = ("| run | change from the previous main job | steps | step ms | wall s | CPU s | load "
            "| bits/byte, stride 64 / 32 / 16 | ratio, stride 64 / 32 / 16 |\n"
            "|---|---|---:|---:|---:|---:|---:|---|---|")
    rows = []
    for r in records:
        by = r["bpb_by_stride"]
        cells = [r["name"], r["change"], r["steps"], f"{r['step_ms']:.0f}", f"{r['wall_s']:.0f}",
                 f"{r['cpu_s']:.0f}", f"{r['load'][0]:.1f}-{r['load'][1]:.1f}",
                 " / ".join(f"{by[s]:.3f}" for s in ("0", "32", "16")),
                 " / ".join(f"{by[s] / r['unigram_bpb']:.3f}" for s in ("0", "32", "16"))]
        if is_main_job(r, defaults):
            cells[0] = f"{r['name']} (the main job)"
            cells = [f"**{c}**" for c in cells]
        rows.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join([head, *rows])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="train one candidate and record it")
    r.add_argument("name")
    r.add_argument("change", help="what differs from the main job's settings, in words")
    r.add_argument("overrides", nargs="*")
    r.add_argument("--out-dir", default="/tmp/minidist-sweep")
    sub.add_parser("table", help="print the recorded runs as a markdown table")
    args = p.parse_args()
    if args.cmd == "run":
        cmd_run(args)
    else:
        records = [json.loads(line) for line in RECORDS.read_text().splitlines() if line.strip()]
        print(table(records))


if __name__ == "__main__":
    main()
