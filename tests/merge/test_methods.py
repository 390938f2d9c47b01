"""The merge methods on single tensors: their defining properties, and equality with mergekit 0.1.5's
own functions where it is installed (the whole-model parity on transformers folders is in
test_stage.py)."""

import pytest
import torch

from llmkit.merge.methods import (elected_signs, gradient_value, linear, magnitude_mask, random_mask, rescaled,
                                  slerp, task_arithmetic)


def tensors(n, shape=(6, 5), seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g) for _ in range(n)]


def test_linear_is_the_weighted_mean_and_unnormalised_the_weighted_sum():
    a, b = tensors(2)
    assert torch.allclose(linear([a, b], [1.0, 3.0]), (a + 3 * b) / 4)
    assert torch.allclose(linear([a, b], [1.0, 3.0], normalize=False), a + 3 * b)


def test_slerp_ends_at_its_inputs_keeps_the_norm_of_equal_norms_and_falls_back_to_lerp_when_parallel():
    a, b = tensors(2)
    b = b * a.norm() / b.norm()
    assert torch.allclose(slerp(0.0, a, b), a, atol=1e-6) and torch.allclose(slerp(1.0, a, b), b, atol=1e-6)
    assert slerp(0.5, a, b).norm() == pytest.approx(a.norm().item(), rel=1e-5)  # on the sphere, not inside it
    assert slerp(0.5, a, b).norm() > ((a + b) / 2).norm()
    assert torch.equal(slerp(0.25, a, 2 * a), 0.75 * a + 0.25 * (2 * a))  # cos = 1: linear interpolation


def test_ties_keeps_the_largest_deltas_elects_the_sign_of_the_sum_and_averages_those_agreeing():
    base = torch.zeros(4)
    x = torch.tensor([3.0, -1.0, 0.1, 2.0])
    y = torch.tensor([1.0, 2.0, -0.2, -5.0])
    assert magnitude_mask(x, 0.5).tolist() == [1, 0, 0, 1]
    assert elected_signs(torch.stack([x, y])).tolist() == [[True, False, False, False], [True, True, True, True]]
    merged = task_arithmetic(base, [x, y], [1.0, 1.0], sparsify="magnitude", densities=[1.0, 1.0],
                             consensus=True, normalize=True)
    assert merged.tolist() == pytest.approx([2.0, 2.0, -0.2, -5.0])


def test_dare_keeps_about_density_of_each_delta_rescaled_to_its_l1_norm():
    delta = tensors(1, shape=(200, 200))[0]
    mask = random_mask(delta, 0.3, torch.Generator().manual_seed(1))
    assert mask.mean().item() == pytest.approx(0.3, abs=0.01)
    kept = rescaled(delta, mask)
    assert kept.abs().sum().item() == pytest.approx(delta.abs().sum().item(), rel=1e-5)
    assert torch.equal(kept != 0, mask.bool())


def test_a_gradient_is_interpolated_over_the_layers():
    assert [gradient_value([0.0, 1.0, 0.0], t) for t in (0, 0.25, 0.5, 1)] == [0.0, 0.5, 1.0, 0.0]
    assert gradient_value(0.3, 0.7) == 0.3


# -- equal to mergekit's own functions -------------------------------------------------------

def test_slerp_equals_mergekit_s_near_and_far_from_parallel():
    mk = pytest.importorskip("mergekit.merge_methods.slerp")
    a, b = tensors(2, shape=(64, 48))
    for v1 in (b, a + 1e-3 * b):  # an angle, and cos > 0.9995 (mergekit's linear fallback)
        for t in (0.0, 0.3, 1.0):
            theirs = mk.slerp(torch.tensor([t]), a.unsqueeze(0), v1.unsqueeze(0))[0]
            assert torch.equal(slerp(t, a, v1), theirs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("method", ["task_arithmetic", "ties", "dare_ties", "dare_linear"])
def test_task_vector_methods_equal_mergekit_s_group_merge(method, dtype):
    pytest.importorskip("mergekit")
    from mergekit.merge_methods import registry
    from mergekit.merge_methods.base import TensorEntry, TensorGroup

    from llmkit.merge.stage import TASK_VECTOR_METHODS

    base, x, y = tensors(3, shape=(32, 16), seed=3)
    base, x, y = base.to(dtype), (base + 0.1 * x).to(dtype), (base + 0.1 * y).to(dtype)
    params = {"weight": {"x": 0.7, "y": 0.4}, "density": {"x": 0.5, "y": 0.8}}
    sparsify, consensus, normalize, rescale = TASK_VECTOR_METHODS[method]
    group = TensorGroup(entries=(TensorEntry(id="base", tensor=base, is_base=True),
                                 TensorEntry(id="x", tensor=x, is_base=False),
                                 TensorEntry(id="y", tensor=y, is_base=False)))
    torch.manual_seed(11)
    theirs = registry.get(method).merge_group(group, int8_mask=False, normalize=normalize, rescale=rescale,
                                              **{"lambda": 1.0}, **params)
    ours = task_arithmetic(base, [x, y], [0.7, 0.4], sparsify=sparsify, densities=[0.5, 0.8], consensus=consensus,
                           normalize=normalize, rescale=rescale, generator=torch.Generator().manual_seed(11))
    assert torch.equal(ours, theirs)


def test_the_normalize_and_lambda_flags_equal_mergekit_s():
    pytest.importorskip("mergekit")
    from mergekit.merge_methods import registry
    from mergekit.merge_methods.base import TensorEntry, TensorGroup

    base, x, y = tensors(3, shape=(16, 8), seed=5)
    group = TensorGroup(entries=(TensorEntry(id="base", tensor=base, is_base=True),
                                 TensorEntry(id="x", tensor=x, is_base=False),
                                 TensorEntry(id="y", tensor=y, is_base=False)))
    for normalize, scale in ((True, 0.5), (False, 2.0)):
        theirs = registry.get("task_arithmetic").merge_group(
            group, int8_mask=False, normalize=normalize, rescale=False, **{"lambda": scale},
            weight={"x": 0.3, "y": 0.9}, density={"x": 1.0, "y": 1.0})
        ours = task_arithmetic(base, [x, y], [0.3, 0.9], normalize=normalize, scale=scale)
        assert torch.equal(ours, theirs)
