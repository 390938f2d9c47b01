"""A planted corpus for `llmkit quality`: educational-style documents against spam, ads, keyword
lists and boilerplate, in Chinese and in English, made from the demo corpus's real text.

Sources and licences (recipes/demo/NOTICE.md): good documents are the demo corpus's rows as they
are — Python 3.11.7 standard-library docstrings and pydoc topics (PSF-2.0; a long docstring cut
at paragraph ends into pieces of at most ~1,500 characters), and Debian fortunes-zh 2.98 sayings,
classical prose and Tang/Song poems (GPL-3.0-or-later; three to six consecutive entries
joined into one document). Bad documents are generated here (Apache-2.0, like llmkit) from the
phrase lists below; the keyword lists and the excerpt an ad wraps are real words and sentences
of the same sources, so a classifier cannot tell the classes apart by vocabulary alone.

Every real source row lands in one split by a hash of its id, and every phrase list is cut in
two (even entries for train, odd for test), so a test document shares no source sentence and no
template phrase with a training one: held-out AUC measures generalisation to unseen phrasing.

    python tests/data/quality_corpus.py OUT_DIR [--per-class 1800] [--seed 0]

writes OUT_DIR/{good,bad}_{train,test}.jsonl, rows {id, text, lang, kind}; the same arguments
give the same bytes.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import random
import re
from pathlib import Path

RAW = Path(__file__).resolve().parents[2] / "recipes" / "demo" / "data" / "raw"
LANGS = ("en", "zh")
TEST_SHARE = 0.25  # of the real source rows

EN_AD = ["BUY NOW and save {pct}% on {item}!!!", "Limited time offer: {item} only ${price}",
         "FREE shipping on all orders over ${price}", "Click here to claim your FREE {item}",
         "Best price guaranteed - {item} at wholesale prices", "Hurry! Only {n} left in stock",
         "Call now: 1-800-{n}-{n}", "Order today, get a second {item} FREE",
         "Sign up and WIN a brand new {item}", "Lowest prices online, 100% satisfaction",
         "Work from home and earn ${price} per day", "No credit check, instant approval",
         "Act now - this deal expires at midnight", "Exclusive discount code SAVE{pct}",
         "Lose {n} pounds in {n} days, doctors hate this trick", "Hot sale: {item} {pct}% off",
         "Unbelievable deal on {item} - shop now", "Get rich quick with our proven system",
         "Visit www.best-{word}-deals.com today", "Don't miss out, subscribe for daily deals",
         "Cheap {item} for sale, fast delivery", "Meet singles near you tonight",
         "Your account has won ${price}, claim it now", "Top rated {item} - 5 stars - buy today"]
EN_ITEMS = ["replica watches", "phone cases", "running shoes", "diet pills", "gaming laptops",
            "casino chips", "designer handbags", "sunglasses", "vitamins", "car insurance",
            "web hosting", "bitcoin miners", "headphones", "essay writing", "followers", "loans",
            "hair growth oil", "smart watches", "printer ink", "VPN plans"]
EN_NAV = ["Home", "About Us", "Contact", "Privacy Policy", "Terms of Service", "Login", "Register",
          "Sitemap", "FAQ", "Cookie Settings", "Careers", "Blog", "Shop", "Cart", "My Account",
          "Help Center", "Newsletter", "Advertise", "Press", "Accessibility"]
EN_FOOTER = ["Copyright (c) {year} All rights reserved.", "Powered by WordPress",
             "Subscribe to our newsletter for the latest updates",
             "We use cookies to improve your experience. Accept all cookies?",
             "Share on Facebook | Tweet | Pin it", "Back to top", "Skip to main content",
             "Follow us on social media", "This site is protected by reCAPTCHA",
             "Page {n} of {n} | Next >>", "Related posts: you may also like",
             "Loading... please wait", "Posted by admin in Uncategorized | {n} comments",
             "Tags: {words}"]
ZH_AD = ["【限时特价】{item}全场{pct}折，点击立即抢购！", "加微信{n}领取优惠券，先到先得",
         "正品保证，假一赔十，{item}包邮到家", "今日特惠：{item}仅需{price}元！",
         "免费领取{item}，名额有限，速来！", "日赚{price}元不是梦，在家轻松兼职",
         "扫码关注，抽奖送{item}", "厂家直销{item}，价格全网最低", "无需抵押，极速放款，当天到账",
         "买一送一，{item}清仓大甩卖", "火爆热销中！{item}月销{n}件",
         "点击链接领取红包，最高{price}元", "VIP会员充值立减{price}元", "新用户注册即送{item}",
         "代办各类证件，联系电话{n}", "{item}厂家批发，量大从优", "秒杀开始！{item}低至{price}元",
         "好评返现{price}元，欢迎选购", "专业代写论文，包过查重", "减肥神器，{n}天瘦{n}斤",
         "彩票内部消息，稳赚不赔", "亲，{item}现货速发哦", "咨询热线：400-{n}-{n}",
         "全网最低价，错过再等一年"]
ZH_ITEMS = ["手机壳", "保健品", "减肥茶", "运动鞋", "名牌包包", "护肤品", "充电宝", "蓝牙耳机",
            "游戏点卡", "茶叶礼盒", "按摩椅", "美白面膜", "空气净化器", "网络课程", "理财产品",
            "二手车", "婴儿奶粉", "智能手表", "会员卡", "贷款"]
ZH_NAV = ["首页", "关于我们", "联系我们", "新闻中心", "产品中心", "在线留言", "网站地图",
          "隐私政策", "免责声明", "登录", "注册", "帮助中心", "人才招聘", "友情链接", "客服中心",
          "投诉建议", "购物车", "我的订单", "会员中心", "下载APP"]
ZH_FOOTER = ["版权所有 © {year} 保留所有权利", "京ICP备{n}号",
             "本站部分内容来源于网络，如有侵权请联系删除", "扫描二维码关注我们", "上一篇 | 下一篇",
             "点击加载更多", "分享到：微信 微博 QQ空间", "热门标签：{words}",
             "共{n}页 第{n}页 下一页", "本文由小编整理发布，转载请注明出处",
             "阅读({n}) 评论({n}) 点赞({n})", "返回顶部", "相关推荐：猜你喜欢",
             "技术支持：某某网络"]


def read_rows(name: str) -> list[dict]:
    opener = gzip.open if name.endswith(".gz") else open
    with opener(RAW / name, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def split_of(key: str) -> str:
    digest = int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "big")
    return "test" if digest / 2 ** 32 < TEST_SHARE else "train"


def docstring_pieces(text: str, limit: int = 1500) -> list[str]:
    """A docstring cut at paragraph ends into pieces of at most about `limit` characters."""
    pieces, current = [], ""
    for para in text.split("\n\n"):
        if current and len(current) + len(para) > limit:
            pieces.append(current)
            current = ""
        current = f"{current}\n\n{para}" if current else para
    return pieces + ([current] if current.strip() else [])


def good_documents(split: str) -> dict[str, list[str]]:
    """The real documents of one split, per language."""
    en = [piece for row in read_rows("en_docstrings.jsonl.gz") if split_of(row["id"]) == split
          for piece in docstring_pieces(row["text"]) if len(piece) >= 80]
    zh_rows = [r for name in ("zh_prose.jsonl", "zh_poems.jsonl") for r in read_rows(name)
               if split_of(r["id"]) == split]
    zh, rng, i = [], random.Random(split), 0
    while i < len(zh_rows):
        n = rng.randint(3, 6)
        zh.append("\n\n".join(r["text"] for r in zh_rows[i:i + n]))
        i += n
    return {"en": en, "zh": zh}


def vocabulary(docs: list[str], lang: str) -> list[str]:
    if lang == "en":
        return sorted({w.lower() for d in docs for w in re.findall(r"[A-Za-z]{4,}", d)})
    from llmkit.tokenizers.cjk import jieba_words

    return sorted({w for d in docs for w in jieba_words(d) if len(w) >= 2 and re.fullmatch(r"\w+", w)})


def half(phrases: list[str], split: str) -> list[str]:
    return phrases[split == "test"::2]


class Spam:
    """Generated bad documents of one language and split."""

    def __init__(self, lang: str, split: str, words: list[str], sentences: list[str], rng):
        zh = lang == "zh"
        self.lang, self.rng, self.words, self.sentences = lang, rng, words, sentences
        self.ads = half(ZH_AD if zh else EN_AD, split)
        self.items = half(ZH_ITEMS if zh else EN_ITEMS, split)
        self.nav = half(ZH_NAV if zh else EN_NAV, split)
        self.footer = half(ZH_FOOTER if zh else EN_FOOTER, split)
        self.sep = "，" if zh else ", "

    def fill(self, template: str) -> str:
        r = self.rng
        return re.sub(r"\{(\w+)\}", lambda m: {
            "pct": str(r.choice([10, 20, 30, 50, 70, 90])), "price": str(r.randint(5, 999)),
            "n": str(r.randint(10, 9999)), "year": str(r.randint(2005, 2025)),
            "item": r.choice(self.items), "word": r.choice(self.words),
            "words": self.sep.join(r.sample(self.words, 5))}[m.group(1)], template)

    def ad(self) -> str:
        lines = [self.fill(self.rng.choice(self.ads)) for _ in range(self.rng.randint(3, 12))]
        return "\n".join(lines)

    def keyword_list(self) -> str:
        r = self.rng
        picks = r.sample(self.words, r.randint(15, 80))
        sep = r.choice(["、", " ", "，", "|"] if self.lang == "zh" else [", ", " ", " | ", "; "])
        return sep.join(picks)

    def boilerplate(self) -> str:
        r = self.rng
        nav = " | ".join(r.sample(self.nav, r.randint(5, len(self.nav))))
        foot = "\n".join(self.fill(r.choice(self.footer)) for _ in range(r.randint(2, 6)))
        return f"{nav}\n{foot}"

    def ad_around_excerpt(self) -> str:
        """An ad wrapped around one real sentence: spam that borrows a line of good text."""
        r = self.rng
        return "\n".join([self.fill(r.choice(self.ads)), r.choice(self.sentences),
                          *(self.fill(r.choice(self.ads)) for _ in range(r.randint(2, 5))),
                          self.boilerplate()])

    def document(self) -> tuple[str, str]:
        kind = self.rng.choice(("ad", "keyword_list", "boilerplate", "ad_around_excerpt"))
        return kind, getattr(self, kind)()


def sentences_of(docs: list[str], lang: str) -> list[str]:
    cut = r"(?<=[。！？])" if lang == "zh" else r"(?<=[.!?])\s+"
    return [s.strip() for d in docs for s in re.split(cut, d) if 20 <= len(s.strip()) <= 200]


def build(per_class: int = 1800, seed: int = 0) -> dict[str, dict[str, list[dict]]]:
    """{split: {"good": rows, "bad": rows}}: `per_class` rows of each class and language in all,
    a quarter of them in `test` (good rows: as many as the sources give, up to that)."""
    out = {}
    for split in ("train", "test"):
        want = round(per_class * (TEST_SHARE if split == "test" else 1 - TEST_SHARE))
        good_docs = good_documents(split)
        out[split] = {"good": [], "bad": []}
        for lang in LANGS:
            rng = random.Random(f"{seed}-{split}-{lang}")
            docs = good_docs[lang]
            rng.shuffle(docs)
            out[split]["good"] += [{"id": f"good-{lang}-{split}-{i:05d}", "text": t, "lang": lang,
                                    "kind": "educational"} for i, t in enumerate(docs[:want])]
            spam = Spam(lang, split, vocabulary(docs, lang), sentences_of(docs, lang), rng)
            for i in range(want):
                kind, text = spam.document()
                out[split]["bad"].append({"id": f"bad-{lang}-{split}-{i:05d}", "text": text,
                                          "lang": lang, "kind": kind})
    return out


def write(out_dir: Path, corpus: dict) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for split, classes in corpus.items():
        for label, rows in classes.items():
            path = out_dir / f"{label}_{split}.jsonl"
            path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows),
                            encoding="utf-8")
            paths.append(path)
    return paths


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out_dir", type=Path)
    p.add_argument("--per-class", type=int, default=1800, help="rows of each class and language")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    for path in write(args.out_dir, build(args.per_class, args.seed)):
        print(path, sum(1 for _ in open(path, encoding="utf-8")), "rows")


if __name__ == "__main__":
    main()
