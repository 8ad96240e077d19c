def neighbors(x, y):
    return [(x - 1, y), (x + 1, y), (x, y - 1), (x, y + 1)]


def inside(x, y, w, h):
    return 0 <= x < w and 0 <= y < h


def manhattan(a, b):
    return abs(a[0] - b[0]) + abs(a[1] - b[1])


def area(w, h):
    return w * h


def row_sums(rows):
    return [sum(r) for r in rows]
