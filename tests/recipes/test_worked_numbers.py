"""recipes/worked_numbers.py's formulas, held to what the engines send and keep.

The formulas are computed from a model's shapes alone; here each strategy runs one step of a tiny
GPT at N = 2 and the kernel's count of the bytes each process wrote to gloo's sockets
(minidist.comm.kernel_io) must agree with them, and so must the live bytes torch's MemTracker sees
after optimizer.step(). (At N = 4 and the docs' size: scripts/gen_docs_numbers.py worked_numbers_n4.)
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from minidist.comm import kernel_io


def body_measure(strategies, precision):
    import warnings

    import torch
    import torch.distributed as dist
    from torch.distributed._tools.mem_tracker import MemTracker

    from minidist.runtime import Topology
    from recipes import worked_numbers as wn
    from recipes.lessons.common import kernel_bytes
    cfg = replace(wn.SMALL, n_layer=2, n_embd=128, n_head=2, vocab_size=512, block_size=32)
    topo = Topology(dist.get_rank(), dist.get_world_size(), dist.get_rank(), "gloo", torch.device("cpu"),
                    dist.group.WORLD)
    n, e = topo.world_size, wn.PRECISIONS[precision][0]
    sh = wn.Shapes.of(cfg, (n,))
    idx = torch.randint(cfg.vocab_size, (2, cfg.block_size), generator=torch.Generator().manual_seed(topo.rank))
    out = {}
    for s in strategies:
        def step(model, opt, zero=True):
            model(idx, idx)[1].backward()
            opt.step()
            if zero:
                opt.zero_grad(set_to_none=True)
        mt = MemTracker()
        with warnings.catch_warnings(), mt:
            warnings.simplefilter("ignore", UserWarning)
            model, opt = wn.build(s, precision, cfg, topo)
            step(model, opt, zero=False)
            live = mt.get_tracker_snapshot("current")[torch.device("cpu")]["Total"]
        opt.zero_grad(set_to_none=True)
        step(model, opt)
        sent = kernel_bytes(lambda: step(model, opt))
        out[s] = (wn.sent_bytes(s, sh, n, e, n // 2), sent, wn.state_bytes(s, sh, n, precision, n // 2)[0], live)
    return out


@pytest.mark.skipif(not kernel_io.available(), reason="needs Linux /proc/self/io")
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_formulas_match_kernel_and_memtracker(run_dist, precision):
    strategies = ("ddp", "zero1", "zero2", "full_shard") + (("zero1_broadcast",) if precision == "fp32" else ())
    ranks = run_dist(2, body_measure, strategies, precision)
    for s in strategies:
        f_sent, k_sent, f_state, _ = ranks[0][s]
        live = max(r[s][3] for r in ranks)  # the formula is the largest rank's (owner-broadcast's shares differ)
        assert abs(k_sent / f_sent - 1) < 0.03, (s, f_sent, k_sent)   # gloo's headers on small messages
        # fp32: to the byte (the batch is the only other live tensor); bf16 FSDP keeps S_root/N more
        assert 0 <= live - f_state < (0.02 if precision == "fp32" else 0.06) * f_state + 4096, (s, f_state, live)
