"""How the local generator reads a sampled token stream: where a sample ends and what it holds
(Magpie's stop tokens: the end of turn, the end of text, a role marker), without a model."""

from llmkit.synth.engine import LocalGenerator, special_ids
from llmkit.synth.prompts import parse_instruction


def reader(tok) -> LocalGenerator:
    gen = object.__new__(LocalGenerator)  # _completion reads only the tokenizer's ids
    gen.tokenizer, gen.stop_ids, gen.special_ids, gen.tokens = tok, set(tok.stop_ids), special_ids(tok), 0
    return gen


def test_a_sample_that_ends_at_eos_or_the_end_of_turn_is_one_closed_user_turn(tok):
    gen, words = reader(tok), tok.encode("What is two plus two?")
    for stop in (tok.end_of_turn_id, tok.eos_id):  # Magpie stops at both (its stop_token_ids)
        c = gen._completion(words + [stop] + tok.encode("more text"))
        assert c.stopped and not c.special and c.new_tokens == len(words) + 1
        assert c.text == tok.decode(words) and parse_instruction(c.text, c.stopped, c.special) is None
    cut = gen._completion(words)  # no stop token: cut at max_new_tokens
    assert parse_instruction(cut.text, cut.stopped, cut.special) == "no_end_of_turn"
    role = next(iter(tok.role_ids.values()))
    two = gen._completion(words + [role] + words + [tok.end_of_turn_id])  # a role marker: another turn
    assert parse_instruction(two.text, two.stopped, two.special) == "more_than_one_turn"
