"""Generated answer pairs for the math verifier: a gold answer, a predicted text stating the same
answer in another form (or a different answer), English or Chinese, with the truth known by
construction. Shared by tests/rewards/test_math.py (a small sample) and bench/math_verify.py (500).

Each predicted text also has a canonical rendering: the same answer as math-verify documents its
input (LaTeX between `$…$`, English anchors, ASCII digits). math-verify's verdict on the canonical
pair is the reference the verifier is held to; its verdict on the raw texts is reported beside it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from fractions import Fraction


@dataclass(frozen=True)
class Form:
    latex: str  # the answer in LaTeX, without delimiters
    plain: str | None = None  # the answer as plain text, where it has one ("3/4", "75%")


@dataclass(frozen=True)
class Pair:
    gold: str
    predicted: str
    gold_canonical: str
    predicted_canonical: str
    equal: bool  # by construction
    lang: str  # "en" or "zh"
    kind: str  # the answer's kind: integer, fraction, radical, set, ...


def full_width(text: str) -> str:
    return "".join(chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else "\u3000" if c == " " else c for c in text)


def number_forms(value: Fraction, rng: random.Random) -> list[Form]:
    """Ways to write a rational number: integer, fraction, decimal, percentage, separators, units."""
    forms = []
    sign = "-" if value < 0 else ""
    p, q = abs(value.numerator), value.denominator
    if q == 1:
        forms += [Form(str(value), str(value)), Form(f"{value}.0", f"{value}.0")]
        if abs(value) >= 1000:
            forms.append(Form(f"{int(value):,}".replace(",", "{,}"), f"{int(value):,}"))
        unit = rng.choice(["cm", "m", "kg"])
        forms.append(Form(f"{value}\\text{{ {unit}}}", f"{value} {unit}"))
        forms.append(Form(f"{value}^\\circ", f"{value}°"))
        forms.append(Form(f"\\${value}"))
        forms.append(Form(f"{value}\\text{{个}}", f"{value}{rng.choice('个元米只')}"))
    else:
        forms += [Form(f"{sign}\\frac{{{p}}}{{{q}}}"), Form(f"{sign}\\dfrac{{{p}}}{{{q}}}"),
                  Form(f"{sign}{p}/{q}", f"{sign}{p}/{q}"), Form(f"{sign}\\frac{{{3 * p}}}{{{3 * q}}}")]
        if p > q:
            forms.append(Form(f"{sign}{p // q}\\frac{{{p % q}}}{{{q}}}"))  # a mixed number
    if all(f not in (2, 5) for f in _factors(q)) and q != 1:
        decimal = f"{float(value):.10f}".rstrip("0")
        forms.append(Form(decimal, decimal))
        if abs(value) < 1:
            percent = f"{float(value * 100):.6f}".rstrip("0").rstrip(".")
            forms.append(Form(f"{percent}\\%", f"{percent}%"))
    return forms


def _factors(n: int) -> set[int]:
    found, d = set(), 2
    while d * d <= n:
        while n % d == 0:
            found.add(d)
            n //= d
        d += 1
    return found | ({n} if n > 1 else set())


def answer(rng: random.Random, kind: str) -> tuple[Form, list[Form], list[Form]]:
    """(the gold answer, forms of the same answer, forms of a different one) of one kind."""
    if kind in ("integer", "fraction", "decimal"):
        if kind == "integer":
            value = Fraction(rng.choice([rng.randint(-50, 200), rng.randint(1000, 99999)]))
        elif kind == "fraction":
            value = Fraction(rng.randint(1, 40), rng.randint(2, 40))
            value = value if value.denominator > 1 else value + Fraction(1, 3)
        else:
            value = Fraction(rng.randint(1, 999), rng.choice([10, 100, 4, 8]))
        other = value + rng.choice([1, -1, Fraction(1, 2), Fraction(1, 10)]) if rng.random() < .7 else -value or 1
        gold = rng.choice([f for f in number_forms(value, rng) if "text" not in f.latex])
        return gold, number_forms(value, rng), number_forms(other, rng)
    a, b, c = rng.sample(range(1, 10), 3)
    if kind == "radical":
        same = [Form(f"\\frac{{\\sqrt{{{b}}}}}{{{a + 1}}}"), Form(f"\\sqrt{{{b}}}/{a + 1}"),
                Form(f"\\frac{{1}}{{{a + 1}}}\\sqrt{{{b}}}")]
        return Form(f"\\frac{{\\sqrt{{{b}}}}}{{{a + 1}}}"), same, [Form(f"\\frac{{\\sqrt{{{c}}}}}{{{a + 1}}}"),
                                                             Form(f"\\sqrt{{{b}}}/{a + 2}")]
    if kind == "pi":
        return Form(f"\\frac{{{a}\\pi}}{{{b}}}"), [Form(f"\\frac{{{a}\\pi}}{{{b}}}"), Form(f"{a}\\pi/{b}"),
                                            Form(f"\\frac{{{a}}}{{{b}}}\\pi")], \
            [Form(f"\\frac{{{a}\\pi}}{{{b + 1}}}"), Form(f"{a}/{b}")]
    if kind == "set":
        items = [a, b, c]
        shuffled = rng.sample(items, 3)
        return Form("\\{" + ",".join(map(str, items)) + "\\}"), \
            [Form("\\{" + ", ".join(map(str, shuffled)) + "\\}")], \
            [Form("\\{" + ",".join(map(str, [a, b, c + 10])) + "\\}"), Form("\\{" + f"{a},{b}" + "\\}")]
    if kind == "interval":
        lo, hi = sorted((a, b))
        return Form(f"[{lo},{hi})"), [Form(f"[{lo}, {hi})"), Form(f"x \\in [{lo},{hi})")], [Form(f"({lo},{hi}]"), Form(f"[{lo},{hi + 1})")]
    if kind == "tuple":
        return Form(f"({a},{b})"), [Form(f"({a}, {b})"), Form(f"\\left({a},{b}\\right)")], \
            [Form(f"({b},{a})"), Form(f"({a},{c})")]
    if kind == "polynomial":
        return Form(f"(x+{a})^2"), [Form(f"x^2+{2 * a}x+{a * a}"), Form(f"(x+{a})^{{2}}"), Form(f"x^{{2}}+{2 * a}x+{a * a}")], \
            [Form(f"x^2+{a * a}"), Form(f"(x-{a})^2")]
    if kind == "equation":
        return Form(f"x={a}", f"x={a}"), [Form(f"{a}", str(a)), Form(f"x = {a}", f"x = {a}")], [Form(f"{a + 1}", str(a + 1))]
    raise ValueError(kind)


KINDS = ("integer", "integer", "fraction", "fraction", "decimal", "radical", "pi", "set", "interval",
         "tuple", "polynomial", "equation")


def render(form: Form, lang: str, rng: random.Random) -> tuple[str, str]:
    """(the predicted text, its canonical rendering) for one form of an answer."""
    canonical = f"${form.latex}$"  # math-verify's documented input: LaTeX between $…$
    if lang == "en":
        choices = [f"${form.latex}$", f"\\boxed{{{form.latex}}}", f"The answer is ${form.latex}$.",
                   f"So the final answer is $\\boxed{{{form.latex}}}$."]
        if form.plain:
            choices += [form.plain, f"The answer is {form.plain}."]
        return rng.choice(choices), canonical
    choices = [f"答案是${form.latex}$", f"最终答案是$\\boxed{{{form.latex}}}$", f"答案为 ${form.latex}$。"]
    if form.plain:
        choices += [f"所以答案为{form.plain}。", f"答案：{full_width(form.plain)}", f"因此，结果是{form.plain}",
                    full_width(form.plain)]
    return rng.choice(choices), canonical


def with_working(text: str, lang: str, rng: random.Random) -> str:
    """The answer after a line of working whose numbers are not the answer (a third of the time)."""
    if rng.random() >= 1 / 3:
        return text
    a, b = rng.randint(2, 99), rng.randint(2, 99)
    return (f"First, ${a}+{b}={a + b}$ and {a}*{b} = {a * b}. " if lang == "en"
            else f"首先，{a}+{b}={a + b}，{a}×{b}={a * b}。") + text


def answer_pairs(n: int, seed: int = 0) -> list[Pair]:
    """`n` pairs, half equal and half not, half English and half Chinese, over KINDS."""
    rng = random.Random(seed)
    pairs = []
    for i in range(n):
        kind = KINDS[i % len(KINDS)]
        gold_form, same, different = answer(rng, kind)
        gold = gold_form.plain if gold_form.plain and rng.random() < .5 else gold_form.latex
        # independent of the kind's position in the cycle: each kind gets every (equal, lang)
        equal = (i // len(KINDS)) % 2 == 0
        lang = "en" if (i // (2 * len(KINDS))) % 2 == 0 else "zh"
        predicted, canonical = render(rng.choice(same if equal else different), lang, rng)
        predicted = with_working(predicted, lang, rng)
        pairs.append(Pair(gold, predicted, f"${gold_form.latex}$", canonical, equal, lang, kind))
    return pairs
