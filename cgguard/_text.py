"""What counts as text in a value a caller hands cgguard: one test, for Config and exemptions.

Standard library only, and no ``typing``: exemptions are checked on the start-up path.
"""


def plain(value: object) -> "str | None":
    """``value`` as a plain str if it is a str (a subclass, a str-valued Enum), else None."""
    # type(), not isinstance(): an object's __class__ may claim str without it being one.
    if not issubclass(type(value), str):
        return None
    return str.__str__(value)  # the plain copy of a subclass's text
