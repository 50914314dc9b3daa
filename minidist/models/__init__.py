"""Models the recipes train: a small GPT, and torchvision's resnet18 adapted to 32x32."""

from minidist.models.gpt import GPT, Block, GPTConfig

__all__ = ["GPT", "Block", "GPTConfig", "resnet18_cifar"]


def __getattr__(name: str):
    # resnet pulls in torchvision; import it only when asked for.
    if name == "resnet18_cifar":
        from minidist.models.resnet import resnet18_cifar
        return resnet18_cifar
    raise AttributeError(name)
