from shop import can_afford, cart_total, discount, free_shipping, price_with_tax


def test_price_with_tax():
    assert price_with_tax(100, 0.2) == 120


def test_discount():
    assert discount(80, 25) == 60


def test_free_shipping():
    assert free_shipping(50) and not free_shipping(49)


def test_cart_total():
    assert cart_total([(2, 3), (5, 1)]) == 11


def test_can_afford():
    assert can_afford(10, 10) and not can_afford(9, 10)
