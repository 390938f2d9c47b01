from itertools import combinations

import numpy as np
import pytest

from llmkit.data.dedup.shingles import shingle_hashes
from llmkit.data.dedup.simhash import (SimHashConfig, block_masks, simhash_fingerprints,
                                       table_keys)
from llmkit.errors import ConfigError


def hamming(a: int, b: int) -> int:
    return int(a ^ b).bit_count()


@pytest.mark.parametrize("k,blocks", [(3, 4), (3, 6), (6, 8)])
def test_every_pair_within_k_bits_shares_a_table_key(k, blocks):
    masks = block_masks(k, blocks)
    assert len(masks) == len(list(combinations(range(blocks), k)))
    rng = np.random.default_rng(k * blocks)
    base = rng.integers(0, 2**63, 300, dtype=np.int64).astype(np.uint64)
    flips = [np.uint64(sum(1 << int(b) for b in rng.choice(64, k, replace=False)))
             for _ in base]
    near = base ^ np.array(flips, np.uint64)
    keys_a, keys_b = table_keys(base, masks), table_keys(near, masks)
    assert all(hamming(a, b) == k for a, b in zip(base, near))
    assert (keys_a == keys_b).any(axis=0).all()


def test_near_documents_get_near_fingerprints_and_unrelated_ones_do_not():
    cfg = SimHashConfig().shingles
    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in rng.integers(0, 5000, 300)]
    edited = list(words)
    for i in rng.choice(300, 6, replace=False):  # 2 % of the words
        edited[i] = "changed"
    other = [f"w{i}" for i in rng.integers(0, 5000, 300)]
    fp = simhash_fingerprints(shingle_hashes([" ".join(d) for d in (words, edited, other)],
                                             cfg))
    assert hamming(fp[0], fp[1]) <= SimHashConfig().hamming_k
    assert hamming(fp[0], fp[2]) > 16


def test_repeated_shingles_count_once():
    fp = simhash_fingerprints(shingle_hashes(["a b c", "a a b b c c c"],
                                             SimHashConfig().shingles))
    assert fp[0] == fp[1]


@pytest.mark.parametrize("bad", [{"hamming_k": 6, "blocks": 6}, {"hamming_k": 10, "blocks": 20}])
def test_invalid_config_is_rejected(bad):
    with pytest.raises(ConfigError):
        SimHashConfig(**bad)
