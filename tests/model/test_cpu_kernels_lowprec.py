import pytest
import torch
import torch.nn.functional as F

from llmkit.model import cpu_kernels
from llmkit.model.cpu_kernels import Bf16PanelWeight, F16PanelWeight, Int8PanelWeight, quantized_rows

needs = {kind: pytest.mark.skipif(not cpu_kernels.low_precision_available(kind), reason=f"needs the {kind} kernels")
         for kind in ("bf16", "f16", "int8")}
SHAPES = [(5, 3), (16, 64), (50, 33), (48, 96), (40, 160)]
ROWS = [1, 3, 5, 16]
SEED = 0  # each test's draws: the same inputs on every run
UNIT_ROUNDOFF = 2.0 ** -24  # float32's


def drawn(*shapes: tuple[int, ...]) -> list[torch.Tensor]:
    """Standard normal tensors of these shapes from one generator seeded with SEED."""
    generator = torch.Generator().manual_seed(SEED)
    return [torch.randn(shape, generator=generator) for shape in shapes]


def rounding_bound(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, roundings: int) -> torch.Tensor:
    """The most that `roundings` float32 roundings on each output's path can part x Wᵀ + bias from its exact value:
    γ_n (|bias| + |x| |W|ᵀ), γ_n = n u / (1 - n u) (Higham, Accuracy and Stability of Numerical Algorithms, 3.1
    and 4.2: a sum's n roundings, a term's own counted on the same path)."""
    n = roundings * UNIT_ROUNDOFF
    return n / (1 - n) * F.linear(x.double().abs(), weight.double().abs(), bias.double().abs())


def assert_within(actual: torch.Tensor, exact: torch.Tensor, bound: torch.Tensor):
    assert torch.all((actual.double() - exact).abs() <= bound)


@pytest.mark.parametrize("panel,dtype", [pytest.param(Bf16PanelWeight, torch.bfloat16, marks=needs["bf16"], id="bf16"),
                                         pytest.param(F16PanelWeight, torch.float16, marks=needs["f16"], id="f16")])
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("out_features,in_features", SHAPES)
def test_a_16_bit_product_is_the_float32_rows_times_the_rounded_weight(panel, dtype, rows, out_features, in_features):
    weight, bias, x = drawn((out_features, in_features), (out_features,), (rows, in_features))
    packed, rounded = panel(weight), weight.to(dtype)
    assert torch.equal(packed.dequantized(), rounded.float())  # nearest even, as torch rounds
    exact = F.linear(x.double(), rounded.double(), bias.double())  # the rows as they are
    # an FMA chain a column from the bias: a rounding an input (float64's own 2^29 times finer)
    assert_within(packed.product(x, bias), exact, rounding_bound(x, rounded, bias, in_features))


@pytest.mark.skipif(not cpu_kernels.low_precision_available("bf16")
                    or not cpu_kernels.library().llmkit_bf16_rows_supported(), reason="needs AVX512-BF16")
@pytest.mark.parametrize("rows", [1, 16])
def test_with_rounded_rows_a_bf16_product_rounds_the_rows_too(rows, monkeypatch):
    monkeypatch.setenv("LLMKIT_LOWPREC_ROWS", "rounded")
    weight, bias, x = drawn((50, 33), (50,), (rows, 33))
    exact = F.linear(x.bfloat16().double(), weight.bfloat16().double(), bias.double())
    # AVX512-BF16's dot product adds a pair's two (exact) products one at a time: 2 roundings a pair of 17
    bound = rounding_bound(x.bfloat16(), weight.bfloat16(), bias, 2 * 17)
    assert_within(Bf16PanelWeight(weight).product(x, bias), exact, bound)


@needs["int8"]
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("out_features,in_features", SHAPES)
def test_an_int8_product_is_the_split_rows_times_the_quantised_weight(rows, out_features, in_features):
    weight, bias, x = drawn((out_features, in_features), (out_features,), (rows, in_features))
    packed = Int8PanelWeight(weight)
    assert torch.equal(packed.dequantized(), q8_0(weight))
    assert torch.equal(quantized_rows(x), split_rows(x))
    # two 8-bit parts keep a row to 1/508 of its block's step (q8_0 alone: 1/2); float32 adds under 5 u max|x|:
    # s = x (1 / d) rounds twice, d / 254 and its product with 254 q + r twice, 254 (s - q) once at d's scale
    amax = block_amax(x)
    assert torch.all((quantized_rows(x) - x).abs() <= amax / 127 / 508 + 5 * UNIT_ROUNDOFF * amax)
    exact = F.linear(split_rows(x).double(), q8_0(weight).double(), bias.double())
    # a block's term rounded twice (its integer sum 254 q.w + r.w to float32, the scale d_w (d_x / 254)), the
    # sum once a block, and the reference's rows (d_x / 254) (254 q + r) once
    bound = rounding_bound(split_rows(x), q8_0(weight), bias, blocks(in_features) + 3)
    assert_within(packed.product(x, bias), exact, bound)
    # and q8_0 keeps the weight to half a step of its block's scale
    step = block_amax(weight) / 127  # half a step, and what the scale loses to fp16
    assert torch.all((packed.dequantized() - weight).abs() <= step / 2 + step * 127 / 1024)


@needs["int8"]
@pytest.mark.parametrize("rows", [1, 5, 16])
def test_with_rounded_rows_an_int8_product_quantises_the_rows_as_q8_0(rows, monkeypatch):
    monkeypatch.setenv("LLMKIT_LOWPREC_ROWS", "rounded")
    weight, bias, x = drawn((50, 70), (50,), (rows, 70))
    assert torch.equal(quantized_rows(x, split=False), q8_0(x, fp16_scale=False))
    exact = F.linear(q8_0(x, fp16_scale=False).double(), q8_0(weight).double(), bias.double())
    # a block's term rounded once (the scale d_w d_x; its integer sum is exact), the sum once a block, the
    # reference's rows d_x q once
    bound = rounding_bound(q8_0(x, fp16_scale=False), q8_0(weight), bias, blocks(70) + 2)
    assert_within(Int8PanelWeight(weight).product(x, bias), exact, bound)


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
    """GGUF q8_0 per row and block of 32 in float32, as ggml's quantize_row_q8_0 and the kernel compute it:
    d = max|x| / 127, q = round(x (1 / d)), back as d q (d rounded to fp16 where it is stored). float64's x / d
    rounds a near half the other way now and then (2 of the 400 weight
    matrices drawn here over 20 seeds)."""
    rows, n = x.shape
    blocks = F.pad(x, (0, -n % 32)).view(rows, -1, 32)
    d = blocks.abs().amax(-1, keepdim=True) / 127
    q = torch.round(blocks * torch.where(d > 0, 1 / d, 0))
    d = d.half().float() if fp16_scale else d
    return (q * d).view(rows, -1)[:, :n]  # exact: 8 bits times 11 (or 24)


def blocks(in_features: int) -> int:
    return -(-in_features // 32)


def block_amax(x: torch.Tensor) -> torch.Tensor:
    rows, n = x.shape
    amax = F.pad(x.abs(), (0, -n % 32)).view(rows, -1, 32).amax(-1, keepdim=True)
    return amax.expand(-1, -1, 32).reshape(rows, -1)[:, :n]


@pytest.mark.parametrize("kind", [pytest.param(k, marks=needs[k]) for k in ("bf16", "f16", "int8")])
@pytest.mark.parametrize("rounded", [False, True])
def test_a_row_gets_the_same_low_precision_result_whatever_its_batch_and_the_thread_count(kind, rounded, monkeypatch):
    if rounded:
        monkeypatch.setenv("LLMKIT_LOWPREC_ROWS", "rounded")
    weight, x = drawn((96, 70), (16, 70))
    packed = dict(bf16=Bf16PanelWeight, f16=F16PanelWeight, int8=Int8PanelWeight)[kind](weight)
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
    weight, bias, x = drawn((80, 96), (80,), (5, 96))
    rounded = weight.bfloat16().float() if kind == "bf16" else weight.half().float()
    packed = (Bf16PanelWeight if kind == "bf16" else F16PanelWeight)(weight)
    assert torch.equal(packed.product(x, bias), cpu_kernels.PanelWeight(rounded).product(x, bias))
