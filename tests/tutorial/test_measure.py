"""The track's measurements (what its pages quote) say what the pages claim, at world 2 on the small model."""

import torch
import torch.distributed as dist

from minidist.tutorial import measure


def _measure():
    sz = measure.SMALL
    x = torch.randn(16, sz.width, generator=torch.Generator().manual_seed(dist.get_rank()))
    return measure.ddp_steps(sz, x), measure.zero_step(sz, x), measure.fsdp_step(sz, x)


def test_measurements_agree_with_the_kernel_and_the_formulas(run_dist):
    sz = measure.SMALL
    s = 4 * (sz.width * sz.width + sz.width) * sz.depth  # fp32 bytes of the model
    for ddp, zero, fsdp in run_dist(2, _measure):
        names = list(ddp)
        assert [ddp[n]["calls"] for n in names[:5]] == [0, 2 * sz.depth, 1, 2 * sz.depth, ddp[names[4]]["calls"]]
        assert 1 < ddp[names[4]]["calls"] < 2 * sz.depth, "buckets: fewer calls than tensors, more than one"
        for name in names[1:]:  # every step sends DDP's 2 S (N-1)/N = S at N = 2; the kernel agrees
            assert ddp[name]["traced"] == s, (name, ddp[name])
            assert s <= ddp[name]["kernel"] <= 1.1 * s, (name, ddp[name])  # + gloo's headers
        assert ddp["no communication"]["kernel"] < 0.01 * s
        plain, paper, owner = zero["AdamW after DDP"], zero["ZeRO-1, the paper"], zero["owner-broadcast after DDP"]
        assert plain["state"] == 2 * s and paper["state"] == s and abs(owner["state"] - s) <= 0.3 * s, zero
        assert (plain["calls"], paper["calls"], owner["calls"]) == ("AR1", "RS1 AG1", f"AR1 BC{2 * sz.depth}"), zero
        assert plain["traced"] == paper["traced"] == s and owner["traced"] == 1.5 * s, zero  # S (N-1)/N per broadcast
        assert s <= paper["kernel"] <= 1.05 * s and 1.5 * s <= owner["kernel"] <= 1.6 * s, zero  # the kernel agrees
        fp32, bf16 = fsdp["fp32"], fsdp["bf16 compute"]
        assert fp32["held"] == s / 2 and fp32["all_gather"] == s and fp32["reduce_scatter"] == s / 2, fp32
        assert bf16["all_gather"] == s / 2 and bf16["reduce_scatter"] == s / 2, bf16  # gathered in bf16
        assert 1.5 * s <= fp32["kernel"] <= 1.6 * s and 0.95 * s <= bf16["kernel"] <= 1.1 * s, (fp32, bf16)
