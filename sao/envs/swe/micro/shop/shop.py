def price_with_tax(price, rate):
    return price + price * rate


def discount(price, percent):
    return price - price * percent / 100


def free_shipping(total):
    return total >= 50


def cart_total(items):
    t = 0
    for price, qty in items:
        t += price * qty
    return t


def can_afford(budget, total):
    return budget >= total
