from grid import area, inside, manhattan, neighbors, row_sums


def test_neighbors():
    assert sorted(neighbors(1, 1)) == [(0, 1), (1, 0), (1, 2), (2, 1)]


def test_inside():
    assert inside(0, 0, 3, 3) and inside(2, 2, 3, 3)


def test_outside():
    assert not inside(3, 0, 3, 3) and not inside(0, -1, 3, 3)


def test_manhattan():
    assert manhattan((1, 2), (4, 0)) == 5


def test_area():
    assert area(3, 4) == 12


def test_row_sums():
    assert row_sums([[1, 2], [3, 4, 5]]) == [3, 12]
