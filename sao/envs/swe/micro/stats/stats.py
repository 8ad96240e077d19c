def mean(xs):
    return sum(xs) / len(xs)


def span(xs):
    return max(xs) - min(xs)


def count_above(xs, t):
    n = 0
    for x in xs:
        if x > t:
            n += 1
    return n


def median(xs):
    s = sorted(xs)
    mid = len(s) // 2
    if len(s) % 2 == 1:
        return s[mid]
    return (s[mid - 1] + s[mid]) / 2


def total(xs):
    t = 0
    for x in xs:
        t += x
    return t
