import pytest

from llmkit.model import cpu_kernels, packed_linear
from llmkit.model.decode_weights import CONVERTED
from llmkit.synth.engine import LocalGenerator
from llmkit.synth.requests import Sampling
from tests.train.posttrain_fixtures import tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see tests/conftest.py


@pytest.mark.parametrize("kind", ["bf16", "int8"])
def test_a_local_generator_decodes_and_scores_through_low_precision_weights(tok, kind, monkeypatch):
    if not cpu_kernels.low_precision_available(kind):
        pytest.skip(f"needs the {kind} kernels")
    monkeypatch.setattr(packed_linear, "MIN_ELEMENTS", 1)  # the tiny model's matrices are below the real bar
    model = tiny_model(tok.vocab_size, seed=3)
    chats = [[{"role": "user", "content": f"What is {i}+{i}?"}] for i in range(3)]
    fp32 = LocalGenerator(model, tok, batch_size=2).yes_probability(chats)
    gen = LocalGenerator(model, tok, batch_size=2, weights=kind)
    assert gen.yes_probability(chats) == pytest.approx(fp32, abs=2e-3)
    assert vars(model.lm_head).get(CONVERTED)  # the products went through the converted copy
    done = gen.complete(chats, Sampling(temperature=0.0, top_p=1.0, top_k=None, max_new_tokens=4), seed=0)
    assert len(done) == 3 and all(c.new_tokens >= 1 for c in done)
