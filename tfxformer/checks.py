"""Checks of integer, number and named-choice settings, with one wording for their errors.

Every setting a user gives as a Python number goes through these, so that a bad value
always reads the same: "`beam_size` must be an integer >= 1, got 0."
"""

from __future__ import annotations

import numbers


def integer(value, name: str, minimum: int | None = None, maximum: int | None = None,
            allow_none: bool = False) -> int | None:
    """`value` as a Python int, checked to lie in [minimum, maximum] (None: unbounded).

    Raises:
        ValueError: `value` is not an integer (bools are not), or out of range; the
            message names the setting, the accepted range and the value given.
    """
    if value is None and allow_none:
        return None
    ok = (isinstance(value, numbers.Integral) or (isinstance(value, float)
                                                  and value.is_integer())) \
        and not isinstance(value, bool)
    if ok:
        ok = (minimum is None or value >= minimum) and (maximum is None or value <= maximum)
    if not ok:
        raise ValueError(f"`{name}` must be {_integer_range(minimum, maximum)}"
                         f"{' or None' if allow_none else ''}, got {value!r}.")
    return int(value)


def number(value, name: str, minimum: float | None = None, maximum: float | None = None
           ) -> float:
    """`value` as a Python float, checked to lie in [minimum, maximum] (None: unbounded).

    Raises:
        ValueError: `value` is not a real number (NaN is not), or out of range.
    """
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and value == value
    if ok:
        ok = (minimum is None or value >= minimum) and (maximum is None or value <= maximum)
    if not ok:
        bounds = _range(minimum, maximum)
        raise ValueError(f"`{name}` must be a number{' ' + bounds if bounds else ''}, "
                         f"got {value!r}.")
    return float(value)


def _range(minimum, maximum) -> str:
    if minimum is not None and maximum is not None:
        return f"in [{minimum}, {maximum}]"
    if minimum is not None:
        return f">= {minimum}"
    return "" if maximum is None else f"<= {maximum}"


def _integer_range(minimum, maximum) -> str:
    bounds = _range(minimum, maximum)
    return f"an integer {bounds}" if bounds else "an integer"


def choice(value, name: str, accepted: tuple):
    """`value`, checked to be one of the strings `accepted`.

    Raises:
        ValueError: naming the setting, the accepted values and the value given.
    """
    if not isinstance(value, str) or value not in accepted:
        raise ValueError(f"`{name}` must be one of {', '.join(map(repr, accepted))}, "
                         f"got {value!r}.")
    return value
