def to_minutes(h, m):
    return h * 60 + m


def hours(minutes):
    return minutes // 60


def is_morning(h):
    return h < 12


def add_minutes(h, m, extra):
    t = (h * 60 + m + extra) % (24 * 60)
    return t // 60, t % 60


def fmt(h, m):
    return "%02d:%02d" % (h, m)
