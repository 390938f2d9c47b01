"""The language-model loss beside the model: chunked, yet equal to the full cross-entropy."""

import pytest
import torch

from llmkit.model.cross_entropy import IGNORE_INDEX, chunked_cross_entropy


@pytest.mark.parametrize("label_smoothing", [0.0, 0.2])
@pytest.mark.parametrize("chunk_size", [1, 4, 100])
def test_chunked_cross_entropy_equals_the_full_one_with_its_gradients(label_smoothing, chunk_size):
    torch.manual_seed(0)
    head = torch.nn.Linear(8, 11, bias=False)
    hidden = torch.randn(3, 5, 8, requires_grad=True)
    targets = torch.randint(0, 11, (3, 5))
    targets[0, :2] = IGNORE_INDEX
    targets[2, 4] = IGNORE_INDEX
    full = torch.nn.functional.cross_entropy(head(hidden).flatten(0, 1), targets.flatten(),
                                             label_smoothing=label_smoothing)
    expected = torch.autograd.grad(full, (hidden, head.weight))
    chunked = chunked_cross_entropy(head, hidden, targets, label_smoothing, chunk_size)
    torch.testing.assert_close(chunked, full)
    for a, b in zip(torch.autograd.grad(chunked, (hidden, head.weight)), expected):
        torch.testing.assert_close(a, b)
    with torch.no_grad():
        torch.testing.assert_close(chunked_cross_entropy(head, hidden, targets, label_smoothing, chunk_size), full)


def test_chunked_cross_entropy_without_labelled_tokens_is_a_zero_that_backpropagates():
    hidden = torch.randn(2, 3, 8, requires_grad=True)
    loss = chunked_cross_entropy(torch.nn.Linear(8, 11), hidden, torch.full((2, 3), IGNORE_INDEX))
    loss.backward()
    assert loss.item() == 0 and hidden.grad.abs().sum() == 0
