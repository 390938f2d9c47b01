import numpy as np

from llmkit.data.dedup.exact import ExactConfig, exact_hashes


def same(a, b, **cfg):
    h = exact_hashes([a, b], ExactConfig(**cfg))
    return bool(np.array_equal(h[0], h[1]))


def test_default_normalises_whitespace_only():
    assert same("Hello  world\n", "Hello world")
    assert not same("Hello world", "hello world")
    assert not same("Hello, world", "Hello world")


def test_case_and_punctuation_normalisation_are_configurable():
    assert same("Hello World", "hello world", lowercase=True)
    assert same("Hello, world!", "Hello world", strip_punctuation=True)
    assert not same("a  b", "a b", collapse_whitespace=False)


def test_different_texts_get_different_128_bit_hashes():
    texts = [f"document number {i}" for i in range(2000)]
    h = exact_hashes(texts, ExactConfig())
    assert len({tuple(r) for r in h.tolist()}) == 2000
    assert len(set(h[:, 0].tolist())) == 2000 and len(set(h[:, 1].tolist())) == 2000


def test_lowercasing_covers_non_ascii_letters():
    assert same("ÉCOLE Über", "école über", lowercase=True)
    assert not same("ÉCOLE Über", "école über")
