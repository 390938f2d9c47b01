"""The mixture of experts with a shared expert (`llmkit.model.mixture_of_experts`), as the hybrid MoE families
bring it: tiny random Qwen3.5-MoE (`qwen3_5_moe_text`, and the multimodal `qwen3_5_moe` folder) and
Qwen3-Next (`qwen3_next`: Qwen3.5's layers with fused Gated DeltaNet projections) models built and saved
by transformers' own classes import through `llmkit import` and give transformers' logits to 1e-4 in
fp32, on a sequence longer than a delta-rule chunk and on a left-padded batch; export writes them back
as folders transformers reads with the same logits; what llmkit's blocks cannot hold exits 2 naming
the key and leaves nothing in the workspace."""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from typer.testing import CliRunner

import llmkit
from llmkit.cli.app import build_app
from llmkit.model.gated_deltanet import CHUNK_SIZE
from llmkit.hf.mapping import from_hf_config
from tests.tokenizers.test_tokenizer_json import QWEN25_TEMPLATE, QWEN_SPECIALS, save_folder, train_bpe

LINEAR, FULL = "linear_attention", "full_attention"
SHAPE = dict(vocab_size=832, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
             max_position_embeddings=256, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
             linear_value_head_dim=8, linear_conv_kernel_dim=4, tie_word_embeddings=False, num_hidden_layers=3,
             layer_types=[LINEAR, LINEAR, FULL], num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
             shared_expert_intermediate_size=48)
FAMILIES = {"qwen3_5_moe_text": (transformers.Qwen3_5MoeTextConfig, transformers.Qwen3_5MoeForCausalLM),
            "qwen3_next": (transformers.Qwen3NextConfig, transformers.Qwen3NextForCausalLM)}

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see tests/conftest.py


def invoke(*args, code=0):
    r = CliRunner().invoke(build_app(), [str(a) for a in args])
    assert r.exit_code == code, r.output
    return r.output


def perturbed(model, seed=0):
    """Vectors (norms, decay rates, dt_bias) moved off their initial values, and router weights drawn
    wide enough that each token's top-k experts are far from a tie."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.add_(0.3 * torch.randn(p.shape, generator=generator))
            elif name.endswith(("mlp.gate.weight", "shared_expert_gate.weight")):
                p.copy_(torch.randn(p.shape, generator=generator) * 0.3)
    return model.eval()


def save(folder, family, **change):
    config_class, model_class = FAMILIES[family]
    torch.manual_seed(0)
    hf = perturbed(model_class(config_class(**{**SHAPE, **change})))
    hf.save_pretrained(folder)
    save_folder(folder, train_bpe(QWEN_SPECIALS), QWEN25_TEMPLATE, eos_token="<|im_end|>")
    return hf


def ids(batch=2, length=2 * CHUNK_SIZE - 27, seed=1):
    return torch.randint(0, SHAPE["vocab_size"], (batch, length), generator=torch.Generator().manual_seed(seed))


def max_diff(a, b) -> float:
    return (a - b).abs().max().item()


@pytest.fixture(scope="module", params=list(FAMILIES))
def imported(request, tmp_path_factory):
    """(family, transformers' model in fp32, llmkit's model imported through `llmkit import`)."""
    tmp = tmp_path_factory.mktemp(request.param)
    hf = save(tmp / "hf", request.param)
    invoke("import", "--from", tmp / "hf", "-w", tmp / "ws")
    return request.param, hf, llmkit.load(tmp / "ws" / "imported")[0].eval()


def test_the_config_reads_the_experts_and_the_shared_expert(imported):
    family, hf, model = imported
    cfg = model.config
    assert (cfg.n_experts, cfg.experts_top_k, cfg.intermediate_size, cfg.shared_expert_size) == (4, 2, 32, 48)
    assert cfg.layer_types == SHAPE["layer_types"] and cfg.attention_output_gate and cfg.rotary_dim == 4
    assert model.model.layers[0].block_sparse_moe.shared_expert_gate.weight.shape == (1, 64)


def test_logits_equal_transformers_on_a_sequence_longer_than_a_chunk(imported):
    family, hf, model = imported
    x = ids()
    with torch.no_grad():
        assert max_diff(model(x), hf(x, use_cache=False).logits) < 1e-4, family


def test_logits_equal_transformers_on_a_left_padded_batch(imported):
    family, hf, model = imported
    x = ids(batch=2, length=CHUNK_SIZE + 9)
    mask = torch.ones_like(x)
    mask[0, :11] = 0
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        ours = model(x, attention_mask=mask)
        theirs = hf(x, attention_mask=mask, position_ids=positions, use_cache=False).logits
    assert max_diff(ours[mask.bool()], theirs[mask.bool()]) < 1e-4, family


def test_the_shared_expert_counts(imported):
    """The shared expert's output taken away changes the logits: the parity above is not blind to it."""
    family, hf, model = imported
    x = ids(length=20)
    with torch.no_grad():
        before = model(x)
        for block in model.model.layers:
            block.block_sparse_moe.shared_expert.down_proj.weight.zero_()
        after = model(x)
        for block, theirs in zip(model.model.layers, hf.model.layers):  # put it back for the other tests
            block.block_sparse_moe.shared_expert.down_proj.weight.copy_(theirs.mlp.shared_expert.down_proj.weight)
    assert max_diff(before, after) > 1e-3


def test_the_multimodal_folder_imports_its_language_model(tmp_path):
    """A `qwen3_5_moe` folder (Qwen3_5MoeForConditionalGeneration) imports its language model, says the
    vision tower was left out, and gives transformers' text-only logits."""
    vision = dict(depth=1, hidden_size=32, intermediate_size=32, num_heads=2, out_hidden_size=64, patch_size=4,
                  temporal_patch_size=1, num_position_embeddings=16)
    config = transformers.Qwen3_5MoeConfig(text_config=transformers.Qwen3_5MoeTextConfig(**SHAPE).to_dict(),
                                           vision_config=vision)
    torch.manual_seed(0)
    hf = perturbed(transformers.Qwen3_5MoeForConditionalGeneration(config))
    hf.save_pretrained(tmp_path / "vl")
    save_folder(tmp_path / "vl", train_bpe(QWEN_SPECIALS), QWEN25_TEMPLATE, eos_token="<|im_end|>")
    output = invoke("import", "--from", tmp_path / "vl", "-w", tmp_path / "ws")
    assert "the vision tower" in output and "left out" in output
    model = llmkit.load(tmp_path / "ws" / "imported")[0].eval()
    x = ids()
    with torch.no_grad():
        assert max_diff(model(x), hf(input_ids=x).logits) < 1e-4


@pytest.mark.parametrize("change, key", [
    (dict(norm_topk_prob=False), "norm_topk_prob"),
    (dict(mlp_only_layers=[1], intermediate_size=40), "mlp_only_layers"),
    (dict(decoder_sparse_step=2, intermediate_size=40), "decoder_sparse_step"),
])
def test_a_qwen3_next_layout_llmkit_cannot_hold_exits_2_naming_the_key(tmp_path, change, key):
    save(tmp_path / "hf", "qwen3_next", **change)
    output = invoke("import", "--from", tmp_path / "hf", "-w", tmp_path / "ws", code=2)
    assert key in output and "Traceback" not in output
    assert not (tmp_path / "ws").exists() or not any((tmp_path / "ws").iterdir())


@pytest.mark.parametrize("family", list(FAMILIES))
def test_import_export_round_trips_and_transformers_reads_the_export(tmp_path, family):
    """Export writes Qwen's expert names (and Qwen3-Next's fused projections) back: transformers reads
    the folder with the source's logits, and importing it again gives the same weights."""
    hf = save(tmp_path / "hf", family)
    ws, out = tmp_path / "ws", tmp_path / "export"
    invoke("import", "--from", tmp_path / "hf", "--out", "run", "-w", ws)
    invoke("export", "--from", "run", "--to", out, "-w", ws)
    invoke("import", "--from", out, "--out", "back", "-w", ws)
    record = json.loads((out / "llmkit_export.json").read_text())
    assert record["architecture"] == FAMILIES[family][1].__name__ and record["max_abs_logit_diff"] < 1e-4
    exported = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    x = ids()
    with torch.no_grad():
        assert max_diff(exported(x, use_cache=False).logits, hf(x, use_cache=False).logits) < 1e-4
    run, back = llmkit.load(ws / "run")[0].state_dict(), llmkit.load(ws / "back")[0].state_dict()
    assert run.keys() == back.keys() and all(torch.equal(run[k], back[k]) for k in run)


def test_gguf_export_of_a_moe_model_exits_2_naming_it(tmp_path):
    save(tmp_path / "hf", "qwen3_5_moe_text")
    invoke("import", "--from", tmp_path / "hf", "--out", "run", "-w", tmp_path / "ws")
    output = invoke("export", "--from", "run", "--format", "gguf", "--to", tmp_path / "out", "-w", tmp_path / "ws",
                    code=2)
    assert "mixture-of-experts" in output and "Traceback" not in output
    assert not (tmp_path / "out").exists()


def test_the_family_is_kept_so_a_checkpoint_says_what_it_came_from():
    cfg = from_hf_config(transformers.Qwen3NextConfig(**SHAPE).to_dict())
    assert cfg.family == "qwen3_next"
    assert from_hf_config(json.loads(transformers.Qwen3_5MoeTextConfig(**SHAPE).to_json_string())).family is None
