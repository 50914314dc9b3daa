"""The pipeline with the strategies it used to refuse, through the trainer: ZeRO (whose tied head is summed on
the local gradients before its one reduction per step), DDP under zb_h1 (whose weight gradients come after
the backwards end: the reduction waits for the schedule's end) and context parallelism (ring attention
inside every stage). Every run reads the same 8 sequences per step and ends where one process ends after
4 steps of a 4-block GPT (weights and validation loss; the logged training loss and clipped norm too):

    world  run                                                    checks
    1      single                                                 the reference
    4      zero1, dp 2 x pp 2, 1f1b                                the reference; one reduce_scatter per step
    4      zero2, dp 2 x pp 2, interleaved_1f1b (v 2)             (its bytes = the parameter all_gather's,
    4      zero1_broadcast, dp 2 x pp 2, zb_h1                     not 2 x: not once per micro-batch)
    4      ddp, dp 2 x pp 2, zb_h1, 4 micro-batches               the reference; stage 0's gradients
                                                                  all_reduced once per step
    4      zero2 as above, resumed from its step-2 checkpoint      the reference (ZeRO's shards per stage)
    4      ddp, pp 2 x cp 2 (dp 1), 1f1b                          the reference (each rank computes on half
                                                                  of every sequence's tokens: without ring
                                                                  attention in each stage it would differ)
"""

from __future__ import annotations

from tests.train.test_pipeline import _run as run_at

CLIP = 0.2
"""Below every step's norm: a norm summed over the wrong ranks (or a tie counted twice) changes every update."""
BASE = ["experiment=gpt_tiny", "model.n_layer=4", "trainer.eval_interval=0", "trainer.eval_batches=2",
        "trainer.log_interval=2", "data.max_bytes=200000", "data.val_percent=4", "trainer.steps=4",
        "trainer.ckpt_interval=0", "trainer.sample_bytes=0", f"trainer.grad_clip={CLIP}"]
INTERLEAVED = ("strategy.pp_schedule=interleaved_1f1b", "strategy.pp_virtual=2", "trainer.microbatches=2")
RUNS = {  # name: (strategy, pp, cp, extra)
    "zero1 dp2 x pp2": ("zero1", 2, 1, ("trainer.microbatches=2",)),
    "zero2 dp2 x pp2 interleaved": ("zero2", 2, 1, INTERLEAVED + ("trainer.ckpt_interval=2",)),
    "zero1_broadcast dp2 x pp2 zb_h1": ("zero1_broadcast", 2, 1, ("strategy.pp_schedule=zb_h1",
                                                                  "trainer.microbatches=2")),
    "ddp dp2 x pp2 zb_h1": ("ddp", 2, 1, ("strategy.pp_schedule=zb_h1", "trainer.microbatches=4")),
    "ddp pp2 x cp2": ("ddp", 2, 2, ("trainer.microbatches=2",)),
    "zero2 resumed at step 2": ("zero2", 2, 1, INTERLEAVED + (
        "resume={out}/zero2-dp2-x-pp2-interleaved/checkpoints/step_0000002",)),
}


def _run(out: str, name: str, strategy: str, pp: int = 1, cp: int = 1, extra: tuple[str, ...] = ()) -> dict:
    return run_at(out, name, strategy, pp=pp, cp=cp, extra=extra, base=BASE)


def _one_process(out: str) -> dict:
    return _run(out, "single", "single")


def _at_world_4(out: str) -> dict:
    return {name: _run(out, name.replace(" ", "-"), strategy, pp, cp, tuple(e.format(out=out) for e in extra))
            for name, (strategy, pp, cp, extra) in RUNS.items()}


def test_zero_and_cp_in_a_pipeline_end_at_one_process(run_dist, tmp_path):
    ref = run_dist(1, _one_process, str(tmp_path), timeout=180)[0]
    main = run_dist(4, _at_world_4, str(tmp_path), timeout=400)[0]
    for name, got in main.items():
        weights = max((got["state"][k] - v).abs().max().item() for k, v in ref["state"].items())
        assert weights < 1e-5, (name, weights)
        assert abs(got["val"] - ref["val"]) < 1e-5 * ref["val"], (name, got["val"], ref["val"])
        assert abs(got["loss"] - ref["loss"]) < 1e-5 * ref["loss"], (name, got["loss"], ref["loss"])
        assert abs(got["norm"] - ref["norm"]) < 1e-5 * ref["norm"], (name, got["norm"], ref["norm"])
    assert ref["norm"] > CLIP, ref["norm"]  # the clip was active
    for name in ("zero1 dp2 x pp2", "zero2 dp2 x pp2 interleaved"):
        comm = main[name]["comm"]  # rank 0: stage 0 (and 2), one reduction per step, not one per micro-batch
        assert comm["comm/reduce_scatter_bytes"] == comm["comm/all_gather_bytes"] > 0, (name, comm)
    assert "resumed from step 2" in main["zero2 resumed at step 2"]["log"], main["zero2 resumed at step 2"]["log"]
    zb = main["ddp dp2 x pp2 zb_h1"]  # rank 0 all_reduces stage 0's gradients once (+ the clip's scalars),
    stage0 = sum(4 * v.numel() for k, v in zb["state"].items()  # not once per BW (4 micro-batches)
                 if k.split(".")[0] in ("wte", "wpe") or k.startswith(("blocks.0.", "blocks.1.")))
    assert stage0 <= zb["comm"]["comm/all_reduce_bytes"] < 1.1 * stage0, (stage0, zb["comm"])
