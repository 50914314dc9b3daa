"""Where a run lives: <out_dir>/<name>, the same path on every rank.

A missing name is chosen once, by the mesh's main process, from the model, the
strategy and a timestamp, and broadcast to every rank: two ranks reading the clock
could straddle a second and write into two directories.
"""

from __future__ import annotations

import datetime
from pathlib import Path

import torch
from torch.distributed.device_mesh import DeviceMesh

from minidist import Topology, comm
from minidist.mesh import is_main

NAME_BYTES = 256


def run_dir_for(cfg, topo: Topology, mesh: DeviceMesh, prefix: str | None = None) -> Path:
    """<out_dir>/<name>; without cfg.name, the main process's choice, shared with every rank.

    The chosen name is <prefix>-<timestamp>, prefix defaulting to <model>-<strategy>.
    """
    name = cfg.name
    if not name:
        buf = torch.zeros(NAME_BYTES, dtype=torch.uint8, device=topo.device)  # NCCL: device tensors only
        if is_main(mesh):
            stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
            raw = f"{prefix or f'{cfg.model.name}-{cfg.strategy.name}'}-{stamp}".encode()[:NAME_BYTES]
            buf[:len(raw)] = torch.tensor(list(raw), dtype=torch.uint8, device=topo.device)
        comm.broadcast(buf, src=int(mesh.mesh.flatten()[0]))  # the whole job, from the main process
        name = bytes(buf[buf != 0].cpu().tolist()).decode()
    return Path(cfg.out_dir) / name
