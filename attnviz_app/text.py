"""The page's words in the language this browser session chose."""
from __future__ import annotations

import json

import streamlit as st

from attnviz import i18n


def t(key: str, **values: object) -> str:
    """Translate ``key`` into the language this browser session chose."""
    return i18n.text(st.session_state.get("lang") or i18n.DEFAULT, key, **values)


def listed(items) -> str:
    """Items listed in a sentence of this session's language (:func:`attnviz.i18n.join`)."""
    return i18n.join(st.session_state.get("lang") or i18n.DEFAULT, items)


def device_label(device: object) -> str:
    """What a student reads for a PyTorch device: "CPU", or "GPU (cuda:0)" (its name otherwise)."""
    name = str(device)
    kind = name.split(":")[0]
    return t("model.device_cuda", device=name) if kind == "cuda" else t("model.device_cpu") if kind == "cpu" else name


# Streamlit writes a few words of its own widgets in English whatever the page's language (the uploader's "Upload" and
# "50MB per file", the camera's "Take Photo", the keyboard's "Skip to main content" link, the toolbars' tooltips "Show
# data" and "Fullscreen"; streamlit/streamlit#13500), and names its buttons for screen readers in English ("Help for
# 層", "Collapse sidebar"). Once per language, this script rewrites those text nodes inside those widgets and
# tooltips, and those names (aria-label) on Streamlit's own elements, whole only, and keeps doing so as Streamlit
# redraws them; back in English it puts Streamlit's words back. A chart's axes and legends are named for a screen
# reader by the chart itself (views/common.described).
WIDGET_WORDS_JS = """
<style>
/* an element that only runs a script (this one, the classroom's) takes no room: it left a 16 px gap above the page */
[data-testid="stElementContainer"]:has(> [data-testid="stHtml"] > script):not(:has(> [data-testid="stHtml"] > :not(script, style))) {
  display: none; }
</style>
<script>
(() => {
  window.__attnvizWords = %(rules)s.map(([pattern, text]) => [new RegExp(pattern), text]);
  const widgets = '[data-testid="stFileUploader"], [data-testid="stCameraInput"], [data-testid="stSkipToContent"], ' +
    '[data-testid="stTooltipContent"]';
  const named = 'button[aria-label], a[aria-label], nav[aria-label], section[aria-label], div[aria-label], ' +
    'input[aria-label]';
  const translated = (own) => {
    let text = own;
    for (const [pattern, words] of window.__attnvizWords) text = text.replace(pattern, words);
    return text;
  };
  const rewrite = () => {
    for (const widget of document.querySelectorAll(widgets)) {
      const walker = document.createTreeWalker(widget, NodeFilter.SHOW_TEXT);
      for (let node = walker.nextNode(); node; node = walker.nextNode()) {
        // Streamlit's own words: what it wrote last, unless it has written something else since
        const own = node.nodeValue === node.__attnvizWritten ? node.__attnvizOwn : node.nodeValue;
        const text = translated(own);
        node.__attnvizOwn = own;
        node.__attnvizWritten = text;
        if (node.nodeValue !== text) node.nodeValue = text;
      }
    }
    for (const element of document.querySelectorAll(named)) {  // the same, for the names screen readers say
      const label = element.getAttribute('aria-label');
      const own = label === element.__attnvizWrittenLabel ? element.__attnvizOwnLabel : label;
      const text = translated(own);
      element.__attnvizOwnLabel = own;
      element.__attnvizWrittenLabel = text;
      if (label !== text) element.setAttribute('aria-label', text);
    }
  };
  rewrite();
  if (!window.__attnvizWordsObserver) {
    window.__attnvizWordsObserver = new MutationObserver(rewrite);
    window.__attnvizWordsObserver.observe(document.body, {childList: true, subtree: true, characterData: true,
                                                          attributes: true, attributeFilter: ['aria-label']});
  }
})();
</script>
"""


TOOLBAR = (("show_data", "Show data"), ("download_png", "Download as PNG"), ("download_csv", "Download as CSV"),
           ("copy_spec", "Copy Vega-Lite spec"), ("fullscreen", "Fullscreen"), ("close_fullscreen", "Close fullscreen"),
           ("search", "Search"), ("columns", "Show/hide columns"))


# Streamlit's own words, as regular expressions of whole text nodes and names: (key of ``streamlit.*``, pattern).
# tests/test_streamlit_canary.py finds each in the Streamlit installed.
STREAMLIT_WORDS = (
    ("upload", "Upload"), ("per_file", r"(\d+(?:\.\d+)?)MB per file"), ("take_photo", "Take Photo"),
    ("clear_photo", " ?Clear photo"), ("uploading", r"Uploading\.\.\."), ("drop_here", "Drag and drop a file here"),
    ("camera_asks", r"This app would like to use your camera\."), ("camera_how", r"Learn how to allow access\."),
    ("skip", "Skip to main content"), ("help_for", "Help for (.+)"), ("collapse_sidebar", "Collapse sidebar"),
    ("expand_sidebar", "Expand sidebar"), ("app_pages", "App pages"), ("sidebar", "Sidebar"), ("open", "Open"),
    ("heading_link", "Link to heading"), ("chart", "Vega visualization"), ("range_start", "(.+) — start"),
    ("range_end", "(.+) — end"), ("decrement", "Decrement"), ("increment", "Increment"),
    ("copy_code", "Copy to clipboard"), *TOOLBAR,
)


def widget_words() -> None:
    """Streamlit's English words in its uploader, its camera, its skip link and its toolbars' tooltips, and the names
    it gives its buttons for screen readers, in this session's language (``streamlit.*``; ``$1`` in a translation is
    what the pattern caught: a number, a caption, a label). A toolbar button of a named element is "Show data: <the
    element's name>" to a screen reader: ``streamlit.naming`` joins the two."""
    rules = [(f"^{pattern}$", t(f"streamlit.{key}")) for key, pattern in STREAMLIT_WORDS]
    rules += [(f"^{label}: (.+)$", t(f"streamlit.{key}") + t("streamlit.naming")) for key, label in TOOLBAR]
    st.html(WIDGET_WORDS_JS % {"rules": json.dumps(rules, ensure_ascii=False)}, unsafe_allow_javascript=True)
