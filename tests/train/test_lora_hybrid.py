"""LoRA and QLoRA (`llmkit.checkpoints.lora`, `llmkit.model.quant`) on the hybrid families: on tiny random
Qwen3.5 (Gated DeltaNet layers beside gated attention) and SmolLM3 (NoPE layers) models imported
from transformers' own classes, the `attention` and `all-linear` presets name the linear-attention
projections by peft's module names, and the loss and every adapter gradient equal peft's on the
transformers model to 1e-5 (fp32, the same A and B copied across), with the base in fp32 or held
in nf4 by bitsandbytes on both sides."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

from llmkit.cli.app import build_app
from llmkit.checkpoints.loading import load_model
from llmkit.checkpoints import lora
from llmkit.model import quant
from tests.hf.test_qwen3_5 import PATTERNS, save_qwen35
from tests.hf.test_smollm3 import save_smollm3

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see tests/conftest.py

MIXER = ["in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj"]  # transformers' Qwen3_5GatedDeltaNet
ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
MLP = ["gate_proj", "up_proj", "down_proj"]
SAVERS = {"qwen3_5": lambda folder: save_qwen35(folder, PATTERNS["three-linear-one-full"]),
          "smollm3": lambda folder: save_smollm3(folder, [1, 0, 1, 1])}


@pytest.fixture(scope="module", params=list(SAVERS))
def imported(request, tmp_path_factory):
    """(family, the transformers folder, the workspace run it was imported into)."""
    tmp = tmp_path_factory.mktemp(request.param)
    SAVERS[request.param](tmp / "hf")
    r = CliRunner().invoke(build_app(), ["import", "--from", str(tmp / "hf"), "-w", str(tmp / "ws")])
    assert r.exit_code == 0, r.output
    return request.param, tmp / "hf", tmp / "ws" / "imported"


def test_the_presets_name_the_linear_attention_projections(imported):
    family, _, run = imported
    model = load_model(run)[0]
    mixer = MIXER if family == "qwen3_5" else []
    assert sorted(lora.target_modules(model, lora.LoraConfig(r=4, target="attention"))) == sorted(ATTENTION + mixer)
    assert sorted(lora.target_modules(model, lora.LoraConfig(r=4))) == sorted(ATTENTION + mixer + MLP)


@pytest.mark.parametrize("kind, target", [("none", "all-linear"), ("nf4", "all-linear"), ("none", "attention")])
def test_loss_and_adapter_gradients_equal_peft_on_the_transformers_model(imported, kind, target):
    import peft
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    family, folder, run = imported
    cfg = lora.LoraConfig(r=4, alpha=8, quant=kind, target=target)
    ours = load_model(run)[0].train()
    targets = lora.target_modules(ours, cfg)
    lora.add_adapters(ours, cfg, run / "step-00000000", compute_dtype=torch.float32)
    with torch.no_grad():  # B = 0 at the start would leave A without a gradient
        for name, p in ours.named_parameters():
            if ".lora_B." in name:
                p.normal_(0, 0.2, generator=torch.Generator().manual_seed(len(name)))
    bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                             bnb_4bit_compute_dtype=torch.float32) if kind == "nf4" else None
    theirs = AutoModelForCausalLM.from_pretrained(folder, quantization_config=bnb, device_map="cpu",
                                                  dtype=torch.float32)
    theirs = peft.get_peft_model(theirs, peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                                                         target_modules=targets)).train()
    mine = dict(ours.named_parameters())
    with torch.no_grad():
        for name, p in theirs.named_parameters():
            if ".lora_" in name:
                p.copy_(mine[name.removeprefix(lora.PEFT_PREFIX)])
    if kind == "nf4":  # bitsandbytes packed every targeted layer, the mixers' small ones included, alike
        for name, module in ours.named_modules():
            if quant.is_quantized(module):
                their_weight = theirs.base_model.model.get_submodule(name).weight
                assert torch.equal(module.weight.data, their_weight.data), name

    ids = torch.randint(0, ours.config.vocab_size, (2, 80), generator=torch.Generator().manual_seed(0))  # > a chunk

    def loss_of(logits):
        return F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())

    our_loss, their_loss = loss_of(ours(ids)), loss_of(theirs(input_ids=ids, use_cache=False).logits)
    our_loss.backward()
    their_loss.backward()
    torch.testing.assert_close(our_loss, their_loss, atol=1e-5, rtol=0)
    grads = {n.removeprefix(lora.PEFT_PREFIX): p.grad for n, p in theirs.named_parameters() if ".lora_" in n}
    assert grads.keys() == {n for n in mine if ".lora_" in n}
    if family == "qwen3_5":
        assert any(".linear_attn.in_proj_b.lora_A" in n for n in grads)  # the mixers' projections are adapted
    for name, grad in grads.items():
        assert grad.abs().max() > 0, name
        torch.testing.assert_close(mine[name].grad, grad, atol=1e-5, rtol=0, msg=name)
