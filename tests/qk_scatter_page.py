"""The page tests/test_qk_scatter_browser.py serves: the WebGL scatter of a small known map (:func:`known_map`)
in the language ``?lang=`` names, with the Altair chart where the browser has no WebGL (as the Dataset page)."""
from __future__ import annotations

import numpy as np

from attnviz import qkmap

PHOTOS, GRID = 3, (3, 3)
NAMES = ["cat.jpg", "狗.png", "bird <b>&amp;</b>.jpg"]  # not ASCII, and HTML that must show as text
COLUMNS = 10  # the points lie on a 10-column lattice, in order: far enough apart to find each by its pixels


def known_map() -> tuple[qkmap.QKMap, np.ndarray, list[str]]:
    """3 photos of a 3 × 3 grid and a class token (N = 10): 60 points, point ``i`` at (i % 10, 2 · (i // 10)),
    coloured by its index (viridis), the class tokens without a value (grey)."""
    n = 1 + GRID[0] * GRID[1]
    i = np.arange(PHOTOS * 2 * n)
    xy = np.stack([i % COLUMNS, 2 * (i // COLUMNS)], 1).astype(np.float64)
    token = i % n
    qk = qkmap.QKMap(layer=0, head=0, method="pca", normalize="none", xy=xy, is_key=(i % (2 * n)) >= n,
                     photo=i // (2 * n), token=token, vectors=np.zeros((len(i), 2)),
                     logits=tuple(np.zeros((n, n)) for _ in range(PHOTOS)), grid=GRID, num_prefix_tokens=1)
    return qk, np.where(token == 0, np.nan, i.astype(np.float64)), list(NAMES)


def main() -> None:
    import streamlit as st

    from attnviz_app import qk_scatter
    from attnviz_app.dataset_qk import chart
    from attnviz_app.text import t
    from attnviz_app.views.common import token_label

    st.session_state["lang"] = st.query_params.get("lang", "en")
    qk, values, names = known_map()
    title = t("qkmap.colour_row")
    labels = [token_label(i, qk.num_prefix_tokens, qk.grid) for i in range(qk.num_tokens)]
    data = qk_scatter.payload(qk, values, names, labels, title, False, qk_scatter.words())
    qk_scatter.show(data, "scatter", lambda: st.altair_chart(chart(qk, values, names, title, False), width="stretch"))
    st.caption("end of page")


if __name__ == "__main__":
    main()
