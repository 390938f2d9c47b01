"""What `llmkit synth` asks a model, in English and Chinese, and how it reads the replies.

Each prompt is a user turn (the model's chat template wraps it); the manifest records the
templates a run used (`templates`). A parser returns what it found or the reason a reply is
removed — a removed row keeps that reason.
"""

from __future__ import annotations

import re

QA = {
    "en": ("Read the document and write one question that it answers, then the answer, using only "
           "facts stated in the document. Reply in exactly this form:\nQuestion: <the question>\n"
           "Answer: <the answer>\n\nDocument:\n{document}"),
    "zh": ("阅读下面的文档，提出一个文档能够回答的问题，并只用文档中陈述的事实给出答案。严格按以下格式回答：\n"
           "问题：<问题>\n答案：<答案>\n\n文档：\n{document}"),
}

GROUNDING = {
    "en": ("Document:\n{document}\n\nQuestion: {question}\nProposed answer: {answer}\n\nIs the "
           "proposed answer supported by the document? Reply with Yes or No."),
    "zh": ("文档：\n{document}\n\n问题：{question}\n候选答案：{answer}\n\n文档是否支持这个候选答案？请回答“是”或“否”。"),
}
# grounding=likelihood: the answer's likelihood as the reply to the question with the document
# before it, against without (how much reading the document raises it)
WITH_DOCUMENT = {"en": "Document:\n{document}\n\nAnswer from the document: {question}",
                 "zh": "文档：\n{document}\n\n根据文档回答：{question}"}
WITHOUT_DOCUMENT = {"en": "{question}", "zh": "{question}"}
# the first words a judge's reply may start with, by verdict (their first tokens are compared)
YES = ("Yes", "yes", "YES", " Yes", " yes", "是")
NO = ("No", "no", "NO", " No", " no", "否")

REPHRASE = {
    "wikipedia": {
        "en": "Rewrite the following text in the style of a Wikipedia article: neutral, factual, "
              "well organised. Keep every fact; add none. Reply with the rewritten text only.\n\n{document}",
        "zh": "请把下面的文字改写成维基百科条目的风格：中立、客观、条理清楚。保留所有事实，不要添加新内容。只输出改写后的文字。\n\n{document}",
    },
    "qa": {
        "en": "Rewrite the following text as a series of questions and answers that together cover "
              "all of its content. Reply with the questions and answers only.\n\n{document}",
        "zh": "请把下面的文字改写成一组问答，问答合起来要涵盖原文的全部内容。只输出问答。\n\n{document}",
    },
    "simple": {
        "en": "Rewrite the following text in simple language that a child could understand. Keep "
              "the meaning. Reply with the rewritten text only.\n\n{document}",
        "zh": "请用小学生也能看懂的简单语言改写下面的文字，保持原意。只输出改写后的文字。\n\n{document}",
    },
    "textbook": {
        "en": "Rewrite the following text as a passage of a textbook that teaches its content "
              "step by step. Reply with the passage only.\n\n{document}",
        "zh": "请把下面的文字改写成教科书中循序渐进讲解其内容的一段。只输出改写后的段落。\n\n{document}",
    },
}

_QUESTION = re.compile(r"^\s*(?:\*\*)?(?:Question|Q|问题)(?:\*\*)?\s*[:：]\s*(?:\*\*)?\s*(.+?)\s*$",
                       re.IGNORECASE | re.MULTILINE)
_ANSWER = re.compile(r"^\s*(?:\*\*)?(?:Answer|A|答案)(?:\*\*)?\s*[:：]\s*(?:\*\*)?\s*(.+?)\s*$",
                     re.IGNORECASE | re.MULTILINE)


def language_of_row(row: dict, setting: str) -> str:
    """The prompts' language for a row: the setting, or with `auto` zh for a row whose `lang`
    says zh (ingest labels every text row) and en otherwise."""
    if setting != "auto":
        return setting
    return "zh" if str(row.get("lang") or "").startswith("zh") else "en"


def parse_qa(reply: str) -> tuple[str, str] | str:
    """(question, answer) from a reply in the QA form, or the reason there is none."""
    question, answer = _QUESTION.search(reply), _ANSWER.search(reply)
    if question is None:
        return "no_question"
    if answer is None or answer.start() < question.start():
        return "no_answer"
    q, a = question.group(1).strip(" *"), answer.group(1).strip(" *")
    return (q, a) if q and a else "empty_question_or_answer"


def parse_instruction(text: str, stopped: bool, special: bool) -> str | None:
    """Why a Magpie sample is not one user turn, or None when it is: it must end its turn
    (`stopped` at the end-of-turn token, not cut at max_new_tokens), hold text, and hold no
    special token (a role marker: the model went on to write another turn)."""
    if special:
        return "more_than_one_turn"
    if not stopped:
        return "no_end_of_turn"
    if not text.strip():
        return "empty_instruction"
    return None


def yes_no(reply: str) -> bool | None:
    """A judge's written verdict (a server's reply): True for yes, False for no, None when it
    says neither first."""
    head = reply.strip().lstrip("*\"'“").lower()
    if head.startswith(("yes", "是")):
        return True
    if head.startswith(("no", "否", "不")):
        return False
    return None
