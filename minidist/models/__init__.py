"""Models the recipes train: a small GPT, and torchvision's resnet18 adapted to 32x32.

`load(run_dir)` returns the model a finished run wrote (minidist.models.saved).
"""

from minidist.models.gpt import GPT, Block, GPTConfig
from minidist.models.saved import load

__all__ = ["GPT", "Block", "GPTConfig", "resnet18_cifar", "load"]


def __getattr__(name: str):
    # resnet pulls in torchvision; import it only when asked for.
    if name == "resnet18_cifar":
        from minidist.models.resnet import resnet18_cifar
        return resnet18_cifar
    raise AttributeError(name)
