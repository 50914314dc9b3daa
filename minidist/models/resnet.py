"""torchvision's resnet18, adapted to 32x32 images (CIFAR-10).

The ImageNet stem (7x7 stride-2 conv, then a stride-2 max-pool) shrinks a 32x32
image to 8x8 before the first residual stage and loses most of it; the usual
CIFAR adaptation replaces it with one 3x3 stride-1 conv and drops the max-pool,
so the four stages see 32, 16, 8 and 4 pixels. `BasicBlock` is the FSDP unit.
"""

from __future__ import annotations

import torch.nn as nn
from torchvision.models import resnet18 as _tv_resnet18
from torchvision.models.resnet import BasicBlock

__all__ = ["resnet18_cifar", "BasicBlock"]


def resnet18_cifar(num_classes: int = 10) -> nn.Module:
    """resnet18 with a 3x3 stem, no max-pool and a num_classes head."""
    model = _tv_resnet18(weights=None, num_classes=num_classes)
    model.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
    nn.init.kaiming_normal_(model.conv1.weight, mode="fan_out", nonlinearity="relu")
    model.maxpool = nn.Identity()
    return model
