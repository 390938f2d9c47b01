"""The context-extension recipe's training documents (recipes/long/build_data.py), as data: each
is an eval prompt of the `long` task with the answer the needle holds, at the lengths asked, as text
and as a chat."""

import re
from pathlib import Path

from tests.recipes.test_smollm2 import load

LONG = Path(__file__).resolve().parents[2] / "recipes" / "long"


def test_a_document_is_the_eval_prompt_then_the_answer_its_needle_holds(tok):
    build = load("build_data", LONG)
    docs = list(build.documents(tok, 8, (500, 700), first=0, seed=0))
    assert [d["id"].rsplit("-", 1)[0] for d in docs[:4]] == ["needle-en", "single_key-en", "needle-zh",
                                                            "single_key-zh"]
    assert len({d["text"] for d in docs}) == 8
    for d in docs:
        text = d["text"]
        assert 500 - 16 - 80 <= len(tok.encode(text)) <= 700  # the prompt leaves the reply 16 tokens
        if d["id"].startswith("single_key-en"):
            value = re.search(r"magic numbers for [\w-]+ is: (\d+)\.", text).group(1)
            assert text.endswith(f"mentioned in the provided text is {value}.")
        elif d["id"].startswith("single_key-zh"):
            value = re.search(r"的特殊魔法数字之一是：(\d+)。", text).group(1)
            assert text.endswith(f"的特殊魔法数字是{value}。")
        elif d["id"].startswith("needle-en"):
            fact = re.search(r"The best thing to do in \w+ is to [^.]+\.", text).group(0)
            assert text.endswith("?\n" + fact)  # the question, then the fact as the answer says it
        else:
            fact = re.search(r"在\w+?最值得做的事是[^。]+。", text).group(0)
            assert text.endswith("？\n" + fact)


def test_a_chat_asks_the_prompt_and_replies_with_the_answer_from_its_opening_words(tok):
    build = load("build_data", LONG)
    doc = next(build.documents(tok, 2, (500, 700), first=1, seed=0))  # single_key, en
    user, assistant = next(build.chats([doc]))["messages"]
    assert (user["role"], assistant["role"]) == ("user", "assistant")
    assert user["content"].endswith("mentioned in the provided text?")
    assert assistant["content"].startswith("The special magic number for ")
    assert user["content"] + "\n" + assistant["content"] == doc["text"]
