def shout(s):
    return s.upper() + "!"


def initials(name):
    return "".join(part[0] for part in name.split())


def count_vowels(s):
    n = 0
    for ch in s.lower():
        if ch in "aeiou":
            n += 1
    return n


def is_palindrome(s):
    return s == s[::-1]


def longest(words):
    best = ""
    for w in words:
        if len(w) > len(best):
            best = w
    return best
