"""Document quality rules (Gopher, C4, FineWeb) as small functions.

A rule is `rule(doc, cfg) -> str | None`: None keeps the document, a string is the reason it is
removed, and the reason is always the rule's own name, so the manifest counts removals per rule
and `disabled_rules` switches rules off by the same name. `RULES` is the order they run in
(cheap, decisive checks first); the first rule that objects decides the reason.

Words. Text in Chinese or Japanese has no spaces, so counting whitespace-separated words would
make a whole paragraph one "word". Here every CJK character (Han, kana) is one word and the rest
of the text is split on whitespace, so "在 Debian 中" has 3 words; with `cjk_words="jieba"` the
n-gram rules see CJK text segmented into real words instead (slower). A document is CJK when
CJK characters make up at least `cjk_min_fraction` of its words. CJK documents get their own
minimum length (`cjk_min_words` characters: the shortest real texts, proverbs of 6-8
characters, are documents; Gopher's 50 words would kill most quatrains), skip the
mean-word-length rule (a character-word is 1 long by definition), check common characters
instead of English stop words, and take Gopher's n-gram sizes in characters times
`cjk_ngram_scale` (a Chinese word is about two characters; a word 5-gram is a 10-character
n-gram).

Speed. The rules share one `Doc`, whose measurements are computed once, on first use. Word
counts, symbol and letter counts and the word hashes for the n-gram rules come from one
compiled pass over the text's code points (numba; imported on first use), and the n-gram
statistics from a second one; everything else is `str` methods and a few regular expressions
that open with a character class or a literal, so that `re` can skip ahead.

Thresholds are the published ones unless a field's comment in `CleanConfig` says otherwise:
Gopher = Rae et al. 2021, "Scaling Language Models", appendix A; C4 = Raffel et al. 2020;
FineWeb = Penedo et al. 2024 (datatrove's FineWebQualityFilter).
"""

from __future__ import annotations

import re
from collections import Counter
from itertools import repeat
from typing import NamedTuple

import numpy as np

# Han (BMP, extension A, compatibility, supplementary planes) and kana: written without spaces.
# Hangul is not here: Korean separates words with spaces.
CJK_RANGES = ((0x3400, 0x4DBF), (0x4E00, 0x9FFF), (0xF900, 0xFAFF), (0x3041, 0x3096),
              (0x30A1, 0x30FA), (0x30FC, 0x30FF), (0x20000, 0x3134F))
CJK_CLASS = "".join(f"{chr(lo)}-{chr(hi)}" for lo, hi in CJK_RANGES)
CJK_CHAR = re.compile(f"[{CJK_CLASS}]")
HAN_CHAR = re.compile("[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0003134f]")
_TOKEN = re.compile(f"[{CJK_CLASS}]|[^\\s{CJK_CLASS}]+")  # Doc.words of CJK text
# Symbol words (no letter, digit or "_") of CJK text in " " + text + " ", for jieba's case
# (the compiled pass counts them otherwise).
_CJK_SYMBOL_WORD = re.compile(f"[^\\w\\s](?<=[\\s{CJK_CLASS}].)[^\\w\\s]*(?=[\\s{CJK_CLASS}])")
_HAS_WORD_CHAR = re.compile(r"\w")
_LETTER = re.compile(r"[^\W\d_]")

GOPHER_STOP_WORDS = ("the", "be", "to", "of", "and", "that", "have", "with")
BULLETS = ("•", "‣", "●", "○", "◦", "▪", "■", "□", "-", "*", "·", "–")
ELLIPSES = ("...", "…")
# C4's end-of-sentence marks plus closing quotes and brackets after them, and the Chinese
# comma: a line of verse ends with "，" when its couplet continues on the next line.
TERMINAL_PUNCTUATION = (".", "!", "?", "…", '"', "'", "”", "’", ")", "。", "！", "？", "；",
                        "」", "』", "）", "】", "》", "，")

# The 1,000 most frequent Han characters, ranked by jieba's dictionary (a character's frequency
# is the summed frequency of the dictionary words containing it). Real Chinese, classical
# poetry included, draws 45-95 % of its characters from them; uniformly random characters
# (mojibake, spam, gibberish) draw about 5 %. This is the CJK counterpart of Gopher's stop
# words: a word list cannot work, since 300 random characters contain one or two of any
# 100-character stop list by chance.
COMMON_HAN = frozenset(
    "一是人了不在有大中国和为这上他个地年来我会以到时要出的生学说道民家子也成行下们于后就发自之对得主长可"
    "过天作分方用多你着部能市等业全里工公经本都而高政法面门动日进区事代那去心小同北定开产前其军还然起种所"
    "如现理机体表力好外与文当两实重新三么只山水关明从化平建又制南内西没此将员名手最东头者月间无安看见各城"
    "十相但已些正口通想度加第她合院物性战由位常点海意场武使次二向治因立数样身情入原问把路被并利石老教万知"
    "级量任江及应省资委务元美特期世湖回系比气汉总展电科金先声提品设或义王社很统处四首共马形己儿司太目基领"
    "队直计别女权话少流命至报米给打变果书清活几州华解议更称程今决张导术府才保交放管结师便走达族反再题色五"
    "京河接条规县式白它改风光运信受什组听布百济党指论强做取技黄神选记斯真却职号界件花类何眼兵传带空干农边"
    "据集联古广完质阳难增历史专官每住商即步认车台林必死游举线言皇土团收考求德叫近备研争非具李众连调感转笑"
    "革该持始英克士尔让拉思根格造较际亲单朝红型价校约器字段周亚深候则功属积快图火千准究往极育装许参半令吃"
    "观鱼精办像帝八复影告远群包整构料随划算象容示投势热值夫网望源息语股铁断派速怎需片爱律纪支早况病境证编"
    "越局推满且列觉服双未居除乐企引标确织初青志率项飞球察节龙响药站施均消客失轻存低甚般击曾防请离落显罗营"
    "足素视护副食创余照兴占巴虽洲村费易试星木黑左宝置跟央识维采六底宫房音环案批切斗富乡另倒若按查故突责严"
    "桥模仅胜杀围席态破承招杨负层须父供续状域似依银范修找九致密终血旅钱赛独细效玉冲获习医演毛尽脸弹楼艺航"
    "陆右协七攻镇检写苏宗章注阿抗弟坐验封紧劳户优财养适陈喜卫排射哥油刻留急降念云微伤例景拿绝阶座刘刚害印"
    "亿沙母酒助闻超审待压升送监策略限竟香配藏敌呢差仍兰温园树征善波哪词岛止预怕继皮执味份角草男普答益谁船"
    "惊核街夏宣掌田久著画辑奇尼剑吧谈背免孩礼材愿洋春架筑括晚乱乎讲尚良友临激刀夜室既敢邦挥昌板胡欧福港叶"
    "简苦担句岁荆贵娘守辖威宜衣帮块堂额错剧充欢够孙班呼阵销坚练脚退读测吴希宁换版异某顾曲楚典朱毒菜判救宋"
    "茶洪含顺啊鲜败货矿端兄归冷忙买险康评肉吗厂永哈沉散遗停笔假输牛洞松渐顶训录否述毕督控丰献姑忽爷互亮纳"
    "襄登咱钟伯臣雄季脑介鄂召饭暗扩祖齐短烈赶牌恩诉移诗础露届蒙静喝盘卖植授伊湾博痛减穿逐秘庭陵固禁票灵杂"
    "姓泽吸侧庆妈遇追甲馆补唐炮沿殿刺怪彩俄旧警索岸轮妇载靠附毫怀软骨探雷旁罪枪牙迎序慢盛雨墙恶谷顿危稳熟"
)



class _once:
    """A property computed on first use and then stored on the instance.

    functools.cached_property does the same but takes a lock on every first access (3.11),
    which costs more than most of the measurements here.
    """

    def __init__(self, fn):
        self.fn, self.name, self.__doc__ = fn, fn.__name__, fn.__doc__

    def __get__(self, obj, cls=None):
        if obj is None:
            return self
        value = obj.__dict__[self.name] = self.fn(obj)
        return value


class Doc:
    """One normalised document and the measurements rules share, each computed at most once."""

    def __init__(self, text: str, cfg, *, dropped_lines: int = 0):
        self.text = text
        self.cfg = cfg
        self.dropped_lines = dropped_lines  # boilerplate lines removed before the rules ran

    @_once
    def jieba(self) -> bool:
        return self.cfg.cjk_words == "jieba" and not self.text.isascii() and \
            CJK_CHAR.search(self.text) is not None

    @_once
    def words(self) -> list[str]:
        if self.jieba:
            return _jieba_words(self.text)
        if self.text.isascii() or not CJK_CHAR.search(self.text):
            return self.text.split()
        return _TOKEN.findall(self.text)

    @_once
    def counts(self) -> "WordCounts":
        """Word counts from one compiled pass over the text (or from jieba's words); the pass
        also leaves each word's hash and length in `word_hashes`, `word_lengths`."""
        if self.jieba:
            self.word_hashes, self.word_lengths, counts = _counts_of_words(self.text, self.words, self.cfg)
            return counts
        codes = np.frombuffer(self.text.encode("utf-32-le"), np.uint32)
        self.word_hashes, self.word_lengths, counts = _kernels()[0](codes, _char_classes(),
                                                                    self.cfg._stop_hashes)
        return WordCounts(*counts.tolist())

    @property
    def cjk_chars(self) -> int:
        return self.counts.cjk_chars

    @property
    def content_words(self) -> int:
        """Gopher's word count: words that are not just punctuation or symbols."""
        return self.counts.words - self.counts.symbol_words

    @_once
    def is_cjk(self) -> bool:
        """CJK characters are at least `cjk_min_fraction` of the words (one per character)."""
        c = self.counts
        if not c.cjk_chars:
            return False
        other = c.content_words_by_char - c.cjk_chars
        return c.cjk_chars >= self.cfg.cjk_min_fraction * (c.cjk_chars + other)

    @_once
    def lines(self) -> list[str]:
        """Non-empty lines (normalisation has already stripped trailing whitespace)."""
        return [line for line in self.text.split("\n") if line]

    @_once
    def paragraphs(self) -> list[str]:
        return [p for p in self.text.split("\n\n") if p]

    @_once
    def line_repeats(self) -> tuple[int, int]:
        return _duplicates(self.lines)

    @_once
    def paragraph_repeats(self) -> tuple[int, int]:
        return _duplicates(self.paragraphs)

    @_once
    def ngram_scale(self) -> float:
        """How many of this document's words make one word of Gopher's n-grams."""
        return self.cfg.cjk_ngram_scale if self.is_cjk and not self.jieba else 1.0

    @_once
    def ngram_stats(self):
        """(top n-gram chars by n, repeated n-gram chars by n, total word chars, n scale).

        Documents shorter than `ngram_min_words` (scaled) get all zeros: in a short text one
        echoed phrase is a large fraction, and that is style (a refrain, a couplet), not spam.
        """
        scale, cfg = self.ngram_scale, self.cfg
        top_ns, dup_ns = _ngram_sizes(len(cfg.max_top_ngram_chars), len(cfg.max_dup_ngram_chars),
                                      scale)
        if self.counts.words < cfg.ngram_min_words * scale:
            size = max(top_ns[-1], dup_ns[-1]) + 1
            return [0] * size, [0] * size, 0, scale
        top, dup = _kernels()[1](self.word_hashes, self.word_lengths, top_ns, dup_ns)
        return top.tolist(), dup.tolist(), self.counts.word_chars, scale


class WordCounts(NamedTuple):
    words: int  # as `Doc.words` cuts them
    symbol_words: int  # words without a letter, digit or "_": "|", "--", "，"
    symbol_chars: int
    letterless_words: int  # words without a letter (CJK characters are letters), symbols included
    cjk_chars: int
    word_chars: int  # characters in words: all but whitespace
    content_words_by_char: int  # non-symbol words when every CJK character is a word
    han_chars: int
    common_han_chars: int  # of them in COMMON_HAN
    stop_words: int  # distinct words of cfg.stop_words present


def _counts_of_words(text: str, words: list[str], cfg):
    """The compiled pass's results, for words cut by jieba."""
    symbols = [w for w in words if not _HAS_WORD_CHAR.search(w)]
    cjk = CJK_CHAR.subn("", text)[1]
    by_char = len(_TOKEN.findall(text)) - len(_CJK_SYMBOL_WORD.findall(f" {text} "))
    han = HAN_CHAR.findall(text)
    counts = WordCounts(len(words), len(symbols), sum(map(len, symbols)),
                        sum(not _LETTER.search(w) for w in words), cjk, sum(map(len, words)),
                        by_char, len(han), sum(map(COMMON_HAN.__contains__, han)),
                        len(cfg._stop_words.intersection(words)))
    # Python's string hash is salted per process, but only equality within a document
    # matters, so every worker gets the same result (barring a 2**-64 collision).
    hashes = np.fromiter(map(hash, words), np.int64, len(words)).view(np.uint64)
    return hashes, np.fromiter(map(len, words), np.int64, len(words)), counts


_NGRAM_SIZES: dict = {}


def _ngram_sizes(n_top: int, n_dup: int, scale: float):
    """The n of each top n-gram limit (2, 3, …) and repeated n-gram limit (5, 6, …), scaled."""
    key = (n_top, n_dup, scale)
    if key not in _NGRAM_SIZES:
        top = [round(n * scale) for n in range(2, 2 + n_top)] or [0]
        dup = [round(n * scale) for n in range(5, 5 + n_dup)] or [0]
        _NGRAM_SIZES[key] = (np.array(top, np.int64), np.array(dup, np.int64))
    return _NGRAM_SIZES[key]


def repetition_stats(hashes, lengths, top_ns, dup_ns):
    """Gopher's n-gram repetition measures over a document's words (given as hashes, lengths).

    For each n in `top_ns`, top[n]: characters covered by the most frequent n-gram (count ×
    length; 0 when no n-gram repeats). For each n in `dup_ns`, dup[n]: characters of the words
    covered by n-grams that repeat an earlier one (the first occurrence is not counted, so a
    text pasted twice scores one half). Characters are the words' own, spaces excluded.
    """
    size = hashes.shape[0]
    max_n = max(top_ns.max(), dup_ns.max())
    top = np.zeros(max_n + 1, np.int64)
    dup = np.zeros(max_n + 1, np.int64)
    want_top = np.zeros(max_n + 1, np.bool_)
    want_top[top_ns] = True
    want_dup = np.zeros(max_n + 1, np.bool_)
    want_dup[dup_ns] = True
    bits = 1
    while (1 << bits) < 2 * size:
        bits += 1
    # An open-addressing table of n-gram -> count; a slot belongs to the current n when its
    # stamp is n, so the table is never cleared between sizes.
    keys = np.empty(1 << bits, np.uint64)
    counts = np.empty(1 << bits, np.int64)
    stamps = np.zeros(1 << bits, np.int64)
    gram = hashes.copy()  # gram[i] = hash of the n-gram starting at word i
    chars = lengths.copy()
    covered = np.zeros(size + 1, np.int64)  # +1 where a repeat starts, -1 past its end
    for n in range(2, max_n + 1):
        m = size - n + 1
        if m < 2:
            break
        for i in range(m):
            gram[i] = gram[i] * np.uint64(1000003) + hashes[i + n - 1]
            chars[i] += lengths[i + n - 1]
        if not (want_top[n] or want_dup[n]):
            continue
        covered[:] = 0
        best, repeats = 0, 0
        for i in range(m):
            g = gram[i]
            slot = (g * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(64 - bits)
            while stamps[slot] == n and keys[slot] != g:
                slot = (slot + np.uint64(1)) & np.uint64((1 << bits) - 1)
            if stamps[slot] != n:
                stamps[slot], keys[slot], counts[slot] = n, g, 1
                continue
            counts[slot] += 1
            repeats += 1
            best = max(best, counts[slot] * chars[i])
            covered[i] += 1
            covered[i + n] -= 1
        if repeats == 0:
            break  # no n-gram repeats, so no longer one does: every later count is 0
        top[n] = best
        if want_dup[n]:
            depth, total = 0, 0
            for i in range(size):
                depth += covered[i]
                if depth > 0:
                    total += lengths[i]
            dup[n] = total
    return top, dup


SPACE, CJK, WORD, LETTER, HAN, COMMON = 1, 2, 4, 8, 16, 32  # bits of a character's class


def word_stats(codes, classes, stop_hashes):
    """Cut a text (as code points) into words like `Doc.words` and measure them.

    Returns (hash of each word, length of each word, counts as in WordCounts). `classes[c]`
    holds the SPACE / CJK / WORD (str.isalnum or "_") / LETTER (str.isalpha) / HAN / COMMON
    (in COMMON_HAN) bits of c; `stop_hashes` are the `word_hash`es of the stop words.
    """
    size = codes.shape[0]
    hashes = np.empty(size, np.uint64)
    lengths = np.empty(size, np.int64)
    counts = np.zeros(10, np.int64)
    stop_seen = np.zeros(stop_hashes.shape[0], np.bool_)
    words, i = 0, 0
    while i < size:
        kind = classes[codes[i]]
        if kind & SPACE:
            i += 1
            continue
        h, start, has_word, has_letter = np.uint64(14695981039346656037), i, False, False
        while True:  # FNV-1a over the code points
            h = (h ^ np.uint64(codes[i])) * np.uint64(1099511628211)
            has_word |= (kind & WORD) != 0
            has_letter |= (kind & LETTER) != 0
            i += 1
            if classes[codes[i - 1]] & CJK or i == size:
                break
            kind = classes[codes[i]]
            if kind & (SPACE | CJK):
                break
        hashes[words], lengths[words] = h, i - start
        words += 1
        for k in range(stop_hashes.shape[0]):
            if h == stop_hashes[k]:
                stop_seen[k] = True
        first = classes[codes[start]]
        if first & CJK:
            counts[4] += 1
            counts[7] += (first & HAN) != 0
            counts[8] += (first & COMMON) != 0
        if not has_word:
            counts[1] += 1
            counts[2] += i - start
        if not has_letter:
            counts[3] += 1
        counts[5] += i - start
    counts[0] = words
    counts[6] = words - counts[1]
    counts[9] = stop_seen.sum()
    return hashes[:words], lengths[:words], counts


def word_hash(word: str) -> int:
    """The hash `word_stats` gives a word (FNV-1a over its code points, unsalted)."""
    h = 14695981039346656037
    for c in word:
        h = ((h ^ ord(c)) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return h


_KERNELS = None
_CLASSES = None


def _kernels():
    """The compiled (word_stats, repetition_stats); numba is imported on first use only."""
    global _KERNELS
    if _KERNELS is None:
        import numba

        _KERNELS = (numba.njit(cache=True, nogil=True)(word_stats),
                    numba.njit(cache=True, nogil=True)(repetition_stats))
    return _KERNELS


def _char_classes():
    """The class bits of every code point (WORD and LETTER as Python's str methods say)."""
    global _CLASSES
    if _CLASSES is None:
        points = np.arange(0x110000, dtype=np.uint32)
        points[0xD800:0xE000] = ord("-")  # lone surrogates: numpy cannot hold them
        chars = points.view("U1")
        table = np.where(np.char.isspace(chars), SPACE, 0).astype(np.uint8)
        table |= np.where(np.char.isalnum(chars), WORD, 0).astype(np.uint8)
        table |= np.where(np.char.isalpha(chars), LETTER, 0).astype(np.uint8)
        table[ord("_")] |= WORD
        for lo, hi in CJK_RANGES:
            table[lo:hi + 1] |= CJK
        han = np.frombuffer("".join(HAN_CHAR.findall("".join(map(chr, range(0x3400, 0x10000)))))
                            .encode("utf-32-le"), np.uint32)
        table[han] |= HAN
        table[0x20000:0x31350] |= HAN
        table[[ord(c) for c in COMMON_HAN]] |= COMMON
        table[0xD800:0xE000] = 0
        _CLASSES = table
    return _CLASSES


def _jieba_words(text: str) -> list[str]:
    import logging

    import jieba

    jieba.setLogLevel(logging.WARNING)
    return [w for w in jieba.lcut(text) if not w.isspace()]


def _duplicates(items: list[str]) -> tuple[int, int]:
    """(items that repeat an earlier one, characters in those repeats)."""
    if len(set(items)) == len(items):
        return 0, 0
    counts = Counter(items)
    repeats = [(item, n - 1) for item, n in counts.items() if n > 1]
    return sum(r for _, r in repeats), sum(len(item) * r for item, r in repeats)


# ---------------------------------------------------------------- the rules


def boilerplate_lines(doc: Doc, cfg) -> str | None:
    """Nothing but boilerplate: every line was navigation, cookie or copyright chrome."""
    if doc.dropped_lines and not doc.text:
        return "boilerplate_lines"
    return None


def c4_lorem_ipsum(doc: Doc, cfg) -> str | None:
    """C4: placeholder text marks a template page, not content."""
    if "psum" in doc.text and "lorem ipsum" in doc.text.lower():
        return "c4_lorem_ipsum"
    return None


def gopher_min_words(doc: Doc, cfg) -> str | None:
    """Too few non-symbol words; CJK documents count one word per character, with jieba too."""
    if doc.is_cjk:
        short = doc.counts.content_words_by_char < cfg.cjk_min_words
    else:
        short = doc.content_words < cfg.min_words
    return "gopher_min_words" if short else None


def gopher_max_words(doc: Doc, cfg) -> str | None:
    if doc.content_words > cfg.max_words:
        return "gopher_max_words"
    return None


def gopher_mean_word_length(doc: Doc, cfg) -> str | None:
    """Mean length of non-symbol words outside [min, max]: tables of numbers, base64, URLs.

    Not for CJK documents, whose words are single characters.
    """
    if doc.is_cjk or not doc.content_words:
        return None
    mean = (doc.counts.word_chars - doc.counts.symbol_chars) / doc.content_words
    if not cfg.min_mean_word_length <= mean <= cfg.max_mean_word_length:
        return "gopher_mean_word_length"
    return None


def gopher_symbol_ratio(doc: Doc, cfg) -> str | None:
    """Hash marks or ellipses per word above the limit: tag clouds, truncated teasers."""
    n = doc.counts.words
    if not n:
        return None
    hashes = doc.text.count("#")
    ellipses = doc.text.count("...") + doc.text.count("…")
    if max(hashes, ellipses) / n > cfg.max_symbol_word_ratio:
        return "gopher_symbol_ratio"
    return None


def gopher_bullet_lines(doc: Doc, cfg) -> str | None:
    """Almost every line a bullet point: menus and link lists."""
    lines = doc.lines
    if lines and sum(map(str.startswith, map(str.lstrip, lines), repeat(BULLETS))) > \
            cfg.max_bullet_lines * len(lines):
        return "gopher_bullet_lines"
    return None


def gopher_ellipsis_lines(doc: Doc, cfg) -> str | None:
    """Many lines cut off with an ellipsis: lists of truncated teasers."""
    lines = doc.lines
    if lines and sum(map(str.endswith, lines, repeat(ELLIPSES))) > cfg.max_ellipsis_lines * len(lines):
        return "gopher_ellipsis_lines"
    return None


def gopher_alpha_words(doc: Doc, cfg) -> str | None:
    """Too few words with a letter (CJK characters are letters): numbers, codes, tables.

    Punctuation-only words are left out of the ratio: in CJK text every mark is its own word.
    """
    if not doc.content_words:
        return None
    letterless = doc.counts.letterless_words - doc.counts.symbol_words
    if doc.content_words - letterless < cfg.min_alpha_words * doc.content_words:
        return "gopher_alpha_words"
    return None


def gopher_stop_words(doc: Doc, cfg) -> str | None:
    """Fewer than `min_stop_words` distinct English stop words: not running English prose."""
    if doc.is_cjk:
        return None
    if doc.counts.stop_words < cfg.min_stop_words:
        return "gopher_stop_words"
    return None


def cjk_common_chars(doc: Doc, cfg) -> str | None:
    """Too few of the 1,000 most common Han characters: random characters, not Chinese."""
    if not doc.is_cjk:
        return None
    han = doc.counts.han_chars
    if han < cfg.cjk_common_chars_min_han:
        return None
    if doc.counts.common_han_chars < cfg.cjk_min_common_chars * han:
        return "cjk_common_chars"
    return None


def gopher_dup_lines(doc: Doc, cfg) -> str | None:
    lines = doc.lines
    if lines and doc.line_repeats[0] > cfg.max_dup_lines * len(lines):
        return "gopher_dup_lines"
    return None


def gopher_dup_paragraphs(doc: Doc, cfg) -> str | None:
    paragraphs = doc.paragraphs
    if paragraphs and doc.paragraph_repeats[0] > cfg.max_dup_paragraphs * len(paragraphs):
        return "gopher_dup_paragraphs"
    return None


def gopher_dup_line_chars(doc: Doc, cfg) -> str | None:
    if doc.text and doc.line_repeats[1] > cfg.max_dup_line_chars * len(doc.text):
        return "gopher_dup_line_chars"
    return None


def gopher_dup_paragraph_chars(doc: Doc, cfg) -> str | None:
    if doc.text and doc.paragraph_repeats[1] > cfg.max_dup_paragraph_chars * len(doc.text):
        return "gopher_dup_paragraph_chars"
    return None


def gopher_top_ngrams(doc: Doc, cfg) -> str | None:
    """The most frequent word n-gram (n = 2, 3, 4) covers too many characters: spam, chants."""
    top, _, total, scale = doc.ngram_stats
    for n, limit in enumerate(cfg.max_top_ngram_chars, start=2):
        if total and top[round(n * scale)] > limit * total:
            return "gopher_top_ngrams"
    return None


def gopher_dup_ngrams(doc: Doc, cfg) -> str | None:
    """Repeated word n-grams (n = 5 … 10) cover too many characters: copy-pasted blocks."""
    _, dup, total, scale = doc.ngram_stats
    for n, limit in enumerate(cfg.max_dup_ngram_chars, start=5):
        if total and dup[round(n * scale)] > limit * total:
            return "gopher_dup_ngrams"
    return None


def fineweb_line_punctuation(doc: Doc, cfg) -> str | None:
    """Too few lines end a sentence: menus, lists of links, keyword dumps."""
    lines = doc.lines
    if lines and sum(map(str.endswith, lines, repeat(TERMINAL_PUNCTUATION))) < \
            cfg.min_terminal_lines * len(lines):
        return "fineweb_line_punctuation"
    return None


RULES = (
    boilerplate_lines,
    c4_lorem_ipsum,
    gopher_min_words,
    gopher_max_words,
    gopher_mean_word_length,
    gopher_symbol_ratio,
    gopher_bullet_lines,
    gopher_ellipsis_lines,
    gopher_alpha_words,
    gopher_stop_words,
    cjk_common_chars,
    gopher_dup_lines,
    gopher_dup_paragraphs,
    gopher_dup_line_chars,
    gopher_dup_paragraph_chars,
    gopher_top_ngrams,
    gopher_dup_ngrams,
    fineweb_line_punctuation,
)
RULE_NAMES = tuple(rule.__name__ for rule in RULES)


def first_failed_rule(doc: Doc, cfg, rules=RULES) -> str | None:
    """The reason of the first rule in `rules` that rejects `doc`, or None to keep it."""
    for rule in rules:
        reason = rule(doc, cfg)
        if reason is not None:
            return reason
    return None
