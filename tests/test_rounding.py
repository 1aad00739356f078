"""The GPU walk's comparison (tests/rounding.py), run everywhere: the walk itself needs a GPU."""
from tests.rounding import same_but_rounding


def test_same_but_rounding_tells_words_and_numbers_apart():
    assert same_but_rounding("the deletion area is 0.61 for layer 12", "the deletion area is 0.62 for layer 12")
    assert not same_but_rounding("the deletion area is 0.61 for layer 12", "the deletion area is 0.63 for layer 12")
    assert not same_but_rounding("says little (|ρ| < 0.3)", "tend to matter less (|ρ| < 0.3)")
    assert same_but_rounding("difference 6.3e-10", "difference 2.1e-9")
    assert not same_but_rounding("38,809 pairs", "38,811 pairs")
    assert same_but_rounding("q · k 77.9863", "q · k 77.9864")
    assert same_but_rounding("4.530472755432129 | -0.61", "4.530471324920654 | -0.61")
    assert not same_but_rounding("4.530472755432129 | -0.61", "4.531472755432129 | -0.61")
