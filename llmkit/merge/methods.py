"""The merge methods on one tensor at a time, as mergekit 0.1.5 defines them (linear, slerp, task
arithmetic, TIES, DARE): pure functions of float32 tensors, each beside its parity test against
mergekit (tests/merge/test_methods.py).

Each computes in the dtype mergekit computes it in, so the tensors are mergekit's in every dtype:
linear and slerp in float32 (float64 stays float64), rounded once to the stored dtype by the caller;
the task-vector methods in the base's stored dtype (bfloat16 deltas, masks and sums on a bfloat16
model), DARE's draws in bfloat16 on a bfloat16 model and in float32 otherwise.
"""

from __future__ import annotations

import torch

# slerp falls back to linear interpolation above this |cos| between the two tensors (mergekit's
# dot_threshold): the sine of a near-zero angle would divide by almost nothing
DOT_THRESHOLD = 0.9995
NORM_EPS = 1e-8
_CHUNK = 1024 * 1024  # mergekit's chunk of elements for slerp's norms; the same chunks sum the same


def work_dtype(tensor: torch.Tensor) -> torch.dtype:
    return torch.float64 if tensor.dtype == torch.float64 else torch.float32


def linear(tensors: list[torch.Tensor], weights: list[float], normalize: bool = True) -> torch.Tensor:
    """sum_i w_i x_i, divided by sum_i w_i when `normalize` (Model Soups; mergekit's `linear`)."""
    dtype = work_dtype(tensors[0])
    w = torch.tensor(weights, dtype=dtype)
    out = torch.zeros_like(tensors[0], dtype=dtype)
    for tensor, weight in zip(tensors, w):
        out.addcmul_(tensor.to(dtype), weight)
    return out / w.sum() if normalize else out


def slerp(t: float, v0: torch.Tensor, v1: torch.Tensor, dot_threshold: float = DOT_THRESHOLD,
          eps: float = NORM_EPS) -> torch.Tensor:
    """Spherical interpolation from `v0` (t=0) to `v1` (t=1) over the whole tensor as one vector:
    the angle is that of the two tensors' directions, the magnitudes are interpolated with it. When
    the directions are (anti)parallel, |cos| > dot_threshold, it is linear interpolation; a tensor of
    norm <= eps is taken as is (norm 1) for the angle."""
    dtype = work_dtype(v0)
    a, b = v0.reshape(1, -1).to(dtype), v1.reshape(1, -1).to(dtype)
    if not a.shape[1]:
        return ((1 - t) * a + t * b).reshape(v0.shape)
    chunks = range(0, a.shape[1], _CHUNK)
    norm_a = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(a[:, i:i + _CHUNK], dim=1, keepdim=True)
                                                   for i in chunks]), dim=0)
    norm_b = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(b[:, i:i + _CHUNK], dim=1, keepdim=True)
                                                   for i in chunks]), dim=0)
    norm_a = torch.where(norm_a > eps, norm_a, 1)
    norm_b = torch.where(norm_b > eps, norm_b, 1)
    dot = torch.stack([(a[:, i:i + _CHUNK] / norm_a * (b[:, i:i + _CHUNK] / norm_b)).sum(dim=1, keepdim=True)
                       for i in chunks]).sum(dim=0).clamp(-1, 1)
    near_linear = dot.abs() > dot_threshold
    t_ = torch.tensor(t, dtype=dtype).reshape(1, 1)
    theta = torch.acos(torch.where(near_linear, 0, dot))
    sin_theta = torch.sin(theta)
    coef_a = torch.where(near_linear, 1 - t_, torch.sin((1 - t_) * theta) / sin_theta)
    coef_b = torch.where(near_linear, t_, torch.sin(t_ * theta) / sin_theta)
    return (coef_a * a + coef_b * b).reshape(v0.shape)


def magnitude_mask(delta: torch.Tensor, density: float) -> torch.Tensor:
    """TIES' trim: keep the int(density * n) entries largest in magnitude (at least one)."""
    if density >= 1:
        return torch.ones_like(delta)
    k = max(1, int(density * delta.numel()))
    mask = torch.zeros(delta.numel(), dtype=delta.dtype)
    mask[torch.argsort(delta.abs().reshape(-1).float(), descending=True)[:k]] = 1
    return mask.reshape_as(delta)


def draw_dtype(delta: torch.Tensor) -> torch.dtype:
    """Where DARE's mask is drawn and applied (mergekit on CPU: bfloat16 stays, the rest is float32)."""
    return torch.bfloat16 if delta.dtype == torch.bfloat16 else torch.float32


def random_mask(delta: torch.Tensor, density: float, generator: torch.Generator) -> torch.Tensor:
    """DARE's drop: keep each entry with probability `density`, drawn from `generator` as mergekit
    draws from torch's global one (bernoulli over a tensor of draw_dtype filled with density)."""
    if density >= 1:
        return torch.ones_like(delta)
    return torch.bernoulli(torch.full_like(delta, density, dtype=draw_dtype(delta)), generator=generator)


def rescaled(delta: torch.Tensor, mask: torch.Tensor, eps: float = 1e-7) -> torch.Tensor:
    """delta * mask scaled back to delta's L1 norm (mergekit's rescale for DARE, rather than the
    paper's 1/density: equal in expectation, exact per tensor)."""
    masked = delta * mask
    before, after = delta.abs().sum(), masked.abs().sum()
    if before < eps or after < eps:
        return masked
    return masked * (before / after)


def elected_signs(deltas: torch.Tensor) -> torch.Tensor:
    """TIES' sign election: per entry, True where a delta's sign is the sign of the deltas' sum
    (0 counts as +; a zero delta agrees with nothing but 0)."""
    majority = (deltas.sum(dim=0) >= 0).to(deltas.dtype) * 2 - 1
    return deltas.sign() == majority


def task_arithmetic(base: torch.Tensor, tensors: list[torch.Tensor], weights: list[float], *,
                    sparsify: str | None = None, densities: list[float] | None = None, consensus: bool = False,
                    normalize: bool = False, rescale: bool = False, scale: float = 1.0,
                    generator: torch.Generator | None = None) -> torch.Tensor:
    """base + scale * merged task vectors (x_i - base), mergekit's generalized task arithmetic:
    task_arithmetic (no sparsify, no consensus), ties (magnitude + consensus), dare_ties (random +
    consensus), dare_linear (random). Each delta is sparsified (`densities[i]`, rescaled to its L1
    norm when `rescale`), weighted; with `consensus` only deltas agreeing with the elected sign count.
    `normalize` divides by the sum of the weights that count at each entry (1 where none does)."""
    dtype = base.dtype
    deltas = torch.empty((len(tensors), *base.shape), dtype=dtype)
    for i, tensor in enumerate(tensors):
        delta = tensor - base
        if sparsify == "magnitude" and densities[i] < 1:
            mask = magnitude_mask(delta, densities[i])
            delta = rescaled(delta, mask) if rescale else delta * mask
        elif sparsify == "random" and densities[i] < 1:
            mask = random_mask(delta, densities[i], generator)
            kept = delta.to(mask.dtype)
            delta = (rescaled(kept, mask) if rescale else kept * mask).to(delta.dtype)
        deltas[i] = delta
    w = torch.tensor(weights, dtype=dtype).reshape(-1, *([1] * base.dim()))
    deltas.mul_(w)
    if consensus:
        agree = elected_signs(deltas).to(dtype)
        mixed, divisor = (deltas * agree).sum(dim=0), (w * agree).sum(dim=0)
        divisor[divisor == 0] = 1
    else:
        mixed, divisor = deltas.sum(dim=0), w.sum(dim=0)
        divisor[divisor.abs() < 1e-8] = 1
    if normalize:
        mixed = mixed / divisor
    if scale != 1:
        mixed = mixed * scale
    return (base + mixed).to(dtype)


def gradient_value(values: float | list[float], t: float) -> float:
    """A parameter given as a gradient (a list) at position t in [0, 1], interpolated piecewise
    linearly as mergekit does (layer i of n is at t = i / (n - 1); the tensors outside the layers at 0)."""
    if not isinstance(values, (list, tuple)):
        return values
    scaled = t * (len(values) - 1)
    i0 = int(scaled)
    i1 = min(len(values) - 1, i0 + 1)
    frac = scaled - i0
    return (1 - frac) * values[i0] + frac * values[i1]
