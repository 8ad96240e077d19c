from calc import add, clamp, is_even, sign, sub


def test_add():
    assert add(2, 3) == 5


def test_sub():
    assert sub(7, 4) == 3


def test_clamp_low():
    assert clamp(-5, 0, 10) == 0


def test_clamp_high():
    assert clamp(50, 0, 10) == 10


def test_clamp_inside():
    assert clamp(4, 0, 10) == 4


def test_is_even():
    assert is_even(4) and not is_even(7)


def test_sign():
    assert sign(3) == 1 and sign(-2) == -1 and sign(0) == 0
