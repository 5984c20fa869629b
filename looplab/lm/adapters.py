"""Low-rank adapters (LoRA, through peft) for fine-tuning a model dir's looped LM (``train.adapter = "lora"``).

peft's ``inject_adapter_in_model`` puts a LoRA pair (A [r, in], B [out, r]; B starts at zero, so the
model starts as the dir's) beside each chosen linear layer of the adapter *in place*: the model keeps its
looped-model protocol, so every schedule, regulariser (the JSRR penalty's gradient reaches the adapters
through the loop Jacobian) and exit runs on it unchanged. The dir's own weights are frozen; only the
adapters train, and a checkpoint holds them alone (``saved_keys``), the frozen weights being read from
the dir again when a run is resumed or evaluated. The targets are every linear layer but the output head
by default (attention and MLP projections, an injection, a gate), or those whose qualified names end with
one of ``train.adapter_targets``. A's start is drawn from the run's seed.
"""

from __future__ import annotations

import torch
from torch import nn

from looplab.errors import LooplabError
from looplab.model.protocol import output_heads
from looplab.seeding import derive_seed

__all__ = ["adapter_targets", "attach_lora", "check_targets"]


def _names(name: str, target: str) -> bool:
    """Whether ``target`` names the layer ``name`` by a whole dotted suffix (``q_proj`` names
    ``core.0.self_attn.q_proj``)."""
    return name == target or name.endswith(f".{target}")


def check_targets(targets: list[str], linears) -> None:
    """Refuse the first of ``targets`` that names none of the linear layers ``linears`` (qualified names), in
    one line listing the suffixes there are."""
    for target in targets:
        if not any(_names(name, target) for name in linears):
            suffixes = sorted({name.rsplit(".", 1)[-1] for name in linears})
            raise LooplabError(
                f"train.adapter_targets: {target!r} names no linear layer of the model; its linear layers end in "
                f"{', '.join(suffixes)}"
            )


def adapter_targets(model: nn.Module, targets: list[str]) -> list[str]:
    """The qualified names of the linear layers the adapters go beside: every ``nn.Linear`` but the output
    head(s) when ``targets`` is empty, else those whose name ends with one of ``targets`` (a whole dotted
    part: ``q_proj`` matches ``core.0.self_attn.q_proj``). A target that names no linear layer is refused."""
    heads = {id(head) for head in output_heads(model)}
    linears = [name for name, module in model.named_modules() if isinstance(module, nn.Linear)]
    if not targets:
        return [name for name in linears if id(model.get_submodule(name)) not in heads]
    check_targets(targets, linears)
    return [name for name in linears if any(_names(name, target) for target in targets)]


def attach_lora(model: nn.Module, rank: int, alpha: float, targets: list[str], seed: int) -> nn.Module:
    """``model`` with LoRA adapters of ``rank`` and scale ``alpha`` / ``rank`` beside :func:`adapter_targets`,
    in place: every other parameter frozen, ``model.saved_keys`` the adapters' state-dict keys."""
    from peft import LoraConfig, inject_adapter_in_model

    names = adapter_targets(model, targets)
    config = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.0, bias="none", target_modules=names)
    with torch.random.fork_rng(devices=[]):  # A's start from the run's seed, whatever ran before
        torch.manual_seed(derive_seed(seed, "lora"))
        model = inject_adapter_in_model(config, model)
    for name, parameter in model.named_parameters():
        parameter.requires_grad_("lora_" in name)
    model.saved_keys = frozenset(key for key in model.state_dict() if "lora_" in key)
    return model
