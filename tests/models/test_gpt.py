"""The plain GPT's checkpoint keys are fixed: the modules added for tensor parallelism
(CausalAttention, criterion) hold no state, so saved runs and minidist.models.load keep working."""

from minidist.models.gpt import GPT
from tests.common import tiny_gpt_config

KEYS_ONE_BLOCK = [
    "wte.weight", "wpe.weight",
    "blocks.0.ln_1.weight", "blocks.0.ln_1.bias", "blocks.0.attn.qkv.weight", "blocks.0.attn.qkv.bias",
    "blocks.0.attn.proj.weight", "blocks.0.attn.proj.bias", "blocks.0.ln_2.weight", "blocks.0.ln_2.bias",
    "blocks.0.mlp.fc.weight", "blocks.0.mlp.fc.bias", "blocks.0.mlp.proj.weight", "blocks.0.mlp.proj.bias",
    "ln_f.weight", "ln_f.bias", "lm_head.weight",
]


def test_state_dict_keys_are_the_checkpoint_format():
    model = GPT(tiny_gpt_config(n_layer=1))
    assert list(model.state_dict()) == KEYS_ONE_BLOCK
    assert model.lm_head.weight is model.wte.weight
