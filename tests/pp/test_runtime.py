"""K steps of every schedule at pp = 2 and 4 leave the parameters of one process on the whole batch,
and those of torch.distributed.pipelining's own schedules on the same split; what travels is traced."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from minidist import comm, pp
from tests.pp.helpers import (gpt, mlp, mse, pipeline, reference_gpt, reference_mlp, max_diff, sgd, token_batches,
                              train, vector_batches)

LAYERS = 8
"""Enough blocks for pp = 4 with 2 stages per rank."""


def _cases(p: int) -> list[tuple[str, int, int]]:
    """(schedule, stages per rank, micro-batches) at pp = p, batches of 8: m < p included for 1F1B and ZB-H1."""
    return [("gpipe", 1, 4), ("1f1b", 1, 1), ("1f1b", 1, 2), ("1f1b", 1, 8), ("zb_h1", 1, 2), ("zb_h1", 1, 8),
            ("interleaved_1f1b", 2, p), ("interleaved_1f1b", 2, 8)]


def _every_schedule() -> dict:
    rank, p = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (p,), mesh_dim_names=("pp",))
    data = token_batches()
    ref = reference_gpt(data, LAYERS)
    ref_adam = reference_gpt(data, LAYERS, opt=lambda ps: torch.optim.AdamW(ps, lr=1e-2))
    out = {}
    for name, v, m in _cases(p):
        cut = pp.split_gpt(gpt(LAYERS), p * v)
        pipe = pipeline(cut, pp.build(name, p, m, v), mesh, rank)
        losses = train(pipe, data, gpt_data=True)
        out[f"{name} v={v} m={m}"] = (max_diff(pipe.stages.values(), ref), losses[-1])
    cut = pp.split_gpt(gpt(LAYERS), p)
    pipe = pipeline(cut, pp.build("1f1b", p, 4), mesh, rank)
    losses = train(pipe, data, gpt_data=True, opt=lambda ps: torch.optim.AdamW(ps, lr=1e-2))
    out["1f1b m=4 adamw"] = (max_diff(pipe.stages.values(), ref_adam), losses[-1])
    return out


@pytest.mark.parametrize("world", [2, 4])
def test_every_schedule_equals_one_process(run_dist, world):
    results = run_dist(world, _every_schedule, timeout=180)
    for rank, res in enumerate(results):
        for case, (diff, loss) in res.items():
            assert diff < (1e-5 if "adamw" in case else 2e-6), \
                f"pp={world} rank {rank} {case}: max |param - one process| = {diff}"
            assert (loss is not None) == (rank == world - 1), (case, rank, loss)  # the last stage's rank has it


# ------------------------------------------------------------------------------ torch's own
def _torch_pipeline(name: str, p: int, m: int, v: int, data) -> dict[str, torch.Tensor]:
    from torch.distributed.pipelining import (PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B,
                                              ScheduleInterleavedZeroBubble)
    rank = dist.get_rank()
    cut = pp.split_sequential(mlp(), [k * 8 // (p * v) for k in range(1, p * v)])
    stages = [PipelineStage(cut.modules[s], s, p * v, torch.device("cpu")) for s in pp.stages_of(rank, p, v)]
    cls = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B, "interleaved_1f1b": ScheduleInterleaved1F1B,
           "zb_h1": ScheduleInterleavedZeroBubble}[name]
    multi = cls in (ScheduleInterleaved1F1B, ScheduleInterleavedZeroBubble)  # they take a list of stages
    sched = cls(stages if multi else stages[0], m, loss_fn=mse)
    opt = sgd([q for s in stages for q in s.submod.parameters()])
    for x, y in data:
        opt.zero_grad()
        sched.step(x, target=y) if rank == 0 else sched.step(target=y)
        opt.step()
    return {n: q.detach() for s in stages for n, q in s.submod.named_parameters()}


def _against_torch() -> dict:
    rank, p = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (p,), mesh_dim_names=("pp",))
    data = vector_batches()
    ref = reference_mlp(data)
    out = {}
    for name, v in (("gpipe", 1), ("1f1b", 1), ("interleaved_1f1b", 2), ("zb_h1", 1)):
        theirs = _torch_pipeline(name, p, 4, v, data)
        cut = pp.split_sequential(mlp(), [k * 8 // (p * v) for k in range(1, p * v)])
        pipe = pipeline(cut, pp.build(name, p, 4, v), mesh, rank)
        train(pipe, data, gpt_data=False)
        mine = {n: q.detach() for s in pipe.stages.values() for n, q in s.module.named_parameters()}
        assert mine.keys() == theirs.keys()
        out[name] = (max((mine[n] - theirs[n]).abs().max().item() for n in mine),
                     max_diff(pipe.stages.values(), ref))
    return out


@pytest.mark.parametrize("world", [2, 4])
def test_every_schedule_equals_torch_pipelining(run_dist, world):
    for rank, res in enumerate(run_dist(world, _against_torch, timeout=180)):
        for name, (vs_torch, vs_one) in res.items():
            assert vs_torch < 1e-6 and vs_one < 1e-6, f"pp={world} rank {rank} {name}: {vs_torch} from torch's, " \
                f"{vs_one} from one process"


# ------------------------------------------------------------------------------ what travels
def _traced() -> dict:
    rank, p = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (p,), mesh_dim_names=("pp",))
    cut = pp.split_sequential(mlp(width=16), [4])
    sched = pp.build("1f1b", p, 4)
    pipe = pipeline(cut, sched, mesh, rank)
    data = vector_batches(steps=2, width=16)
    steps = []
    for x, y in data:
        with comm.trace() as t:
            pipe.step(x, target=y)
        steps.append([(r.op, r.group.split(":")[-1], r.numel, r.sent_bytes) for r in t.records])
    return dict(steps=steps, timeline=[w for w, _, _ in pipe.timeline],
                sends=sum(a.kind.name.startswith("SEND") for a in sched.actions[rank]))


def test_messages_are_traced_and_headers_go_once(run_dist):
    r0, r1 = run_dist(2, _traced)
    micro = 2 * 16  # a micro-batch's activation: 2 rows of width 16
    first, second = r0["steps"]
    assert second == [("send", "0>1", micro, 4 * micro)] * 4 + [("recv", "1>0", micro, 0)] * 4 or \
        sorted(second) == sorted([("send", "0>1", micro, 4 * micro)] * 4 + [("recv", "1>0", micro, 0)] * 4), second
    headers = [rec for rec in first if rec[2] == 10]
    assert len(headers) == 1 and headers[0][0] == "send", "one header, on the first activation only"
    assert len(r1["steps"][1]) == 8 and {g for _, g, _, _ in r1["steps"][1]} == {"0>1", "1>0"}
    assert r0["timeline"][:4] == ["F0", "wait", "F1", "wait"] and r0["sends"] == 4


def _refusals() -> list[str]:
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("pp",))
    cut = pp.split_sequential(mlp(), [4])
    out = []
    for call in (lambda: pp.Pipeline([pp.Stage(cut.modules[1 - rank], 1 - rank, 2)], pp.build("1f1b", 2, 2), mesh, mse),
                 lambda: pp.Pipeline([pp.Stage(cut.modules[rank], rank, 2)], pp.build("1f1b", 4, 4), mesh, mse),
                 lambda: pipeline(cut, pp.build("1f1b", 2, 3), mesh, rank).step(torch.zeros(8, 12),
                                                                                target=torch.zeros(8, 12)),
                 lambda: pipeline(cut, pp.build("1f1b", 2, 2), mesh, rank).step(torch.zeros(8, 12))):
        with pytest.raises(ValueError) as e:
            call()
        out.append(str(e.value))
    return out


def test_what_does_not_fit_is_refused_in_one_line(run_dist):
    wrong_stage, wrong_size, micro, no_target = run_dist(2, _refusals)[0]
    assert wrong_stage == "rank 0 of the pipeline must hold stages [0] of 2; it was given [1]"
    assert wrong_size == "schedule 1f1b is for pp=4 ranks; the mesh has 2"
    assert micro.startswith("microbatches=3 must divide the batch's 8 samples")
    assert "every rank of the pipeline passes the batch and its targets" in no_target
