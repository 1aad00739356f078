"""Both languages have every key of every part file, the same placeholders, and no empty strings."""
from __future__ import annotations

import re
import string
import tomllib
from pathlib import Path

import pytest

from attnviz import i18n

LOCALES = Path(i18n.__file__).with_name("locales")


def placeholders(template: str) -> set[str]:
    return {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}


def part_keys(lang: str) -> dict[str, set[str]]:
    parts = {}
    for path in sorted((LOCALES / lang).glob("*.toml")):
        with open(path, "rb") as f:
            parts[path.name] = set(i18n._flatten(tomllib.load(f)))
    return parts


def test_every_language_has_the_same_part_files():
    names = {lang: sorted(p.name for p in (LOCALES / lang).glob("*.toml")) for lang in i18n.LANGUAGES}
    assert names["en"], "no catalogues found"
    for lang, files in names.items():
        assert files == names["en"], f"{lang} has part files {files}, English has {names['en']}"


@pytest.mark.parametrize("lang", [lang for lang in i18n.LANGUAGES if lang != "en"])
def test_each_part_file_has_the_same_keys_in_both_languages(lang):
    english, other = part_keys("en"), part_keys(lang)
    for name, keys in english.items():
        assert not keys - other.get(name, set()), f"{lang}/{name} lacks {sorted(keys - other.get(name, set()))}"
        assert not other.get(name, set()) - keys, f"{lang}/{name} has extra {sorted(other[name] - keys)}"


def test_no_key_repeats_across_part_files():
    for lang in i18n.LANGUAGES:
        seen: dict[str, str] = {}
        for name, keys in part_keys(lang).items():
            for key in keys:
                assert key not in seen, f"{lang}: {key} is in both {seen[key]} and {name}"
                seen[key] = name


@pytest.mark.parametrize("lang", list(i18n.LANGUAGES))
def test_strings_are_non_empty_and_placeholders_match_english(lang):
    english, other = i18n.catalogue("en"), i18n.catalogue(lang)
    assert set(other) == set(english)
    for key, template in other.items():
        assert isinstance(template, str) and template.strip(), f"{lang}: {key} is empty"
        assert placeholders(template) == placeholders(english[key]), f"{lang}: {key} has other placeholders"


@pytest.mark.parametrize("lang", list(i18n.LANGUAGES))
def test_percentages_are_written_one_way(lang):
    """60%, as Python's ``{:.0%}`` writes the page's other percentages, never "60 %" beside them."""
    spaced = {key: template for key, template in i18n.catalogue(lang).items() if re.search(r"[0-9}] %", template)}
    assert not spaced, f"{lang}: a space before % in {sorted(spaced)}"


@pytest.mark.parametrize("lang", list(i18n.LANGUAGES))
def test_bold_words_are_bold_in_commonmark(lang):
    """Streamlit's Markdown is CommonMark: ``**查詢（query）**圖塊`` shows its stars, as a ``**`` after a bracket
    and before a letter cannot close (the neuron view's first sentence did). Rendered as CommonMark, no string
    keeps a ``**``."""
    from markdown_it import MarkdownIt  # CommonMark, installed with Streamlit (rich)

    markdown = MarkdownIt("commonmark")
    shown = {key: markdown.render(template) for key, template in i18n.catalogue(lang).items() if "**" in template}
    assert shown, "no bold words to check"
    stars = {key: html for key, html in shown.items() if "**" in re.sub(r"<code>.*?</code>", "", html)}
    assert not stars, f"{lang}: {stars}"


def test_chinese_catalogue_is_chinese_and_uses_taiwanese_terms():
    zh = i18n.catalogue("zh-TW")
    text = "".join(zh.values())
    for term in ("注意力", "查詢", "鍵", "值", "圖塊", "類別 token", "多頭注意力", "熱力圖"):
        assert term in text, term
    # Simplified forms that a Taiwanese classroom would not use.
    for simplified in ("注意力图", "查询", "热力图", "图块", "类别"):
        assert simplified not in text, simplified
    assert zh["lesson.title"] != i18n.catalogue("en")["lesson.title"]


def test_lists_in_a_sentence_take_the_language_s_comma():
    assert i18n.join("en", [3, 6, "12 × 12"]) == "3, 6, 12 × 12"
    assert i18n.join("zh-TW", [3, 6, "12 × 12"]) == "3、6、12 × 12"  # 頓號
    assert i18n.join("zh-TW", []) == ""


def test_text_fills_placeholders():
    assert i18n.text("en", "lesson.head_n", n=3) == "head 3"
    assert i18n.text("zh-TW", "lesson.head_n", n=3) == "第 3 個注意力頭"
    assert i18n.text("en", "lesson.scale.variance", what="q·k", var=65.416, expected=64, std=8.088) == (
        "Variance of q·k: **65.42** (theory: 64); typical size (standard deviation): **8.09**."
    )
    with pytest.raises(KeyError):
        i18n.text("en", "lesson.head_n", m=3)  # a placeholder left unfilled
    with pytest.raises(KeyError):
        i18n.text("en", "lesson.no_such_key")
    with pytest.raises(KeyError):
        i18n.text("xx", "lesson.title")


def test_chinese_keeps_patch_and_block_apart():
    """圖塊 is a patch, 區塊 a transformer block (Swin's Stage / Block): a text that says 區塊 speaks of a block
    in English too, so a student never reads 'block' where the English says 'patch'."""
    en, zh = i18n.catalogue("en"), i18n.catalogue("zh-TW")
    mixed = [key for key, text in zh.items() if "區塊" in text and "block" not in en[key].lower()]
    assert not mixed, mixed
    assert sum("圖塊" in text for text in zh.values()) > 100  # the word for patch is in use


def test_every_box_of_the_app_says_its_placeholder_in_the_page_s_language():
    """A select box shows its placeholder once a reader erases its text to filter the options (seen in Chromium:
    the Size box in Chinese said "Choose an option" before): every select box and multiselect of the app passes
    its own placeholder, so none shows Streamlit's English one."""
    import ast

    from conftest import ROOT

    missing = []
    for path in sorted((ROOT / "attnviz_app").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                    node.func.attr in ("selectbox", "multiselect") and \
                    not any(keyword.arg == "placeholder" for keyword in node.keywords):
                missing.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not missing, missing


# Full-width punctuation inside Chinese sentences (issue #46, docs/classroom.md "繁體中文用語"): a half-width
# , : ; ? ! next to a Chinese character, ( ) around Chinese words, a . that ends a Chinese sentence, or a lone …
# where Chinese writes ……. Formulas ($…$), code (`…`), URLs, an address's ?query=string and {placeholders} are
# set aside first, so "Q, K", "{lo:.4f}", "softmax(QKᵀ/√d_k)", "?present=1" and "1.5" stay as they are.
_HAN = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_CJK = _HAN + "\u3000-\u303f\uff01-\uff5e"  # Chinese characters and full-width punctuation (「」、。，（）…)
_SET_ASIDE = re.compile(r"```.*?```|`[^`]*`|\$[^$]*\$|https?://\S+|(?<!\S)\?[\w-]+=\S*|\{[^{}]*\}", re.S)
_HALF_WIDTH = [
    ("half-width , : ; ? ! beside a Chinese character",
     re.compile(rf"(?:(?<=[{_CJK}])|(?<=[{_CJK}] ))[,:;?!]|[,:;?!](?= ?[{_CJK}])")),
    ("half-width ( ) around Chinese words", re.compile(rf"\([^()]*[{_HAN}][^()]*\)")),
    ("a . ending a Chinese sentence", re.compile(rf"[{_CJK}] ?\.(?!\.)(?=\s|$)")),
    ("a lone … after Chinese (刪節號 is ……)", re.compile(rf"[{_CJK}]…(?!…)")),
]


def half_width_punctuation(text: str) -> list[str]:
    """The places in ``text`` where a Chinese sentence uses half-width punctuation, each with its rule."""
    plain = _SET_ASIDE.sub("0", text).replace("**", "")  # a formula or a value reads as a number
    return [f"{rule}: {found.group()!r}" for rule, pattern in _HALF_WIDTH for found in pattern.finditer(plain)]


@pytest.mark.parametrize(("text", "hits"), [
    ("注意力, 圖塊", 1), ("查詢:鍵", 1), ("是嗎?", 1), ("好!", 1), ("第 1 層; 第 2 層", 1), ("(查詢)", 1),
    ("這是一個圖塊.", 1), ("一個圖塊. 下一句", 1), ("「crop」, 或", 1),
    ("Q, K 的內積", 0), ("$q_i, k_j$ 的內積", 0), ("第 {layer} 層，{lo:.4f}（亮）", 0), ("softmax(QKᵀ/√d_k) 中", 0),
    ("色階：暗 = {lo:.4f}", 0), ("`numpy.load()` 讀取", 0), ("見 https://example.org/a,b.html。", 0),
    ("用 numpy.load() 讀取", 0), ("……以及另外 {count} 張", 0), ("({row}, {col})", 0), ("1.5 倍", 0),
    ("**模型：** {name}", 0), ("pip install 'attnviz[qk]'。", 0),
    ("正在載入模型…", 1), ("正在載入模型……", 0), ("超出 {low} … {high} 的值", 0), ("網址加上 ?present=1 也能開啟", 0),
])
def test_the_punctuation_check_finds_half_width_marks_in_chinese_only(text, hits):
    assert len(half_width_punctuation(text)) == hits, half_width_punctuation(text)


def test_chinese_sentences_take_full_width_punctuation():
    """，：；？！（）。 inside Chinese sentences, as a Taiwanese textbook prints them (教育部《重訂標點符號手冊》)."""
    found = {key: hits for key, text in i18n.catalogue("zh-TW").items() if (hits := half_width_punctuation(text))}
    assert not found, found


# One Chinese word per concept (issue #46, docs/classroom.md "繁體中文用語"): where the English names the concept, the
# Chinese says the chosen word, and the words a Taiwanese teacher questioned (or a mainland reader would use) are gone.
CHOSEN_TERMS = {  # concept: (the English that names it, the Chinese words that may say it, the rejected words)
    "attention head": (r"\bheads?\b(?!\))", ("注意力頭", "多頭注意力", "分類頭"), (r"(?<!注意力)(?<!多)(?<!分類)(?<!檔)頭",)),
    "attention rollout": (r"\brollout\b", ("注意力傳遞（rollout）", "注意力傳遞"), ("擴散", "注意力 rollout", "累積注意力（")),
    "view": (r"\b(?<!presenter )(?<!this )views?\b", ("檢視",), ("視圖", "檢視方式")),
    "heatmap": (r"\bheat ?maps?\b", ("熱力圖",), ("熱圖",)),
    "QR code": (r"scan the code|\bQR\b", ("QR Code",), ("條碼", "二維碼", "掃碼", "QR 碼")),
    "bias (added to a logit)": (r"\bbias\b", ("偏差項",), ("偏置",)),
    "Q/K map": (r"\bQ/K map", ("Q/K 散佈圖",), ("地圖",)),
    "dimension reduction": (r"\bflatten", ("降維",), ("壓平", "壓成 2 個")),
    "prefix token": (r"\bprefix tokens?\b", ("前置 token",), ("前綴",)),
    "forward pass": (r"\bforward pass", ("前向傳播",), ("前向計算",)),
    "frame (of a video or animation)": (r"\b(?:video|camera|animated)\b[^.]*\bframes?\b|\bframes?\b[^.]*\b(?:video|camera)\b", ("格", "畫面", "影格"), ("幀",)),
}
MAINLAND_WORDS = ("視頻", "默認", "信息", "屏幕", "軟件", "數據", "質量", "網絡", "圖像", "模塊", "程序", "調用", "變量",
                  "歸一化", "運行", "加載", "菜單", "鼠標", "點擊", "設置", "支持", "緩存", "服務器", "鏈接", "界面", "打印",
                  "用戶", "文件夾", "硬件", "視窗化", "分辨率", "實時", "在線")


@pytest.mark.parametrize("concept", list(CHOSEN_TERMS))
def test_each_concept_has_one_chinese_word(concept):
    english_pattern, chosen, rejected = CHOSEN_TERMS[concept]
    en, zh = i18n.catalogue("en"), i18n.catalogue("zh-TW")
    naming = [key for key, text in en.items() if re.search(english_pattern, _SET_ASIDE.sub("", text), re.I)]
    assert naming, f"no English string names {concept}"
    unsaid = {key: zh[key] for key in naming if not any(word in zh[key] for word in chosen)}
    assert not unsaid, f"{concept}: the Chinese lacks {chosen[0]} in {unsaid}"
    used = {key: text for key, text in zh.items() for word in rejected if re.search(word, text)}
    assert not used, f"{concept}: a rejected word in {used}"


def test_chinese_uses_taiwanese_words_not_mainland_ones():
    zh = i18n.catalogue("zh-TW")
    used = {word: [key for key, text in zh.items() if word in text] for word in MAINLAND_WORDS}
    assert not {word: keys for word, keys in used.items() if keys}
    assert "資料" in "".join(zh.values()) and "影片" in "".join(zh.values())  # data, video: the Taiwanese words in use


LAYOUT_WORDS = {  # on a phone Streamlit's columns stack and nothing hovers (issue #46)
    "en": r"\b(?:left|right)(?: picture| grid| image| column| one)\b|\bon the (?:left|right)\b|(?:^|[.;:] )Hover\b",
    "zh-TW": r"左圖|右圖|左邊的|右邊的|左側|右側|滑過",
}


@pytest.mark.parametrize("lang", list(i18n.LANGUAGES))
def test_instructions_hold_on_a_phone(lang):
    """A picture is named by what it shows (the photo, the heatmap, a grid's title), not by where a desktop puts it,
    and what needs a mouse is offered as pointing (or says it needs a mouse), not as "hover"."""
    said = {key: found.group() for key, text in i18n.catalogue(lang).items()
            if (found := re.search(LAYOUT_WORDS[lang], text, re.M))}
    assert not said, said
    assert re.search(LAYOUT_WORDS["en"], "Click a query patch on the left picture and a key patch on the right one.")
    assert re.search(LAYOUT_WORDS["zh-TW"], "在左圖點一個查詢圖塊")
