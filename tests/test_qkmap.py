"""The Q/K map (attnviz/qkmap.py) against independent recomputations: PCA by eigh of the covariance,
q and k by a plain loop over the timm blocks, softmax rows before and after AttentionViz's normalisation."""
from __future__ import annotations

import re

import numpy as np
import pytest
import timm
import torch
from PIL import Image

import attnviz
from attnviz import qkmap
from conftest import tiny_vit, Q, K, SCALE


def independent_pca(points: np.ndarray) -> np.ndarray:
    """(P, D) → (P, 2) by the SVD of the centred points (attnviz uses eigh of the scatter matrix instead)."""
    centred = points - points.mean(0)
    u, s, _ = np.linalg.svd(centred, full_matrices=False)
    return u[:, :2] * s[:2]


def same_up_to_sign(a: np.ndarray, b: np.ndarray) -> float:
    """Largest difference between the columns of a and b after flipping each column of b to match a."""
    signs = np.sign((a * b).sum(0))
    return float(np.abs(a - b * signs).max())


def loop_qk(model: attnviz.Model, x: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each layer's (H, N, d_k) q and k by hand: timm's blocks one by one, qkv split as in the paper."""
    net = model.network
    out = []
    with torch.no_grad():
        h = net.norm_pre(net._pos_embed(net.patch_embed(x)))
        for block in net.blocks:
            y = block.norm1(h)
            b, n, c = y.shape
            qkv = block.attn.qkv(y).reshape(b, n, 3, block.attn.num_heads, c // block.attn.num_heads)
            q, k = qkv[0, :, 0].transpose(0, 1), qkv[0, :, 1].transpose(0, 1)  # (H, N, d_k)
            out.append((block.attn.q_norm(q), block.attn.k_norm(k)))
            h = block(h)
    return out


@pytest.fixture(scope="module")
def tiny_cap():
    model = tiny_vit()
    torch.manual_seed(1)
    x = torch.randn(1, 3, 32, 32)
    return model, x, attnviz.capture_tensor(model, x)


def test_points_are_the_capture_queries_and_keys_and_pca_is_exact(tiny_cap):
    model, x, cap = tiny_cap
    by_hand = loop_qk(model, x)
    n = cap.num_tokens
    for layer in range(cap.num_layers):
        for head in range(cap.num_heads):
            qk = qkmap.qk_map(cap, layer, head, method="pca", normalize="none")
            q, k = by_hand[layer][0][head].double().numpy(), by_hand[layer][1][head].double().numpy()
            assert np.array_equal(qk.vectors[:n], Q(cap)[layer, head].double().numpy())  # exactly the capture's
            assert np.array_equal(qk.vectors[n:], K(cap)[layer, head].double().numpy())
            assert np.abs(qk.vectors[:n] - q).max() < 1e-5 and np.abs(qk.vectors[n:] - k).max() < 1e-5
            assert same_up_to_sign(independent_pca(np.concatenate([q, k])), qk.xy) <= 1e-4
            assert list(qk.kind[:n]) == ["query"] * n and list(qk.kind[n:]) == ["key"] * n
            assert list(qk.token) == list(range(n)) * 2


def test_attentionviz_normalisation_leaves_softmax_unchanged(tiny_cap):
    _, _, cap = tiny_cap
    n = cap.num_tokens
    for layer in range(cap.num_layers):
        for head in range(cap.num_heads):
            qk = qkmap.qk_map(cap, layer, head, normalize="attentionviz")
            q, k = qk.vectors[:n], qk.vectors[n:]
            assert np.allclose(q.mean(0), k.mean(0), atol=1e-12)  # centroids coincide
            assert np.isclose(np.linalg.norm(q, axis=1).mean(), np.linalg.norm(k, axis=1).mean())  # norms match
            logits = q @ k.T * SCALE(cap)
            weights = np.exp(logits - logits.max(1, keepdims=True))
            weights /= weights.sum(1, keepdims=True)
            assert np.abs(weights - cap.weights(layer, head)).max() < 1e-5  # float32 capture vs float64 here
            raw = qkmap.qk_map(cap, layer, head, normalize="none").vectors
            assert not np.allclose(raw, qk.vectors)  # it did move the points


def test_many_photos_and_top_keys():
    model = tiny_vit()
    torch.manual_seed(2)
    caps = [attnviz.capture_tensor(model, torch.randn(1, 3, 32, 32)) for _ in range(3)]
    qk = qkmap.qk_map(caps, 1, 2, normalize="none")
    n = caps[0].num_tokens
    assert qk.xy.shape == (3 * 2 * n, 2) and qk.num_photos == 3
    stacked = np.concatenate([np.concatenate([Q(c)[1, 2].double().numpy(), K(c)[1, 2].double().numpy()]) for c in caps])
    assert np.array_equal(qk.vectors, stacked)
    assert same_up_to_sign(independent_pca(stacked), qk.xy) <= 1e-4
    assert qk.index(2, 5, key=True) == 2 * 2 * n + n + 5 and qk.photo[qk.index(2, 5, True)] == 2
    # The top keys are the largest weights of that query's row in the capture.
    row = caps[1].row(1, 2, 7)
    assert list(qk.top_keys(1, 7, 5)) == list(np.argsort(-row, kind="stable")[:5])
    with pytest.raises(ValueError, match="same model"):
        qkmap.qk_map([caps[0], attnviz.capture_tensor(tiny_vit(reg_tokens=1), torch.randn(1, 3, 32, 32))], 0, 0)
    with pytest.raises(IndexError, match="head must be"):
        qkmap.qk_map(caps[0], 0, 4)


def test_statistics_known_answers():
    assert qkmap.spearman(np.array([1., 2, 3, 4]), np.array([10., 20, 40, 30])) == pytest.approx(0.8)  # 1 − 6·2/60
    rng = np.random.default_rng(0)
    xy = rng.normal(size=(50, 2))
    assert qkmap.multiple_r(3 * xy[:, 0] - xy[:, 1] + 2, xy) == pytest.approx(1.0)
    noise = rng.normal(size=50)
    fit = np.polyfit(xy[:, 0], noise, 1)  # one regressor: R = |Pearson r|
    assert qkmap.multiple_r(noise, xy[:, :1]) == pytest.approx(abs(np.corrcoef(xy[:, 0], noise)[0, 1]))
    assert fit.shape == (2,)


def test_closeness_bands_follow_the_sign_of_rho():
    """The page's first sentence: nearer pairs attend more (ρ ≤ −0.4, < −0.1), no order, or farther pairs
    attend more (ρ > 0.1, ≥ 0.4), which the page used to call "says little"."""
    band = lambda rho: qkmap.QKStats(rho, 0.5, 0.5, 100).closeness  # noqa: E731
    assert [band(r) for r in (-0.9, -0.4, -0.39, -0.11, -0.1, 0.0, 0.1, 0.11, 0.39, 0.4, 0.9)] == [
        "strong", "strong", "weak", "weak", "none", "none", "none", "against_weak", "against_weak", "against", "against"]


def test_statistics_of_a_map(tiny_cap):
    _, _, cap = tiny_cap
    qk = qkmap.qk_map(cap, 0, 1, normalize="none")
    stats = qkmap.statistics(qk)
    n = cap.num_tokens
    logits = (Q(cap)[0, 1].double() @ K(cap)[0, 1].double().T).numpy().ravel()
    dist = np.linalg.norm(qk.xy[:n, None] - qk.xy[None, n:], axis=-1).ravel()
    rank = lambda v: np.argsort(np.argsort(v))  # noqa: E731
    assert stats.distance_rho == pytest.approx(np.corrcoef(rank(logits), rank(dist))[0, 1], abs=1e-12)
    assert stats.pairs == n * n
    patches = qk.token >= 1
    rows = (qk.token[patches] - 1) // 4
    design = np.column_stack([np.ones(patches.sum()), qk.xy[patches]])
    pred = design @ np.linalg.lstsq(design, rows, rcond=None)[0]
    assert stats.row_r == pytest.approx(np.corrcoef(pred, rows)[0, 1], abs=1e-9)  # R = corr(fitted, observed)


def test_colour_values():
    model = tiny_vit()
    picture = np.zeros((32, 32, 3), np.uint8)
    picture[:, :16] = (255, 0, 0)  # left half red, right half blue
    picture[:, 16:] = (0, 0, 255)
    cap = attnviz.capture(model, Image.fromarray(picture), fit="squash")
    qk = qkmap.qk_map(cap, 0, 0)
    hue = qkmap.colour_values(qk, cap, "hue")
    bright = qkmap.colour_values(qk, cap, "brightness")
    col = qkmap.colour_values(qk, cap, "column")
    assert np.isnan(hue[0]) and np.isnan(col[0])  # the class token has no patch
    left, right = (col == 0), (col == 3)
    assert np.allclose(hue[left], 0.0, atol=0.02) and np.allclose(hue[right], 2 / 3, atol=0.02)
    assert np.allclose(bright[left], 0.299, atol=0.02) and np.allclose(bright[right], 0.114, atol=0.02)
    assert list(qkmap.colour_values(qk, cap, "row")[1:5]) == [0, 0, 0, 0]
    cls = qkmap.colour_values(qk, cap, "cls_attention")
    assert np.allclose(cls[:cap.num_tokens], cap.row(0, 0, 0)) and np.allclose(cls[cap.num_tokens:], cap.row(0, 0, 0))
    assert set(qkmap.colour_values(qk, cap, "photo")) == {0.0}


def test_atlas_matches_the_single_maps(tiny_cap):
    _, _, cap = tiny_cap
    at = qkmap.atlas(cap)
    assert at.xy.shape == (2, 4, 2 * cap.num_tokens, 2)
    for layer in range(2):
        for head in range(4):
            qk = qkmap.qk_map(cap, layer, head)
            assert np.allclose(at.xy[layer, head], qk.xy)
            assert at.row_r[layer, head] == pytest.approx(qkmap.statistics(qk).row_r)


def test_missing_projection_package_is_one_sentence(monkeypatch, tiny_cap):
    _, _, cap = tiny_cap
    monkeypatch.setattr(qkmap, "available", lambda method: method == "pca")
    with pytest.raises(qkmap.ProjectionUnavailable) as e:
        qkmap.qk_map(cap, 0, 0, method="tsne")
    assert str(e.value) == "t-SNE needs the scikit-learn package: pip install 'attnviz[qk]' (or pip install scikit-learn)."
    with pytest.raises(ValueError, match="method must be"):
        qkmap.qk_map(cap, 0, 0, method="mds")


def test_real_model_pca_equals_independent_pca(real_model, cat):
    cap = attnviz.capture(real_model, cat)
    n = cap.num_tokens
    qk = qkmap.qk_map(cap, 5, 2, normalize="none")
    q, k = Q(cap)[5, 2].double().numpy(), K(cap)[5, 2].double().numpy()
    assert np.array_equal(qk.vectors, np.concatenate([q, k])) and qk.xy.shape == (2 * n, 2)
    assert same_up_to_sign(independent_pca(np.concatenate([q, k])), qk.xy) <= 1e-4
    stats = qkmap.statistics(qkmap.qk_map(cap, 5, 2))
    assert -1 <= stats.distance_rho <= 1 and 0 <= stats.row_r <= 1


def test_tsne_when_installed(tiny_cap):
    pytest.importorskip("sklearn", reason="t-SNE needs scikit-learn (pip install 'attnviz[qk]')")
    _, _, cap = tiny_cap
    qk = qkmap.qk_map(cap, 1, 0, method="tsne")
    again = qkmap.qk_map(cap, 1, 0, method="tsne")
    assert qk.xy.shape == (2 * cap.num_tokens, 2) and np.isfinite(qk.xy).all()
    assert np.array_equal(qk.xy, again.xy)  # seeded: the same picture on every rerun of the page
    assert np.array_equal(qk.vectors, qkmap.qk_map(cap, 1, 0).vectors)  # the same points, another projection


def test_umap_when_installed(tiny_cap):
    pytest.importorskip("umap", reason="UMAP needs umap-learn (pip install 'attnviz[qk]')")
    _, _, cap = tiny_cap
    qk = qkmap.qk_map(cap, 1, 0, method="umap")
    n = cap.num_tokens
    assert qk.xy.shape == (2 * n, 2) and np.isfinite(qk.xy).all() and qk.method == "umap"
    assert list(qk.kind) == ["query"] * n + ["key"] * n and list(qk.token) == list(range(n)) * 2
    assert np.array_equal(qk.xy, qkmap.qk_map(cap, 1, 0, method="umap").xy)  # seeded: the same picture twice
    assert not np.allclose(qk.xy, qkmap.qk_map(cap, 1, 0, method="umap", seed=1).xy)  # and the seed is what fixes it
    assert np.array_equal(qk.vectors, qkmap.qk_map(cap, 1, 0).vectors)  # the same points, another projection


def nearest_key_hit_rate(qk: qkmap.QKMap, top: int = 5) -> float:
    """How often a query's nearest key in 2-D is one of its ``top`` keys by q · k (one photo); by chance top / N."""
    n = qk.num_tokens
    nearest = np.linalg.norm(qk.xy[:n, None] - qk.xy[None, n:], axis=-1).argmin(1)  # (N,) key token per query
    best = np.argsort(-qk.logits[0], axis=1)[:, :top]  # (N, top)
    return float((best == nearest[:, None]).any(1).mean())


def test_umap_keeps_neighbourhoods(real_model, cat):
    """UMAP places a query next to a key it attends to: measured on head 1 of every layer (not chosen for
    the result) of the real model on the cat, the nearest 2-D key is among the query's 5 strongest keys for
    41 % of queries on average (chance: 5 / 197 = 2.5 %; PCA: 17 %); the bound is 8× chance."""
    pytest.importorskip("umap", reason="UMAP needs umap-learn (pip install 'attnviz[qk]')")
    cap = attnviz.capture(real_model, cat)
    rates = [nearest_key_hit_rate(qkmap.qk_map(cap, layer, 0, method="umap")) for layer in range(cap.num_layers)]
    chance = 5 / cap.num_tokens
    assert np.mean(rates) >= 8 * chance, rates
    assert sum(rate > chance for rate in rates) >= 10, rates  # not one lucky head: most layers beat chance (11 did)
    pca = [nearest_key_hit_rate(qkmap.qk_map(cap, layer, 0)) for layer in range(cap.num_layers)]
    assert np.mean(rates) > np.mean(pca), (rates, pca)  # what UMAP is offered for: local neighbourhoods


def test_patch_search_by_hand():
    model = tiny_vit()
    torch.manual_seed(3)
    caps = [attnviz.capture_tensor(model, torch.randn(1, 3, 32, 32)) for _ in range(4)]
    found = qkmap.patch_search(caps, 1, 3, photo=2, token=6, count=5)
    q = Q(caps[2])[1, 3, 6].double()
    every = [(float(K(caps[i])[1, 3, j].double() @ q) * SCALE(caps[0]), i, j)
             for i in (0, 1, 3) for j in range(1, 17)]  # other photos, patch keys only
    every.sort(key=lambda e: -e[0])
    assert [(m.photo, m.token) for m in found] == [(i, j) for _, i, j in every[:5]]
    assert [m.logit for m in found] == pytest.approx([e[0] for e in every[:5]], abs=1e-9)


def test_a_map_drawn_on_a_canvas_puts_the_photo_under_it():
    """Over SVG_POINTS points the Explore map is a canvas, which CSS cannot scale into a narrow column: the photo
    goes under the map (a 1024 px laptop's 564 px column held the side-by-side 810 px chart only in part); up to
    it, SVG, side by side."""
    from attnviz_app.views.qkmap import SVG_POINTS, scatter

    torch.manual_seed(0)
    network = timm.models.vision_transformer.VisionTransformer(  # 40 × 40 patches: 2 × 1601 points
        img_size=160, patch_size=4, embed_dim=32, depth=1, num_heads=2, num_classes=0)
    model = attnviz.wrap(network, "tiny", "random init", 160)
    picture = Image.new("RGB", (160, 160), (120, 80, 40))
    many = qkmap.qk_map(attnviz.capture(model, picture), 0, 0)
    few = qkmap.qk_map(attnviz.capture(tiny_vit(), picture), 0, 0)
    assert len(few.xy) <= SVG_POINTS < len(many.xy)
    for qk, layout, renderer in ((many, "vconcat", "canvas"), (few, "hconcat", "svg")):
        spec = scatter(qk, qk.row.astype(float), picture, 0, "row", narrow=False).to_dict()
        assert layout in spec and spec["usermeta"]["embedOptions"]["renderer"] == renderer


@pytest.mark.parametrize("name, size, layer, said", [
    ("cait_xxs24_224", 64, -1, "has only its class token as a query (class attention: 1 of its 17 tokens asks)"),
    ("pvt_v2_b0", None, 0, "attends over keys on a 2 × 2 grid while its queries lie on a 16 × 16 grid"),
])
def test_a_layer_that_is_not_one_set_of_points_is_described_as_it_is(name, size, layer, said):
    """CaiT's class-attention layer was said to attend "over keys pooled onto another grid": its keys are every
    token; only the class token asks. The library's sentence and the page's words come from one qkmap.obstacle."""
    import timm

    from attnviz import i18n

    torch.manual_seed(0)
    network = timm.create_model(name, pretrained=False, num_classes=3, **({"img_size": size} if size else {})).eval()
    size = size or 64  # PVT v2 takes any size
    model = attnviz.wrap(network, name, "random init", size)
    cap = attnviz.capture_tensor(model, torch.randn(1, 3, size, size))
    layer = layer % cap.num_layers
    key, values = qkmap.obstacle(cap, layer)
    assert i18n.text("en", f"qkmap.how_{key}", **values) == said
    with pytest.raises(attnviz.LayoutError, match=f"^layer {layer + 1} {re.escape(said)}, so its queries and keys"):
        qkmap.qk_map(cap, layer, 0)
