import pytest
import torch
import torch.nn.functional as F

from llmkit.model import cpu_kernels
from llmkit.model.cpu_kernels import Bf16PanelWeight, F16PanelWeight, Int8PanelWeight, quantized_rows

needs = {kind: pytest.mark.skipif(not cpu_kernels.low_precision_available(kind), reason=f"needs the {kind} kernels")
         for kind in ("bf16", "f16", "int8")}
SHAPES = [(5, 3), (16, 64), (50, 33), (48, 96), (40, 160)]


ROWS = [1, 3, 5, 16]


@needs["bf16"]
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("out_features,in_features", SHAPES)
def test_a_bf16_product_is_the_float32_rows_times_the_rounded_weight(rows, out_features, in_features):
    weight, bias, x = torch.randn(out_features, in_features), torch.randn(out_features), torch.randn(rows, in_features)
    packed = Bf16PanelWeight(weight)
    assert torch.equal(packed.dequantized(), weight.bfloat16().float())  # nearest even, as torch rounds
    exact = F.linear(x.double(), weight.bfloat16().double(), bias.double())  # the rows as they are
    torch.testing.assert_close(packed.product(x, bias).double(), exact, atol=1e-5, rtol=1e-5)


@needs["f16"]
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("out_features,in_features", SHAPES)
def test_an_f16_product_is_the_float32_rows_times_the_rounded_weight(rows, out_features, in_features):
    weight, bias, x = torch.randn(out_features, in_features), torch.randn(out_features), torch.randn(rows, in_features)
    packed = F16PanelWeight(weight)
    assert torch.equal(packed.dequantized(), weight.half().float())  # nearest even, as torch rounds
    exact = F.linear(x.double(), weight.half().double(), bias.double())
    torch.testing.assert_close(packed.product(x, bias).double(), exact, atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(not cpu_kernels.low_precision_available("bf16")
                    or not cpu_kernels.library().llmkit_bf16_rows_supported(), reason="needs AVX512-BF16")
@pytest.mark.parametrize("rows", [1, 16])
def test_with_rounded_rows_a_bf16_product_rounds_the_rows_too(rows, monkeypatch):
    monkeypatch.setenv("LLMKIT_LOWPREC_ROWS", "rounded")
    weight, bias, x = torch.randn(50, 33), torch.randn(50), torch.randn(rows, 33)
    exact = F.linear(x.bfloat16().double(), weight.bfloat16().double(), bias.double())
    torch.testing.assert_close(Bf16PanelWeight(weight).product(x, bias).double(), exact, atol=1e-5, rtol=1e-5)


@needs["int8"]
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("out_features,in_features", SHAPES)
def test_an_int8_product_is_the_split_rows_times_the_quantised_weight(rows, out_features, in_features):
    weight, bias, x = torch.randn(out_features, in_features), torch.randn(out_features), torch.randn(rows, in_features)
    packed = Int8PanelWeight(weight)
    assert torch.allclose(packed.dequantized(), q8_0(weight), atol=1e-6)
    assert torch.allclose(quantized_rows(x), split_rows(x), atol=1e-6)
    # two 8-bit parts keep a row to 1/508 of its block's step (q8_0 alone: 1/2), within float32's rounding
    assert torch.all((quantized_rows(x) - x).abs() <= block_amax(x) / 127 / 508 + 1e-6)
    exact = F.linear(split_rows(x).double(), q8_0(weight).double(), bias.double())
    torch.testing.assert_close(packed.product(x, bias).double(), exact, atol=1e-5, rtol=1e-5)
    # and q8_0 keeps the weight to half a step of its block's scale
    step = block_amax(weight) / 127  # half a step, and what the scale loses to fp16
    assert torch.all((packed.dequantized() - weight).abs() <= step / 2 + step * 127 / 1024)


@needs["int8"]
@pytest.mark.parametrize("rows", [1, 5, 16])
def test_with_rounded_rows_an_int8_product_quantises_the_rows_as_q8_0(rows, monkeypatch):
    monkeypatch.setenv("LLMKIT_LOWPREC_ROWS", "rounded")
    weight, bias, x = torch.randn(50, 70), torch.randn(50), torch.randn(rows, 70)
    assert torch.allclose(quantized_rows(x, split=False), q8_0(x, fp16_scale=False), atol=1e-6)
    exact = F.linear(q8_0(x, fp16_scale=False).double(), q8_0(weight).double(), bias.double())
    torch.testing.assert_close(Int8PanelWeight(weight).product(x, bias).double(), exact, atol=1e-5, rtol=1e-5)


def split_rows(x: torch.Tensor) -> torch.Tensor:
    """The kernel's two-part rows in float32 as it computes them: per block of 32, d = max|x| / 127,
    s = x / d, q = round(s), r = round(254 (s - q)), back as d / 254 (254 q + r)."""
    rows, n = x.shape
    blocks = F.pad(x, (0, -n % 32)).view(rows, -1, 32)
    d = blocks.abs().amax(-1, keepdim=True) / 127
    s = blocks * torch.where(d > 0, 1 / d, 0)
    q = torch.round(s)
    r = torch.round((s - q) * 254)
    return (d / 254 * (q * 254 + r)).view(rows, -1)[:, :n]


def q8_0(x: torch.Tensor, fp16_scale=True) -> torch.Tensor:
    """GGUF q8_0 in float64 per row and block of 32: d = max|x| / 127, q = round(x / d), back as d q."""
    rows, n = x.shape
    blocks = F.pad(x.double(), (0, -n % 32)).view(rows, -1, 32)
    d = blocks.abs().amax(-1, keepdim=True) / 127
    q = torch.round(blocks / torch.where(d > 0, d, 1)).clamp(-127, 127)
    d = d.float().half().double() if fp16_scale else d.float().double()
    return (q * d).view(rows, -1)[:, :n].float()


def block_amax(x: torch.Tensor) -> torch.Tensor:
    rows, n = x.shape
    amax = F.pad(x.abs(), (0, -n % 32)).view(rows, -1, 32).amax(-1, keepdim=True)
    return amax.expand(-1, -1, 32).reshape(rows, -1)[:, :n]


@pytest.mark.parametrize("kind", [pytest.param(k, marks=needs[k]) for k in ("bf16", "f16", "int8")])
@pytest.mark.parametrize("rounded", [False, True])
def test_a_row_gets_the_same_low_precision_result_whatever_its_batch_and_the_thread_count(kind, rounded, monkeypatch):
    if rounded:
        monkeypatch.setenv("LLMKIT_LOWPREC_ROWS", "rounded")
    packed = dict(bf16=Bf16PanelWeight, f16=F16PanelWeight, int8=Int8PanelWeight)[kind](torch.randn(96, 70))
    x = torch.randn(16, 70)
    whole = packed.product(x)
    assert all(torch.equal(packed.product(x[i:i + 1])[0], whole[i]) for i in range(16))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(packed.product(x), whole)
    finally:
        torch.set_num_threads(threads)


def test_the_environment_variable_turns_the_low_precision_kernels_off(monkeypatch):
    monkeypatch.setenv("LLMKIT_CPU_KERNELS", "fp32")
    assert not any(cpu_kernels.low_precision_available(k) for k in ("bf16", "f16", "int8"))


@pytest.mark.parametrize("kind", [pytest.param(k, marks=needs[k]) for k in ("bf16", "f16")])
def test_a_bf16_or_f16_product_is_the_fp32_kernels_with_the_weight_rounded_bit_for_bit(kind):
    """Only the weights' rounding separates them from fp32: the same FMA chain over the float32 rows."""
    weight, bias, x = torch.randn(80, 96), torch.randn(80), torch.randn(5, 96)
    rounded = weight.bfloat16().float() if kind == "bf16" else weight.half().float()
    packed = (Bf16PanelWeight if kind == "bf16" else F16PanelWeight)(weight)
    assert torch.equal(packed.product(x, bias), cpu_kernels.PanelWeight(rounded).product(x, bias))
