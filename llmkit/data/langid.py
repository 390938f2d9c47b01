"""Language identification: which language a document is in, by py3langid's model.

py3langid (BSD-3-Clause) ships its model inside the wheel — a naive Bayes classifier over byte
n-grams for 140 labels (ISO 639-1 codes where one exists, else ISO 639-3, e.g. `yue`) — so
nothing is downloaded at run time; it reads a document's first SAMPLE_CHARS characters, about
0.7 ms a page on this project's machine (bench/web.py).
It tells zh, ja and ko apart but not Simplified from Traditional Chinese; that comes from the
characters themselves: a Han character that GB2312 (the Simplified standard) can encode and
Big5 (the Traditional one) cannot is Simplified-only, and the other way round.

The model is built once per process on first use (`identifier()`), never kept on a config, so
a config stays plain values and a Ray worker or a spawned local worker builds its own.
"""

from __future__ import annotations

from llmkit.tokenizers.cjk import language_of
from llmkit.errors import UserError

SAMPLE_CHARS = 1000  # its start tells a page's language; py3langid loops over its bytes in Python
UNDETERMINED = "und"  # BCP 47's code for text without letters to judge by
SINITIC = ("zh", "yue", "wuu")  # the model's Chinese labels, all reported as zh

_holder: dict = {}  # this process's LanguageIdentifier, built on first use


class LanguageIdentifier:
    """py3langid's model and the Han character tables, loaded together once per process
    (`identifier()`); `llmkit clean` reaches it through its rule holder
    (llmkit.data.rule_state.RuleState.languages)."""

    def __init__(self):
        try:
            from py3langid.langid import MODEL_FILE, LanguageIdentifier as Model
        except ImportError:
            raise UserError("language identification needs py3langid: "
                            "pip install 'llmkit[web]'") from None
        self.model = Model.from_model_file(MODEL_FILE, norm_probs=True)
        self.simplified, self.traditional = _han_forms()

    def known_languages(self) -> frozenset:
        """Every code `identify` can answer, and zh-Hans / zh-Hant (the `script` of Chinese)."""
        return (frozenset(self.model.nb_classes) - set(SINITIC[1:])) | {"zh-Hans", "zh-Hant",
                                                                        UNDETERMINED}

    def identify(self, text: str) -> tuple[str, float]:
        """(language code, probability) of `text`; (`und`, 0.0) when it has no letters.

        The model's Sinitic labels are one answer, `zh`, with their probabilities summed: its
        `yue` and `wuu` fire on Traditional and on technical Mandarin (a third of the Taiwanese
        message catalogues of tests/assets/langid_docs.jsonl came out `yue`), and web text in
        Cantonese or Wu proper is rare next to it."""
        sample = text[:SAMPLE_CHARS]
        if not any(ch.isalpha() for ch in sample):
            return UNDETERMINED, 0.0
        lang, score = self.model.classify(sample)
        if lang in SINITIC:
            lang, score = "zh", sum(p for code, p in self.model.rank(sample) if code in SINITIC)
        return lang, round(min(float(score), 1.0), 4)

    def chinese_script(self, text: str) -> str | None:
        """`zh-Hans` or `zh-Hant` by which form-specific characters are in the majority; None
        when the text has none of either."""
        sample = text[:SAMPLE_CHARS]
        s = sum(ch in self.simplified for ch in sample)
        t = sum(ch in self.traditional for ch in sample)
        if s == t == 0:
            return None
        return "zh-Hans" if s >= t else "zh-Hant"

    def columns(self, text: str) -> dict:
        """`lang_id` (the model's code), `lang_score` (its probability) and `script`: zh-Hans or
        zh-Hant when the language is Chinese (a Chinese page full of code or Latin names too),
        else the script label of `llmkit.tokenizers.cjk.language_of` (zh / latin / other)."""
        lang, score = self.identify(text)
        script = language_of(text)
        if lang == "zh":
            script = self.chinese_script(text) or script
        return {"lang_id": lang, "lang_score": score, "script": script}


def identifier() -> LanguageIdentifier:
    """This process's LanguageIdentifier (a Ray worker or a spawned worker builds its own)."""
    if "identifier" not in _holder:
        _holder["identifier"] = LanguageIdentifier()
    return _holder["identifier"]


def _han_forms() -> tuple[frozenset, frozenset]:
    """(Simplified-only, Traditional-only) characters of the basic Han block."""
    def encodable(ch: str, codec: str) -> bool:
        try:
            ch.encode(codec)
            return True
        except UnicodeEncodeError:
            return False

    han = [chr(c) for c in range(0x4E00, 0xA000)]
    gb = {ch for ch in han if encodable(ch, "gb2312")}
    big5 = {ch for ch in han if encodable(ch, "big5")}
    return frozenset(gb - big5), frozenset(big5 - gb)


def known_languages() -> frozenset:
    return identifier().known_languages()


def identify(text: str) -> tuple[str, float]:
    return identifier().identify(text)


def chinese_script(text: str) -> str | None:
    return identifier().chinese_script(text)


def language_columns(text: str) -> dict:
    """`LanguageIdentifier.columns` by this process's identifier."""
    return identifier().columns(text)
