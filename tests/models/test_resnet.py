"""resnet18 adapted to 32x32: 3x3 stride-1 stem, no max-pool, 10 classes, full resolution into stage 1."""

import torch
import torch.nn as nn

from minidist.models import resnet18_cifar


def test_cifar_stem_keeps_resolution_and_outputs_classes():
    m = resnet18_cifar(num_classes=10).eval()
    assert m.conv1.kernel_size == (3, 3) and m.conv1.stride == (1, 1) and isinstance(m.maxpool, nn.Identity)
    seen = {}

    def record(mod, inputs, output):
        seen["layer1"] = output.shape

    m.layer1.register_forward_hook(record)
    with torch.no_grad():
        out = m(torch.randn(2, 3, 32, 32))
    assert out.shape == (2, 10) and seen["layer1"][-2:] == (32, 32)
