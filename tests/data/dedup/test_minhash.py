import numpy as np
import pytest
from datasketch import MinHash
from datasketch.lsh import _optimal_param

from llmkit.data.dedup.minhash import MinHashConfig, band_keys, lsh_params, minhash_signatures
from llmkit.data.dedup.shingles import ShingleConfig, shingle_hashes
from llmkit.errors import ConfigError

WORDS = ShingleConfig(word_ngram=1)  # shingle set = the document's set of words


def jaccard_estimate(sig_a: np.ndarray, sig_b: np.ndarray) -> float:
    """Share of equal slots: the MinHash estimate of the Jaccard similarity."""
    return float(np.count_nonzero(sig_a == sig_b)) / len(sig_a)


def candidate_probability(similarity: float, bands: int, rows: int) -> float:
    """Chance that two documents of this Jaccard similarity share at least one band."""
    return 1.0 - (1.0 - similarity ** rows) ** bands


def word_pairs(n_pairs, seed=0):
    """Pairs of documents of distinct words with a known Jaccard similarity."""
    rng = np.random.default_rng(seed)
    pairs = []
    for _ in range(n_pairs):
        size = int(rng.integers(50, 400))
        shared = int(rng.integers(0, size + 1))
        words = [f"w{i}" for i in rng.choice(10**6, 2 * size - shared, replace=False)]
        a, b = words[:size], words[:shared] + words[size:]
        pairs.append((a, b, shared / (2 * size - shared)))
    return pairs


def test_jaccard_estimates_agree_with_datasketch_within_sampling_error():
    k = 128
    pairs = word_pairs(80)
    batch = shingle_hashes([" ".join(d) for a, b, _ in pairs for d in (a, b)], WORDS)
    sig = minhash_signatures(batch, k)
    ours, theirs, truth = [], [], []
    for i, (a, b, j) in enumerate(pairs):
        ma, mb = MinHash(num_perm=k), MinHash(num_perm=k)
        ma.update_batch([w.encode() for w in a])
        mb.update_batch([w.encode() for w in b])
        ours.append(jaccard_estimate(sig[2 * i], sig[2 * i + 1]))
        theirs.append(ma.jaccard(mb))
        truth.append(j)
    ours, theirs, truth = map(np.array, (ours, theirs, truth))
    sigma = np.sqrt(truth * (1 - truth) / k)  # one estimator's standard error
    assert np.all(np.abs(ours - theirs) <= 4.5 * np.sqrt(2) * sigma + 1.5 / k)
    assert abs(np.mean(ours - theirs)) < 0.01  # neither is biased against the other
    rms = lambda e: np.sqrt(np.mean(e ** 2))  # noqa: E731
    assert rms(ours - truth) < 1.25 * rms(sigma)
    assert rms(theirs - truth) < 1.25 * rms(sigma)


@pytest.mark.parametrize("num_perm", [32, 128, 256])
@pytest.mark.parametrize("threshold", [0.3, 0.5, 0.8])
@pytest.mark.parametrize("weights", [(0.5, 0.5), (0.05, 0.95)])
def test_lsh_params_are_datasketchs_choice(num_perm, threshold, weights):
    assert lsh_params(threshold, num_perm, *weights) == _optimal_param(threshold, num_perm,
                                                                       *weights)


def test_default_bands_find_ten_percent_edited_copies_almost_surely():
    bands, rows = MinHashConfig().lsh()
    assert bands * rows <= 128
    # word 3-grams of a copy with 10 % of words substituted: Jaccard ≈ 0.9³ / (2 − 0.9³)
    assert candidate_probability(0.9 ** 3 / (2 - 0.9 ** 3), bands, rows) > 0.99
    assert candidate_probability(0.1, bands, rows) < 0.05


def test_signature_ignores_shingle_order_and_repeats_and_depends_on_seed():
    batch = shingle_hashes(["a b c d e f g", "g f e d c b a a a"], WORDS)
    sig = minhash_signatures(batch, 64)
    assert np.array_equal(sig[0], sig[1])
    assert not np.array_equal(sig[0], minhash_signatures(batch, 64, seed=2)[0])


def test_short_documents_fill_every_slot_and_empty_ones_match_only_each_other():
    batch = shingle_hashes(["one", "two words", "", ""], WORDS)
    sig = minhash_signatures(batch, 128)
    assert (sig[:2] != np.iinfo(np.uint64).max).all()
    assert np.array_equal(sig[2], sig[3]) and not np.array_equal(sig[0], sig[2])


def test_band_keys_equal_exactly_when_band_slots_equal():
    sig = np.array([[1, 2, 3, 4], [1, 2, 3, 5], [9, 2, 3, 4]], np.uint64)
    keys = band_keys(sig, 2, 2)
    assert keys.shape == (2, 3)
    assert keys[0, 0] == keys[0, 1] != keys[0, 2]
    assert keys[1, 0] == keys[1, 2] != keys[1, 1]


@pytest.mark.parametrize("bad", [{"threshold": 0.0}, {"bands": 4}, {"bands": 20, "rows": 20},
                                 {"num_perm": 0}])
def test_invalid_config_is_rejected(bad):
    with pytest.raises(ConfigError):
        MinHashConfig(**bad)
