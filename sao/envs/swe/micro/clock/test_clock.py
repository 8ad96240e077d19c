from clock import add_minutes, fmt, hours, is_morning, to_minutes


def test_to_minutes():
    assert to_minutes(2, 30) == 150


def test_hours():
    assert hours(135) == 2


def test_is_morning():
    assert is_morning(9) and not is_morning(12)


def test_add_minutes():
    assert add_minutes(23, 50, 20) == (0, 10)


def test_fmt():
    assert fmt(7, 5) == "07:05"
