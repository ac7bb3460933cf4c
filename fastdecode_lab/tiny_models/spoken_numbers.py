"""English numbers spelled out as they are spoken: cardinals, ordinals, years, clock times, prices, digit strings."""

from __future__ import annotations

_ONES_TEXT = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen "
    "eighteen nineteen"
)
_ONES = tuple(_ONES_TEXT.split())
_TENS_TEXT = "_ _ twenty thirty forty fifty sixty seventy eighty ninety"
_TENS = tuple(_TENS_TEXT.split())
_ORDINAL_WORDS = {
    "one": "first",
    "two": "second",
    "three": "third",
    "five": "fifth",
    "eight": "eighth",
    "nine": "ninth",
    "twelve": "twelfth",
}
MAX_CARDINAL = 999_999_999


def cardinal(n: int) -> str:
    """``n`` in words, British style (``"one hundred and five"``), for ``0 <= n <= 999_999_999``."""
    if not 0 <= n <= MAX_CARDINAL:
        raise ValueError(f"cardinal() spells 0..{MAX_CARDINAL}, got {n}")
    if n < 20:
        return _ONES[n]
    if n < 100:
        tens, ones = divmod(n, 10)
        return _TENS[tens] + ("" if ones == 0 else " " + _ONES[ones])
    if n < 1000:
        hundreds, rest = divmod(n, 100)
        return _ONES[hundreds] + " hundred" + ("" if rest == 0 else " and " + cardinal(rest))
    for size, name in ((1_000_000, "million"), (1000, "thousand")):
        if n >= size:
            high, rest = divmod(n, size)
            tail = "" if rest == 0 else (" and " if rest < 100 else " ") + cardinal(rest)
            return cardinal(high) + " " + name + tail
    raise AssertionError("unreachable")


def ordinal(n: int) -> str:
    """``n``-th in words (``"twenty first"``), for ``1 <= n <= 999_999_999``."""
    if n < 1:
        raise ValueError(f"ordinal() spells 1..{MAX_CARDINAL}, got {n}")
    words = cardinal(n).split()
    last = words[-1]
    if last in _ORDINAL_WORDS:
        words[-1] = _ORDINAL_WORDS[last]
    elif last.endswith("y"):
        words[-1] = last[:-1] + "ieth"
    else:
        words[-1] = last + "th"
    return " ".join(words)


def year(y: int) -> str:
    """A year as it is read: ``1984`` -> ``"nineteen eighty four"``, ``2005`` -> ``"two thousand and five"``."""
    if not 1000 <= y <= 2099:
        raise ValueError(f"year() reads 1000..2099, got {y}")
    high, low = divmod(y, 100)
    if 2000 <= y < 2010:
        return cardinal(y)
    if low == 0:
        return cardinal(high) + " hundred"
    if low < 10:
        return cardinal(high) + " oh " + cardinal(low)
    return cardinal(high) + " " + cardinal(low)


def clock_time(hour: int, minute: int, style: int = 0) -> str:
    """A clock time on a 12-hour clock (``hour`` 1..12, ``minute`` 0..59) in one of three spoken styles.

    ``style`` 0: ``"seven thirty"`` / ``"seven o'clock"``; 1: ``"half past seven"``, ``"quarter to eight"``,
    ``"ten past seven"``; 2: ``"seven oh five"`` style digits for minutes below ten, else as style 0.
    """
    if not (1 <= hour <= 12 and 0 <= minute <= 59):
        raise ValueError(f"clock_time() takes hour 1..12 and minute 0..59, got {hour}:{minute}")
    if minute == 0:
        return cardinal(hour) + " o'clock"
    if style == 1 and minute % 5 == 0:
        if minute == 30:
            return "half past " + cardinal(hour)
        if minute == 15:
            return "quarter past " + cardinal(hour)
        if minute == 45:
            return "quarter to " + cardinal(hour % 12 + 1)
        if minute < 30:
            return cardinal(minute) + " past " + cardinal(hour)
        return cardinal(60 - minute) + " to " + cardinal(hour % 12 + 1)
    if minute < 10:
        return cardinal(hour) + " oh " + cardinal(minute)
    return cardinal(hour) + " " + cardinal(minute)


def price(pounds_or_dollars: int, cents: int, currency: str = "dollars") -> str:
    """A price: ``(12, 50)`` -> ``"twelve dollars and fifty cents"``; ``currency`` ``dollars`` or ``pounds``."""
    unit, small = {"dollars": ("dollar", "cent"), "pounds": ("pound", "pence")}[currency]
    whole = cardinal(pounds_or_dollars) + " " + (unit if pounds_or_dollars == 1 else unit + "s")
    if cents == 0:
        return whole
    small_name = small if small == "pence" else (small if cents == 1 else small + "s")
    return whole + " and " + cardinal(cents) + " " + small_name


def digits(number: str) -> str:
    """A digit string read digit by digit, zero read as ``oh``: ``"5024"`` -> ``"five oh two four"``."""
    if not number.isdigit():
        raise ValueError(f"digits() reads a string of digits, got {number!r}")
    return " ".join("oh" if d == "0" else _ONES[int(d)] for d in number)
