"""llmkit.dryrun: the arithmetic of `--dry-run`, against the model it describes and the formulas.
(The estimate against a measured run: tests/cli/test_dry_run.py.)"""

import dataclasses

import pytest
import torch

from llmkit.dryrun import (LOSS_CHUNK, Memory, Shape, activation_bytes, block_bytes, checkpoint_bytes,
                           human_bytes, loss_bytes, parameters, plan, state_bytes)
from llmkit.model.transformer import Transformer
from llmkit.model.config import ModelConfig
from llmkit.train.config import TrainConfig

SHAPES = [
    dict(vocab_size=300, hidden_size=32, n_layers=2, n_heads=4, n_kv_heads=2, intermediate_size=64),
    dict(vocab_size=300, hidden_size=32, n_layers=3, n_heads=4, n_kv_heads=4, intermediate_size=48,
         tie_embeddings=False),
    dict(vocab_size=100, hidden_size=16, n_layers=2, n_heads=2, n_kv_heads=1, intermediate_size=24,
         n_experts=4, experts_top_k=2),
    dict(vocab_size=100, hidden_size=16, n_layers=1, n_heads=2, n_kv_heads=1, intermediate_size=24,
         norm="layernorm"),
    dict(vocab_size=100, hidden_size=32, n_layers=2, n_heads=4, n_kv_heads=2, intermediate_size=48,
         attention_bias=True),  # Qwen2
    dict(vocab_size=100, hidden_size=32, n_layers=2, n_heads=4, n_kv_heads=2, intermediate_size=48,
         head_dim=12, qk_norm=True),  # Qwen3
]
IDS = ["gqa", "untied", "moe", "layernorm", "qkv-bias", "head-dim-qk-norm"]


QWEN3_5 = dict(vocab_size=100, hidden_size=32, n_layers=4, n_heads=4, n_kv_heads=2, intermediate_size=48,
               head_dim=16, qk_norm=True, attention_output_gate=True, rotary_fraction=0.25,
               zero_centred_norm=True, linear_n_key_heads=2, linear_n_value_heads=4, linear_key_head_dim=8,
               linear_value_head_dim=12, linear_conv_kernel=4,
               layer_types=["linear_attention"] * 3 + ["full_attention"])


QWEN3_5_MOE = dict(QWEN3_5, n_experts=4, experts_top_k=2, shared_expert_size=20)  # + the shared expert


@pytest.mark.parametrize("fields", [*SHAPES, QWEN3_5, QWEN3_5_MOE], ids=[*IDS, "qwen3_5-hybrid", "qwen3_5-moe"])
def test_parameters_are_the_models(fields):
    config = ModelConfig(**fields, max_seq_len=32)
    assert parameters(Shape.of(config)) == Transformer(config).num_parameters()
    assert Shape.of(dataclasses.asdict(config)) == Shape.of(config)  # a checkpoint's config.json


def saved_bytes(model, ids, doc_ids=None) -> int:
    """Bytes of the tensors autograd keeps for backward (parameters and buffers excluded)."""
    storages = {}
    own = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}

    def pack(t):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model.hidden_states(ids, doc_ids=doc_ids).sum()
    return sum(n for ptr, n in storages.items() if ptr not in own)


@pytest.mark.parametrize("fields, target", [
    (SHAPES[0], "all-linear"), (SHAPES[0], ["q_proj", "v_proj"]), (SHAPES[2], "all-linear"),
    (SHAPES[2], ["w1", "gate"]), (SHAPES[5], "all-linear"), (SHAPES[5], ["o_proj", "down_proj"]),
], ids=["gqa-all", "gqa-qv", "moe-all", "moe-w1-gate", "head-dim-all", "head-dim-o-down"])
def test_lora_parameters_are_what_peft_adds(fields, target):
    import peft

    from llmkit.dryrun import lora_parameters
    from llmkit.checkpoints.lora import LoraConfig, target_modules

    model = Transformer(ModelConfig(**fields, max_seq_len=32))
    names = target_modules(model, LoraConfig(r=4, target=target))
    peft.inject_adapter_in_model(peft.LoraConfig(r=4, target_modules=names), model)
    added = sum(p.numel() for name, p in model.named_parameters() if "lora_" in name)
    assert lora_parameters(Shape.of(model.config), 4, target) == added > 0


@pytest.mark.parametrize("fields, target", [
    (QWEN3_5, "all-linear"), (QWEN3_5, "attention"), (QWEN3_5, ["in_proj_b", "o_proj"]),
    (QWEN3_5_MOE, "all-linear"), (QWEN3_5_MOE, ["shared_expert_gate", "out_proj"]),
], ids=["hybrid-all", "hybrid-attention", "hybrid-b-o", "hybrid-moe-all", "hybrid-moe-shared-gate-out"])
def test_lora_and_dora_on_a_hybrid_model_are_what_peft_adds(fields, target):
    """The adapters of a hybrid model's blocks: Gated DeltaNet blocks count their own projections
    (in_proj_qkv/z/b/a, out_proj), full-attention blocks q/k/v/o with the output gate's rows."""
    import peft

    from llmkit.dryrun import dora_parameters, lora_parameters
    from llmkit.checkpoints.lora import LoraConfig, target_modules

    for dora in (False, True):
        model = Transformer(ModelConfig(**fields, max_seq_len=32))
        names = target_modules(model, LoraConfig(r=4, target=target))
        peft.inject_adapter_in_model(peft.LoraConfig(r=4, target_modules=names, use_dora=dora), model)
        added = sum(p.numel() for name, p in model.named_parameters() if "lora_" in name)
        expected = lora_parameters(Shape.of(model.config), 4, target) + dora * dora_parameters(Shape.of(model.config), target)
        assert expected == added > 0, dora


@pytest.mark.parametrize("kind", ["nf4", "int8"])
@pytest.mark.parametrize("fields", [QWEN3_5, QWEN3_5_MOE], ids=["hybrid", "hybrid-moe"])
def test_a_quantised_hybrid_base_is_priced_byte_for_byte(fields, kind):
    from llmkit.dryrun import quantized_bytes
    from llmkit.model import quant

    model = Transformer(ModelConfig(**fields, max_seq_len=32))
    linear = sum(m.weight.numel() for _, m in quant.block_linears(model))
    quant.quantize_linears(model, kind)
    assert quantized_bytes(Shape.of(model.config), kind) == (linear, quant.frozen_bytes(model)["quantized"])


@pytest.mark.parametrize("dense_mask", [False, True])
def test_activations_are_what_autograd_saves(dense_mask):
    """One block's figure is exactly what a block adds to autograd's saved tensors (fp32 on
    CPU, packed documents through the dense mask or plain causal attention)."""
    torch.manual_seed(0)
    fields = dict(vocab_size=50, hidden_size=64, n_heads=4, n_kv_heads=2, intermediate_size=160,
                  max_seq_len=64)
    B, T = 3, 64
    ids = torch.randint(0, 50, (B, T))
    doc_ids = torch.arange(T).repeat(B, 1) // 40 if dense_mask else None
    one, three = (saved_bytes(Transformer(ModelConfig(**fields, n_layers=n)), ids, doc_ids)
                  for n in (1, 3))
    shape = Shape.of(ModelConfig(**fields, n_layers=3))
    assert (three - one) / 2 == block_bytes(shape, B, T, dense_mask=dense_mask)
    assert activation_bytes(shape, B, T, dense_mask=dense_mask) == pytest.approx(three, rel=0.05)


def test_checkpointing_keeps_block_inputs_and_bf16_halves_activations_but_statistics():
    shape = Shape(vocab_size=1000, hidden_size=64, n_layers=4, n_heads=4, n_kv_heads=2,
                  intermediate_size=128)
    tokens = 2 * 128
    assert activation_bytes(shape, 2, 128, checkpointing=True) == (4 * 64 + 3 * 64) * tokens * 4
    assert block_bytes(shape, 2, 128, "bf16") == tokens * ((8 * 64 + 2 * 32 + 4 * 128) * 2 + 6 * 4)
    assert block_bytes(shape, 2, 128) == tokens * (8 * 64 + 2 * 32 + 4 * 128 + 4 + 2) * 4


def test_weights_gradients_and_optimizer_under_zero_stages():
    p = 1_000_000
    assert state_bytes(p, 0, "fp32", 0, 1) == dict(weights=4 * p, gradients=4 * p, optimizer=8 * p,
                                                   frozen=0, offloaded=0)
    assert state_bytes(p, 0, "bf16", 0, 4) == dict(weights=2 * p, gradients=2 * p, optimizer=12 * p,
                                                   frozen=0, offloaded=0)
    # ZeRO: 1 splits the optimizer state over the processes, 2 the gradients too, 3 the weights too
    assert state_bytes(p, 0, "bf16", 1, 4)["optimizer"] == 3 * p
    s2 = state_bytes(p, 0, "bf16", 2, 4)
    assert (s2["gradients"], s2["weights"]) == (p // 2, 2 * p)
    assert state_bytes(p, 0, "bf16", 3, 4)["weights"] == p // 2
    offloaded = state_bytes(p, 500, "bf16", 3, 4, offload_optimizer=True, offload_params=True)
    assert (offloaded["optimizer"], offloaded["weights"], offloaded["offloaded"]) == (0, 0, 3 * p + p // 2)
    assert offloaded["frozen"] == 1000  # frozen models held in the training precision


def test_the_chunked_loss_holds_one_chunk_of_logits():
    shape = Shape(vocab_size=32000, hidden_size=64, n_layers=1, n_heads=4, n_kv_heads=4,
                  intermediate_size=128)
    assert loss_bytes(shape, 8 * 4096, chunked=True) == 3 * LOSS_CHUNK * 32000 * 4
    assert loss_bytes(shape, 100, chunked=True) == 3 * 100 * 32000 * 4
    assert loss_bytes(shape, 8 * 4096, chunked=False) == 3 * 8 * 4096 * 32000 * 4


def test_checkpoint_holds_weights_twice_and_the_optimizer_state():
    assert checkpoint_bytes(10, 10, "fp32") == 10 * 4 + 10 * 4 + 10 * 8
    assert checkpoint_bytes(10, 12, "bf16") == 10 * 2 + 12 * 2 + 12 * 12


def test_a_plan_adds_up_and_prints_its_figures():
    shape = Shape(vocab_size=8192, hidden_size=256, n_layers=4, n_heads=4, n_kv_heads=2,
                  intermediate_size=704)
    n = parameters(shape)
    cfg = TrainConfig(max_steps=3, micro_batch_size=8, grad_accum=2)
    p = plan("pretrain", shape, trainable=n, total=n, unit="tokens", per_step=8 * 256 * 2 * 2,
             tokens_per_step=8 * 256 * 2 * 2, sequences=8, seq_len=256, cfg=cfg, world_size=2,
             chunked_loss=True)
    m = p.memory
    assert m == Memory(4 * n, 4 * n, 8 * n, activation_bytes(shape, 8, 256),
                       loss_bytes(shape, 2048, True))
    assert m.total == 16 * n + m.activations + m.loss and p.tokens == 8192 * 3
    lines = p.lines()
    assert lines[0] == "pretrain --dry-run: nothing is written"
    assert f"parameters          {n:,} ({n:,} trainable)" in lines
    assert "per step            8,192 tokens, on 2 processes" in lines
    assert f"memory per device   {human_bytes(m.total)}" in lines
    ckpt = plan("pretrain", shape, trainable=n, total=n, unit="tokens", per_step=1, tokens_per_step=1,
                sequences=8, seq_len=256, cfg=dataclasses.replace(cfg, activation_checkpointing=True))
    assert ckpt.memory.recompute == block_bytes(shape, 8, 256)
    assert ckpt.memory.total == 16 * n + ckpt.memory.activations + max(ckpt.memory.loss, ckpt.memory.recompute)


def test_human_bytes():
    assert [human_bytes(n) for n in (512, 3 * 2**20 + 2**19, 5 * 2**30)] == ["0.5 KiB", "3.5 MiB", "5.00 GiB"]


def test_long_sequences_keep_no_seq_by_seq_matrix_under_causal_attention():
    """At 4,096 tokens a block saves exactly the per-token figure (SDPA's causal CPU kernel keeps its
    log-sum-exp, not the [T, T] scores), so the estimate grows linearly to 8k-32k contexts; only a dense
    mask (packed documents on CPU) adds the T² term."""
    fields = dict(vocab_size=50, hidden_size=16, n_heads=2, n_kv_heads=1, intermediate_size=32, max_seq_len=4096)
    ids = torch.randint(0, 50, (1, 4096), generator=torch.Generator().manual_seed(0))
    one, two = (saved_bytes(Transformer(ModelConfig(**fields, n_layers=n)), ids) for n in (1, 2))
    shape = Shape.of(ModelConfig(**fields, n_layers=2))
    assert two - one == block_bytes(shape, 1, 4096)
    assert block_bytes(shape, 1, 32768) == 8 * block_bytes(shape, 1, 4096)
    assert block_bytes(shape, 1, 4096, dense_mask=True) - block_bytes(shape, 1, 4096) == 4 * 4096 ** 2
