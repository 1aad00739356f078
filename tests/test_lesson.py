"""The lesson's numbers: the issue's worked example to the shown precision, and checks on real captures."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import attnviz
from attnviz import lesson
from conftest import Overlap, tiny_vit, Q, K

KEYS = [[1, 0], [0, 1], [1, 1]]


def test_worked_example_matches_the_issue():
    ex = lesson.worked_example([1, 0], KEYS)  # values default to the keys
    assert ex.d_k == 2
    np.testing.assert_array_equal(ex.scores, [1, 0, 1])
    np.testing.assert_array_equal(np.round(ex.scaled, 3), [0.707, 0, 0.707])
    np.testing.assert_array_equal(np.round(ex.exps, 2), [2.03, 1.00, 2.03])
    assert round(ex.exp_sum, 2) == 5.06
    np.testing.assert_array_equal(np.round(ex.weights, 2), [0.40, 0.20, 0.40])
    np.testing.assert_array_equal(np.round(ex.output, 2), [0.80, 0.60])
    # Independent of rounding: weights = exps / Σ, output = Σ w_j v_j.
    np.testing.assert_allclose(ex.weights, ex.exps / ex.exp_sum, rtol=1e-15)
    np.testing.assert_allclose(ex.output, 0.40111209 * np.array([1, 0]) + 0.19777581 * np.array([0, 1])
                               + 0.40111209 * np.array([1, 1]), atol=1e-8)


def test_worked_example_with_other_values_and_dimension():
    ex = lesson.worked_example([2, 0, 0, 0], [[1, 0, 0, 0], [0, 0, 0, 0]], values=[[10.0], [20.0]])
    # scores 2, 0 → scaled by √4: 1, 0 → weights e/(e+1), 1/(e+1)
    np.testing.assert_allclose(ex.scaled, [1, 0])
    e = math.e
    np.testing.assert_allclose(ex.weights, [e / (e + 1), 1 / (e + 1)])
    np.testing.assert_allclose(ex.output, [10 * e / (e + 1) + 20 / (e + 1)])
    with pytest.raises(ValueError):
        lesson.worked_example([1, 0, 0], KEYS)


def test_softmax_of_small_and_large_scores():
    np.testing.assert_array_equal(np.round(lesson.softmax([2, 1, 0]), 2), [0.67, 0.24, 0.09])
    large = lesson.softmax([20, 10, 0])
    assert round(large[0], 5) == 0.99995
    assert round(large[1], 6) == 0.000045
    assert round(large[2], 9) == 0.000000002
    # Dividing [20, 10, 0] by 10 gives back the soft case; huge scores do not overflow.
    np.testing.assert_allclose(lesson.softmax([20, 10, 0], scale=0.1), lesson.softmax([2, 1, 0]))
    np.testing.assert_allclose(lesson.softmax([1000, 0]), [1, 0])


@pytest.mark.parametrize("d_k", [1, 16, 64, 512])
def test_dot_product_variance_grows_with_d_k(d_k):
    n = 4000
    sample = lesson.dot_products(d_k, samples=n, seed=0)
    # q·k is a sum of d_k products with E[x²] = 1, E[x⁴] = 9: Var(q·k) = d_k and the sample variance has
    # standard error √((2 d_k² + 6 d_k) / n). Allow 5 standard errors.
    se = math.sqrt((2 * d_k**2 + 6 * d_k) / n)
    assert abs(sample.dots_var - d_k) < 5 * se
    assert abs(sample.scaled_var - 1) < 5 * se / d_k
    np.testing.assert_allclose(sample.scaled, sample.dots / math.sqrt(d_k))
    # Same seed, same numbers (the page shows the same histogram to every student).
    np.testing.assert_array_equal(lesson.dot_products(d_k, samples=n, seed=0).dots, sample.dots)


def test_dot_product_typical_size_for_d_k_64():
    sample = lesson.dot_products(64, samples=4000, seed=1)
    assert 7.5 < math.sqrt(sample.dots_var) < 8.5


def test_cost_table_for_the_default_model():
    rows = lesson.cost_table()
    assert [r.size for r in rows] == [196, 224, 448, 518]
    assert [r.grid for r in rows] == [14, 16, 32, 37]
    assert [r.tokens for r in rows] == [197, 257, 1025, 1370]
    assert [r.pairs for r in rows] == [38_809, 66_049, 1_050_625, 1_876_900]
    assert [r.map_bytes for r in rows] == [11_176_992, 19_022_112, 302_580_000, 540_547_200]  # 540 MB at 518 px
    assert [r.qk_bytes for r in rows] == [2 * 72 * n * 64 * 4 for n in (197, 257, 1025, 1370)]
    with pytest.raises(ValueError):
        lesson.cost_table([200])


def test_shapes_of_the_real_model(real_model):
    s = lesson.shapes(real_model)
    assert (s.tokens, s.embed_dim, s.heads, s.head_dim, s.layers) == (197, 384, 6, 64, 12)
    assert s.qkv_weight == (1152, 384) and s.grid == (14, 14) and s.prefix_tokens == 1 and s.patch == 14


@pytest.fixture(scope="module")
def cat_capture(real_model, cat):
    return attnviz.capture(real_model, cat)


@pytest.mark.parametrize("layer, head, query, cell", [(11, 0, 0, (6, 7)), (0, 5, 0, (0, 0)), (5, 3, None, (13, 2))])
def test_pair_weight_equals_the_heatmap_cell(cat_capture, layer, head, query, cell):
    cap = cat_capture
    key = lesson.token_index(cap, *cell)
    query = lesson.token_index(cap, 3, 4) if query is None else query
    pair = lesson.pair_score(cap, layer, head, query, key)
    drawn = cap.weights(layer, head)[query, key]
    assert pair.weight == pytest.approx(float(drawn), rel=2e-5, abs=1e-9)
    # And the map the page draws holds the same value at (row, col).
    assert pair.weight == pytest.approx(float(cap.query_map(layer, head, query)[cell]), rel=2e-5, abs=1e-9)
    q = Q(cap)[layer, head, query].double()
    k = K(cap)[layer, head, key].double()
    assert pair.dot == pytest.approx(float(q @ k), rel=1e-12)
    assert pair.scaled == pytest.approx(pair.dot / 8.0, rel=1e-12)  # √64
    assert pair.weight == pytest.approx(pair.exp / pair.exp_sum, rel=1e-9)


def test_token_index_counts_prefix_tokens():
    model = tiny_vit(reg_tokens=2)
    from PIL import Image

    cap = attnviz.capture(model, Image.new("RGB", (32, 32), (120, 30, 200)))
    assert lesson.token_index(cap, 0, 0) == 3
    assert lesson.token_index(cap, 1, 2) == 3 + 4 + 2
    with pytest.raises(IndexError):
        lesson.token_index(cap, 4, 0)


def test_remove_patches_replaces_exactly_the_listed_patches():
    x = torch.arange(2 * 3 * 8 * 8, dtype=torch.float32).view(2, 3, 8, 8)[:1]  # (1, 3, 8, 8), grid 2 × 2 of 4 px
    filled = torch.full_like(x, -1.0)
    out = lesson.remove_patches(x, [1, 2], (2, 2), 4, filled)
    assert (out[..., :4, 4:] == -1).all() and (out[..., 4:, :4] == -1).all()  # patches 1 (top right), 2 (bottom left)
    torch.testing.assert_close(out[..., :4, :4], x[..., :4, :4])
    torch.testing.assert_close(out[..., 4:, 4:], x[..., 4:, 4:])
    mean = lesson.fill_image(x, "mean", 4)
    torch.testing.assert_close(mean[0, :, 0, 0], x[0].mean(dim=(1, 2)))
    blurred = lesson.fill_image(x, "blur", 4)
    assert blurred.shape == x.shape and not torch.equal(blurred, x)


def test_perturbation_on_a_classifier_follows_class_probability():
    model = tiny_vit(num_classes=10)
    from PIL import Image

    rng = np.random.default_rng(0)
    picture = Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8))
    cap = attnviz.capture(model, picture)
    result = lesson.perturbation(model, cap, 1, "mean", fill="mean", steps=4, max_fraction=1.0, repeats=2, seed=3)
    assert result.metric == "probability"
    assert result.removed.tolist() == [0, 4, 8, 12, 16]
    assert result.attended[0] == 0 and (result.random[:, 0] == 0).all()
    np.testing.assert_array_equal(result.order, np.argsort(-cap.cls_map(1, "mean").ravel(), kind="stable"))
    # Independent recomputation of the last attended step: every patch filled with the mean colour.
    with torch.inference_mode():
        base = model.network(cap.input).softmax(-1)[0]
        target = int(base.argmax())
        flat = cap.input.mean(dim=(2, 3), keepdim=True).expand_as(cap.input)
        p_all = model.network(flat).softmax(-1)[0, target]
    assert result.target == target
    assert result.base_probability == pytest.approx(float(base[target]), abs=1e-6)
    assert result.attended[-1] == pytest.approx(float(base[target] - p_all), abs=1e-5)
    # With everything removed, the order does not matter.
    np.testing.assert_allclose(result.random[:, -1], result.attended[-1], atol=1e-5)


def test_the_removal_tests_batches_run_one_per_core_in_input_order(monkeypatch):
    """Equal shares, two at once, one PyTorch thread each; the outputs in the inputs' order."""
    from attnviz import interventions

    monkeypatch.setattr(interventions, "core_count", lambda: 2)
    model = tiny_vit(num_classes=10)
    xs = torch.randn(25, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    probe = Overlap(model.adapter.forward_batch, hold_s=0.05)
    monkeypatch.setattr(model.adapter, "forward_batch", probe)
    out = lesson._outputs(model, xs)
    assert sorted(rows for _, _, rows in probe.calls) == [6, 6, 6, 7]
    assert {threads for _, threads, _ in probe.calls} == {1} and probe.most == 2
    with torch.inference_mode():
        np.testing.assert_allclose(out.numpy(), model.network(xs).numpy(), atol=1e-5)


def test_perturbation_on_the_default_model_uses_cosine_distance(real_model, cat_capture):
    result = lesson.perturbation(real_model, cat_capture, 11, 0, fill="blur", steps=2, max_fraction=0.5, repeats=1)
    assert result.metric == "cosine" and result.target is None
    assert result.removed.tolist() == [0, 49, 98]
    # Recompute step 1 of the attended order by hand.
    x = lesson.remove_patches(cat_capture.input, result.order[:49], (14, 14), 14,
                              lesson.fill_image(cat_capture.input, "blur", 14))
    with torch.inference_mode():
        f0, f1 = real_model.network(cat_capture.input)[0], real_model.network(x)[0]
    expected = 1 - torch.nn.functional.cosine_similarity(f0, f1, dim=0)
    assert result.attended[1] == pytest.approx(float(expected), abs=1e-4)
    assert 0 < result.attended[2] <= 2


def test_to_picture_inverts_the_normalisation(real_model, cat):
    view = real_model.view(cat)
    back = lesson.to_picture(real_model, real_model.to_input(view))
    assert np.abs(np.asarray(back, dtype=int) - np.asarray(view, dtype=int)).max() <= 1


def made(attended, random=((0, 0.1, 0.2), (0, 0.1, 0.4))) -> lesson.Perturbation:
    """A removal test of 4 patches in 2 steps (0, 25 % and 50 % removed) with hand-made curves; the random orders'
    mean is 0, 0.1, 0.3, its area 0.0625 (theirs 0.05 and 0.075: spread ±0.0125), its end spread ±0.1."""
    return lesson.Perturbation(
        removed=np.array([0, 1, 2]), num_patches=4, attended=np.array(attended, dtype=float),
        random=np.array(random, dtype=float), metric="cosine", target=None, base_probability=None,
        order=np.arange(4), random_orders=np.zeros((2, 4), dtype=int),
    )


def test_the_race_measures_the_areas_and_ends_of_the_curves_drawn():
    race = made([0, 0.5, 0.9]).race
    np.testing.assert_allclose(made([0, 0.5, 0.9]).fractions, [0, 0.25, 0.5])
    # Trapezoids of width 0.25: red (0 + 0.5) / 2 + (0.5 + 0.9) / 2 = 0.95 → 0.2375; grey (0 + 0.1) / 2 + (0.1 + 0.3) / 2.
    assert race.attended_area == pytest.approx(0.2375) and race.random_area == pytest.approx(0.0625)
    assert race.area_spread == pytest.approx(0.0125) and race.end_spread == pytest.approx(0.1)
    assert (race.attended_end, race.random_end, race.percent) == pytest.approx((0.9, 0.3, 50.0))
    assert race.level_at == () and race.story == "ahead"


@pytest.mark.parametrize("attended, story, level_at", [
    ([0, 0.5, 0.9], "ahead", ()),  # above the grey curve at every step
    ([0, 0.05, 0.9], "mostly_ahead", (25.0,)),  # more on area and at the end, below it at 25 %
    ([0, 0.6, 0.35], "caught_up", ()),  # more on area; ends 0.35 vs 0.3, within the end spread ±0.1
    ([0, 0.6, 0.15], "overtaken", (50.0,)),  # more on area; ends 0.15 vs 0.3: the issue's chart
    ([0, 0.1, 0.28], "same", (25.0, 50.0)),  # area 0.06 vs 0.0625, within ±0.0125; level at 25 %
    ([0, 0.0, 0.0], "behind", (25.0, 50.0)),
])
def test_the_race_tells_which_curve_is_ahead_and_whether_random_removal_catches_up(attended, story, level_at):
    race = made(attended).race
    assert race.story == story and race.level_at == level_at
    # the area is the chart's own: the trapezoid rule over the points drawn
    assert race.attended_area == pytest.approx(float(np.trapezoid(attended, [0, 0.25, 0.5])))


@pytest.mark.parametrize("lang", ["en", "zh-TW"])
def test_the_step_7_sentence_says_random_removal_overtook_with_the_charts_numbers(lang):
    from attnviz import i18n

    def race_sentence(race):
        return lesson.race_sentence(race, lang)

    race = made([0, 0.6, 0.15]).race  # red 0 → 0.6 → 0.15, grey 0 → 0.1 → 0.3: ahead on area, behind at 50 %
    said = race_sentence(race)
    assert said == i18n.text(lang, "lesson.explain.overtaken", attended_area=0.16875, random_area=0.0625,
                             area_spread=0.0125, attended_end=0.15, random_end=0.3, end_spread=0.1, percent=50,
                             level="50%")
    for number in ("0.1688", "0.0625", "0.1500", "0.3000", "50%"):
        assert number in said
    overtakes = {"en": "But random removal overtakes it", "zh-TW": "但隨機移除超越了它"}[lang]
    assert overtakes in said and overtakes not in race_sentence(made([0, 0.5, 0.9]).race)
    mostly = race_sentence(made([0, 0.05, 0.9]).race)  # the steps where the grey curve is level or above, listed
    assert ("at 25%" if lang == "en" else "在 25% 時") in mostly
