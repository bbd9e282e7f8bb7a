"""The tiny policy with a LoRA adapter that changes what it computes."""

import torch
from transformers import AutoModelForCausalLM

from lit_asyncrl.models.lora import LoRASettings, add_adapter


def adapted(model_path, rank=8, seed=0, target_modules=None):
    """The tiny policy with an adapter whose B is random (peft starts it at 0: no change)."""
    settings = (
        LoRASettings(rank=rank)
        if target_modules is None
        else LoRASettings(rank=rank, target_modules=tuple(target_modules))
    )
    policy = add_adapter(AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32), settings)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in policy.named_parameters():
            if "lora_B" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.1)
    return policy
