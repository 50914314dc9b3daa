"""K training steps under context parallelism give the parameters of one process on the whole sequence:
the GPT at cp = 2 and 4 (ring and all_gather, contiguous and zigzag), and composed at 4 processes with
data parallelism over dp x cp (DDP, FSDP: cp ranks hold the same weights, their gradients are reduced
together) and with tensor parallelism inside (tp 2 x cp 2). The loss each step equals one process's too."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist

import minidist
from minidist import cp
from minidist.cp import Chunking, CPPolicy
from minidist.mesh import CP, DP_CP, TP, ParallelDims
from minidist.models.gpt import GPT, Block, GPTConfig
from minidist.sharding import cut
from minidist.tp import parallelize_gpt as tp_parallelize_gpt, sharding_of
from tests.cp.helpers import CFG, VARIANTS, batches

TOL = dict(rtol=1e-5, atol=1e-5)


def _train(model, data, rows=slice(None), cp_mesh=None, chunking=Chunking.ZIGZAG, steps_out=None) -> list[float]:
    """SGD steps on `data`, each rank its `rows` and (with cp_mesh) its tokens of them; the losses.

    SGD, not Adam: the keys' bias has a zero gradient (softmax ignores a shift of every score of a row),
    which both sides compute as rounding noise, and Adam would scale that noise up to a full step."""
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    losses = []
    for idx, y in data:
        idx, y = idx[rows], y[rows]
        if cp_mesh is not None:
            idx, y = cp.shard_batch(idx, y, cp_mesh, chunking)
        loss = model(idx, y)[1]
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def _reference(data, **overrides) -> tuple[GPT, list[float], GPT]:
    """(the trained one-process model, its losses, an untrained copy of the same start)."""
    torch.manual_seed(0)
    ref = GPT(GPTConfig(**{**CFG, **overrides}))
    start = copy.deepcopy(ref)
    return ref, _train(ref, data), start


def _assert_same(params: dict, ref: GPT, what: str) -> float:
    worst = 0.0
    for name, want in ref.state_dict().items():
        got = params[name]
        torch.testing.assert_close(got, want, **TOL, msg=lambda m: f"{what} {name}: {m}")
        worst = max(worst, (got - want).abs().max().item())
    return worst


def body_cp_equals_one_process(variants=VARIANTS, **overrides) -> dict:
    data = batches(3)
    ref, ref_losses, start = _reference(data, **overrides)
    layout = ParallelDims.infer(dist.get_world_size(), cp=dist.get_world_size()).build("cpu")
    worst = {}
    for rotate, chunking in variants:
        model = cp.parallelize_gpt(copy.deepcopy(start), layout[CP], CPPolicy(chunking, rotate))
        model = minidist.DDP(model, mesh=layout[DP_CP])  # the gradients averaged over cp
        losses = _train(model, data, cp_mesh=layout[CP], chunking=chunking)
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), **TOL)
        worst[f"{rotate.value} {chunking.value}"] = _assert_same(model.module.state_dict(), ref,
                                                                 f"{rotate} {chunking}")
    return worst


@pytest.mark.parametrize("world", [2, 4])
def test_gpt_steps_at_cp_equal_one_process(run_dist, world):
    print(world, "max |parameter difference| after 3 steps:", run_dist(world, body_cp_equals_one_process)[0])


def test_cp_with_activation_checkpointing_equals_one_process(run_dist):
    """Recomputing a block in backward runs its ring forward again, inside the backward; the result is unchanged."""
    run_dist(2, body_cp_equals_one_process, VARIANTS[:2], activation_checkpointing=True)


def body_cp_rank_gradients_are_partial() -> float:
    """Without the reduction over cp a rank's gradient is its tokens' only: far from the whole sequence's."""
    data = batches(1)
    _, _, start = _reference(data)
    ref = copy.deepcopy(start)
    idx, y = data[0]
    ref(idx, y)[1].backward()
    mesh = ParallelDims.infer(dist.get_world_size(), cp=dist.get_world_size()).build("cpu")[CP]
    model = cp.parallelize_gpt(copy.deepcopy(start), mesh)
    model(*cp.shard_batch(idx, y, mesh))[1].backward()
    return max((p.grad - q.grad).abs().max().item() for p, q in zip(model.parameters(), ref.parameters()))


def test_a_cp_rank_alone_has_a_partial_gradient(run_dist):
    assert min(run_dist(2, body_cp_rank_gradients_are_partial)) > 1e-3


def body_dp_x_cp(engine: str) -> float:
    """dp 2 x cp 2: each dp rank 2 of the 4 rows, each cp rank its tokens of them; the engine over dp_cp."""
    data = batches(3)
    ref, ref_losses, start = _reference(data)
    layout = ParallelDims.infer(4, cp=2).build("cpu")
    model = cp.parallelize_gpt(copy.deepcopy(start), layout[CP])
    if engine == "ddp":
        model = minidist.DDP(model, mesh=layout[DP_CP])
    else:
        model = minidist.FSDP(model, mesh=layout[DP_CP], wrap={Block})
    rows = slice(2 * layout.dp_rank, 2 * layout.dp_rank + 2)
    losses = _train(model, data, rows, layout[CP])
    mean = torch.tensor(losses)
    layout.all_reduce(mean)  # the loss of each dp rank's rows: their mean is the whole batch's
    torch.testing.assert_close(mean / layout.dp_size, torch.tensor(ref_losses), **TOL)
    state = model.module.state_dict() if engine == "ddp" else model.full_state_dict(rank0_only=False)
    return _assert_same(state, ref, f"dp2 x cp2 {engine}")


@pytest.mark.parametrize("engine", ["ddp", "fsdp"])
def test_dp2_x_cp2_equals_one_process(run_dist, engine):
    print(engine, "max |parameter difference|:", run_dist(4, body_dp_x_cp, engine)[0])


def body_tp_x_cp(plan: dict) -> float:
    """tp 2 x cp 2: the layers split over tp first, then the sequence over cp, DDP over dp_cp (the cp ranks)."""
    data = batches(3)
    ref, ref_losses, start = _reference(data)
    layout = ParallelDims.infer(4, cp=2, tp=2).build("cpu")
    model = tp_parallelize_gpt(copy.deepcopy(start), layout[TP], **plan)
    model = minidist.DDP(cp.parallelize_gpt(model, layout[CP]), mesh=layout[DP_CP])
    losses = _train(model, data, cp_mesh=layout[CP])
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), **TOL)
    tp_rank, worst = layout.coordinate[TP], 0.0
    ref_params = dict(ref.named_parameters())
    for name, p in model.module.named_parameters():
        spec = sharding_of(p)
        want = ref_params[name].detach() if spec is None else cut(ref_params[name].detach(), spec, tp_rank, 2)
        torch.testing.assert_close(p.detach(), want, **TOL, msg=lambda m: f"tp x cp {name}: {m}")
        worst = max(worst, (p.detach() - want).abs().max().item())
    return worst


@pytest.mark.parametrize("plan", [{}, dict(sequence_parallel=True, vocab_parallel=True)], ids=["tp", "tp+sp+vocab"])
def test_tp2_x_cp2_equals_one_process(run_dist, plan):
    print(plan, "max |parameter difference|:", run_dist(4, body_tp_x_cp, plan)[0])
