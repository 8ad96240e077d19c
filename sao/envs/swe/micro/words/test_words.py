from words import count_vowels, initials, is_palindrome, longest, shout


def test_shout():
    assert shout("hi") == "HI!"


def test_initials():
    assert initials("ada love lace") == "all"


def test_count_vowels():
    assert count_vowels("Banana") == 3


def test_palindrome():
    assert is_palindrome("level") and not is_palindrome("levels")


def test_longest():
    assert longest(["a", "abc", "ab", "xyz"]) == "abc"
