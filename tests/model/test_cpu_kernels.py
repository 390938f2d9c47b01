import shutil

import pytest
import torch
import torch.nn.functional as F

from llmkit.model import cpu_kernels
from llmkit.model.cpu_kernels import PanelWeight, attends, decode_attention

needs_kernels = pytest.mark.skipif(not cpu_kernels.available(), reason="needs AVX-512 and a C++ compiler")


@needs_kernels
@pytest.mark.parametrize("rows", [1, 7, 8, 9, 16, 17, 40])
@pytest.mark.parametrize("out_features,in_features", [(5, 3), (16, 64), (48, 64), (50, 33)])
def test_a_product_is_x_times_the_transposed_weight_plus_the_bias(rows, out_features, in_features):
    weight = torch.randn(out_features, in_features)
    bias = torch.randn(2 * out_features)[::2]  # a strided view: the kernel needs (and keeps) a copy
    x = torch.randn(rows, 1, in_features)
    packed = PanelWeight(weight)
    exact = F.linear(x.double(), weight.double(), bias.double())
    torch.testing.assert_close(packed.product(x, bias), exact.float(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(packed.product(x), F.linear(x.double(), weight.double()).float(),
                               atol=1e-5, rtol=1e-5)


@needs_kernels
def test_a_row_gets_the_same_result_whatever_its_batch_and_the_thread_count():
    weight, x = torch.randn(96, 64), torch.randn(16, 64)
    packed = PanelWeight(weight)
    whole = packed.product(x)
    assert all(torch.equal(packed.product(x[i:i + 1])[0], whole[i]) for i in range(16))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(packed.product(x), whole)
    finally:
        torch.set_num_threads(threads)


@needs_kernels
def test_a_product_refuses_what_it_cannot_read():
    with pytest.raises(TypeError, match="float32"):
        PanelWeight(torch.randn(16, 8)).product(torch.randn(2, 8, dtype=torch.float64))


def cache_and_query(batch, heads, kv_heads, length, head_dim):
    """A query [B, H, 1, D] and the filled part of a KV cache [B, Hkv, length, D] that holds more."""
    k, v = torch.randn(2, batch, kv_heads, length + 9, head_dim)
    return torch.randn(batch, 1, heads, head_dim).transpose(1, 2), k[:, :, :length], v[:, :, :length]


@needs_kernels
@pytest.mark.parametrize("head_dim", [16, 32, 64, 128])
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (9, 3)])
def test_decoding_attention_equals_sdpa_with_padding_and_grouped_heads(head_dim, heads, kv_heads):
    q, k, v = cache_and_query(3, heads, kv_heads, 21, head_dim)
    key_mask = torch.rand(3, 21) > 0.4
    key_mask[:, -1] = True  # the new token's own key
    key_mask[1] = torch.arange(21) >= 13  # a sliding window's mask
    with torch.no_grad():
        assert attends(q, k, v)
        for mask in (None, key_mask):
            expected = F.scaled_dot_product_attention(q, k, v, None if mask is None else mask[:, None, None],
                                                      enable_gqa=heads != kv_heads)
            got = decode_attention(q, k, v, mask)
            torch.testing.assert_close(got, expected.transpose(1, 2).reshape(3, 1, -1), atol=2e-6, rtol=1e-5)
        shared = key_mask[1:2].expand(3, -1)  # one mask for every row, as a window without padding gives
        expected = F.scaled_dot_product_attention(q, k, v, shared[:, None, None], enable_gqa=heads != kv_heads)
        torch.testing.assert_close(decode_attention(q, k, v, shared), expected.transpose(1, 2).reshape(3, 1, -1),
                                   atol=2e-6, rtol=1e-5)


@needs_kernels
def test_decoding_attention_leaves_to_sdpa_what_it_does_not_take():
    q, k, v = cache_and_query(2, 4, 2, 5, 64)
    with torch.no_grad():
        assert attends(q, k, v)
        assert not attends(torch.cat([q, q], 2), k, v)  # more than one new token (a prefill)
        assert not attends(q.double(), k.double(), v.double())
        assert not attends(*cache_and_query(2, 4, 2, 5, 24))  # a head size it has no kernel for
        assert not attends(q, k.contiguous().transpose(2, 3).contiguous().transpose(2, 3), v)
    assert not attends(q, k, v)  # gradients: autograd's kernels


def test_a_failed_build_is_remembered_and_callers_keep_onednn(tmp_path, monkeypatch):
    source = tmp_path / "cpu_kernels.cpp"
    source.write_text("this is not C++\n")
    monkeypatch.setattr(cpu_kernels, "SOURCE", source)
    monkeypatch.setattr(cpu_kernels, "SOURCES", (source,))
    monkeypatch.setenv("CXX", shutil.which("g++") or shutil.which("false"))  # either fails on that source
    cpu_kernels.library.cache_clear()
    try:
        assert cpu_kernels.library() is None
        failed = list((tmp_path / "__pycache__").glob("*.failed"))
        assert len(failed) == 1 and "CalledProcessError" in failed[0].read_text()
        cpu_kernels.library.cache_clear()
        monkeypatch.setattr(cpu_kernels, "build", lambda *a: pytest.fail("built again"))
        assert cpu_kernels.library() is None and not cpu_kernels.available()
    finally:
        cpu_kernels.library.cache_clear()


@needs_kernels
@pytest.mark.parametrize("rows", [1, 16, 300])  # 300 x 576 values: the kernels' threads
def test_the_small_steps_compute_what_torch_computes(rows):
    from llmkit.model.transformer import rotate_half

    x, weight = torch.randn(rows, 576) * 3, torch.randn(576)
    expected = F.rms_norm(x, (576,), eps=1e-5) * weight
    torch.testing.assert_close(cpu_kernels.rms_norm(x, weight, 1e-5), expected, atol=1e-5, rtol=1e-5)

    gate_up = torch.randn(rows, 1, 2 * 40) * 8  # a grouped product's halves, as the MLP gets them
    gate, up = gate_up.split(40, -1)
    torch.testing.assert_close(cpu_kernels.silu_times(gate, up), F.silu(gate) * up, atol=1e-5, rtol=1e-5)
    if rows > 1:  # (one row has any stride)
        assert cpu_kernels.silu_times(gate, up.contiguous()) is None  # rows of another stride: torch's ops
    assert cpu_kernels.silu_times(gate_up[..., ::2], gate_up[..., 1::2]) is None  # values not contiguous

    qkv = torch.randn(2, rows, 5 * 64)  # [B, T, heads x D] -> [B, heads, T, D], as attention rotates it
    q = qkv.view(2, rows, 5, 64).transpose(1, 2)
    for cos, sin in (torch.randn(2, rows, 64), torch.randn(2, 2, 1, rows, 64)):  # [T, D] / [B, 1, T, D]
        expected = q * cos + rotate_half(q) * sin
        rotated = cpu_kernels.rotate_(q.clone(), cos, sin)
        torch.testing.assert_close(rotated, expected, atol=1e-5, rtol=1e-5)
    cos, sin = torch.randn(2, rows, 64)
    expected = q * cos + rotate_half(q) * sin
    assert cpu_kernels.rotate_(q, cos, sin) is q and torch.equal(qkv.view(2, rows, 5, 64).transpose(1, 2), q)
    torch.testing.assert_close(q, expected, atol=1e-5, rtol=1e-5)


@needs_kernels
def test_the_small_steps_leave_gradients_to_autograd():
    x = torch.randn(2, 8, requires_grad=True)
    assert not cpu_kernels.elementwise(x)
    with torch.no_grad():
        assert cpu_kernels.elementwise(x) and not cpu_kernels.elementwise(x.double())



@needs_kernels
def test_under_training_ops_a_pass_without_gradients_gives_the_training_pass_numbers_to_the_last_bit(
        monkeypatch):
    """The small steps' kernels round differently from torch's ops in the last bit; products rounded
    to bf16 (a LoRA base's `lora.base_products`) make that a visible difference, which a KL or DPO
    reward against the training pass would show where there is none."""
    from llmkit.model import packed_linear
    from llmkit.model.config import ModelConfig
    from llmkit.model.transformer import Transformer

    monkeypatch.setattr(packed_linear, "MIN_ELEMENTS", 1)
    model = Transformer(ModelConfig(vocab_size=256, hidden_size=256, n_layers=4, n_heads=4, n_kv_heads=2,
                                    intermediate_size=512, max_seq_len=64))
    model.init_weights(seed=0)
    model.requires_grad_(False)
    model.model.norm.weight.requires_grad_(True)  # the training pass: a gradient to take
    ids = torch.randint(0, 256, (4, 64), generator=torch.Generator().manual_seed(0))
    with packed_linear.packed_linears(model, frozen_only=True, frozen_dtype=torch.bfloat16):
        trained = model(ids).detach()
        with torch.no_grad():
            plain = model(ids)
            with cpu_kernels.training_ops():
                assert not cpu_kernels.elementwise(ids.float())
                as_trained = model(ids)
    assert torch.equal(as_trained, trained)
    assert not torch.equal(plain, trained)  # what it would be without: the kernels' ops, rounded apart
