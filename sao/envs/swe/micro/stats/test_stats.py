from stats import count_above, mean, median, span, total


def test_mean():
    assert mean([1, 2, 3, 6]) == 3


def test_span():
    assert span([4, 9, 1]) == 8


def test_count_above():
    assert count_above([1, 5, 5, 8], 5) == 1


def test_median_odd():
    assert median([3, 1, 2]) == 2


def test_median_even():
    assert median([4, 1, 3, 2]) == 2.5


def test_total():
    assert total([2, 3, 4]) == 9
