"""Models the recipes train: a small GPT, and torchvision's resnet18 adapted to 32x32."""

from minidist.models.gpt import GPT, Block, GPTConfig

__all__ = ["GPT", "Block", "GPTConfig"]
