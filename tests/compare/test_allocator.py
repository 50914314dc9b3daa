"""The allocator's instrument (torch's profiler allocation events on the CPU) counts what lives."""

from __future__ import annotations

import torch

from minidist.compare.allocator import AllocatorPeak

MB = 2**20


def test_cpu_peak_counts_live_bytes_from_the_session_start():
    with AllocatorPeak(torch.device("cpu")) as peak:
        kept = torch.ones(MB // 4)                  # 1 MiB, alive through both windows
        with peak.window():
            tmp = torch.ones(2 * MB // 4)           # + 2 MiB, then freed: the first window's peak
            del tmp
        with peak.window():
            small = torch.ones(MB // 4)             # + 1 MiB: the second window's
            del small
    assert abs(peak.at_start - MB) < 4096
    first, second = peak.peaks
    assert abs(first - 3 * MB) < 4096 and abs(second - 2 * MB) < 4096
    assert peak.bytes == first and "profiler" in peak.instrument  # the higher: what a run needs room for
    del kept
