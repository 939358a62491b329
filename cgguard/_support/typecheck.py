"""A value parsed from JSON checked against a TypedDict: what keeps it from being one, named by
its path. For reports read from elsewhere (cgguard._data.schema's types)."""

from __future__ import annotations

import math
import typing
from typing import TYPE_CHECKING, Annotated

if TYPE_CHECKING:
    from collections.abc import Callable


class AtLeast:
    """The least value of an ``Annotated[int, AtLeast(n)]`` (or of ``float | int``), which
    ``problem()`` checks."""

    __slots__ = ("least",)

    def __init__(self, least: int) -> None:
        self.least = least


# A failure: the path to the value at fault, innermost part first (built only on the way out
# of a failed check, so that a good value costs no text), and what was wrong with it.
_Failure = tuple[list[str], str]

_checks: dict[object, Callable[[object], _Failure | None]] = {}
_MISSING = object()


def problem(value: object, schema: type) -> str | None:
    """What keeps ``value``, as ``json.loads`` returns it, from being a ``schema``, or None.

    ``schema`` is a TypedDict built of these parts: ``str``,
    ``int`` (a bool is not one), ``float``, ``None``, ``object`` (anything), unions,
    ``list[...]``, ``dict[str, ...]``, ``Annotated[int, AtLeast(n)]`` (or of ``float | int``) and
    nested TypedDicts). Required keys
    must be there and optional ones may be missing; keys the schema does not name are let
    through, so that reports of a later cgguard stay readable. The first fault is named by
    its path: ``violations[0].first.stack[1]: no "code"``.
    """
    failure = _check(schema)(value)
    if failure is None:
        return None
    parts, what = failure
    path = "".join(reversed(parts)).removeprefix(".")
    return f"{path}: {what}" if path else what


def _check(schema: object) -> Callable[[object], _Failure | None]:
    """The check of ``schema``, made once per type."""
    check = _checks.get(schema)
    if check is None:
        check = _checks[schema] = _made(schema)
    return check


def _kind(value: object) -> str:
    """What a JSON value is, in the words of a message."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return {int: "a whole number", float: "a number", str: "text", list: "a list"}.get(
        type(value), "an object" if isinstance(value, dict) else type(value).__name__
    )


def _wrong(expected: str, value: object) -> _Failure:
    return [], f"{expected} expected, found {_kind(value)}"


def _words(schema: object) -> str:
    """What ``schema`` accepts, in the words of a message."""
    origin = typing.get_origin(schema)
    if origin is Annotated:
        base, *extras = typing.get_args(schema)
        least = [extra.least for extra in extras if isinstance(extra, AtLeast)]
        return f"{_words(base)} of {least[0]} or more" if least else _words(base)
    if origin in (typing.Union, _UnionType):
        members = typing.get_args(schema)
        # A whole number is a number: "float | int" reads "a number".
        words = [_words(m) for m in members if not (m is int and float in members)]
        return ", ".join(words[:-1]) + " or " + words[-1] if len(words) > 1 else words[0]
    if origin is list:
        return "a list"
    if origin is dict or typing.is_typeddict(schema):
        return "an object"
    return {
        str: "text",
        int: "a whole number",
        float: "a number",
        type(None): "null",
        bool: "true or false",
    }[
        schema  # type: ignore[index]
    ]


_UnionType = type(int | str)
_UNIONS = (typing.Union, _UnionType)


def _made(schema: object) -> Callable[[object], _Failure | None]:  # noqa: PLR0911 - one per kind
    """A check for ``schema``; TypeError for a kind of type it does not know."""
    if schema is object:
        return lambda value: None
    if schema in (str, bool):
        exact = schema
        return lambda value: None if type(value) is exact else _wrong(_words(exact), value)
    if schema is float:
        return lambda value: None if type(value) is float else _wrong("a number", value)
    if schema is int:
        # type(), not isinstance(): a bool is an int to Python, not to the schema.
        return lambda value: None if type(value) is int else _wrong("a whole number", value)
    if schema is type(None) or schema is None:
        return lambda value: None if value is None else _wrong("null", value)
    if isinstance(schema, type) and typing.is_typeddict(schema):
        return _typed_dict(schema)
    origin, args = typing.get_origin(schema), typing.get_args(schema)
    if origin is Annotated:
        return _annotated(schema, args)
    if origin in (typing.Union, _UnionType):
        return _union(schema, args)
    if origin is list:
        return _list(_check(args[0]))
    if origin is dict and args[0] is str:
        return _dict(_check(args[1]))
    raise TypeError(f"cgguard._data.schema cannot check values of {schema!r}")


def _annotated(schema: object, args: tuple[object, ...]) -> Callable[[object], _Failure | None]:
    base = _check(args[0])
    least = next((extra.least for extra in args[1:] if isinstance(extra, AtLeast)), None)
    if least is None:
        return base
    words = _words(schema)

    def check(value: object) -> _Failure | None:
        if base(value) is not None:
            return _wrong(words, value)
        if value < least:  # type: ignore[operator]
            return [], f"{words} expected, found {value}"
        return None

    return check


def _union(schema: object, args: tuple[object, ...]) -> Callable[[object], _Failure | None]:
    members = [(_json_type(member), _check(member)) for member in args]
    if len({kind for kind, _ in members}) < len(members):
        # Told apart by their JSON kind alone: two lists, say, could not be.
        raise TypeError(f"cgguard._data.schema cannot check {schema!r}: two members of one kind")
    words = _words(schema)

    def check(value: object) -> _Failure | None:
        for kind, member in members:
            if type(value) is kind:
                # The member of the value's own kind says what is wrong inside it, and where.
                return member(value)
        return _wrong(words, value)

    return check


def _json_type(schema: object) -> type:
    """The Python type ``json.loads`` gives the values of ``schema``."""
    if typing.get_origin(schema) is Annotated:
        return _json_type(typing.get_args(schema)[0])
    if typing.is_typeddict(schema) or typing.get_origin(schema) is dict:
        return dict
    if typing.get_origin(schema) is list:
        return list
    if isinstance(schema, type) and schema in (str, int, float, bool, type(None)):
        return schema
    # A union inside a union is flattened by typing; object has no place in one.
    raise TypeError(f"cgguard._data.schema cannot check values of {schema!r} in a union")


def _list(item: Callable[[object], _Failure | None]) -> Callable[[object], _Failure | None]:
    def check(value: object) -> _Failure | None:
        if type(value) is not list:
            return _wrong("a list", value)
        for i, each in enumerate(value):
            failure = item(each)
            if failure is not None:
                failure[0].append(f"[{i}]")
                return failure
        return None

    return check


def _dict(item: Callable[[object], _Failure | None]) -> Callable[[object], _Failure | None]:
    def check(value: object) -> _Failure | None:
        if type(value) is not dict:
            return _wrong("an object", value)
        for key, each in value.items():
            failure = item(each)
            if failure is not None:
                failure[0].append(f"[{_key(key)}]")
                return failure
        return None

    return check


def _key(key: object) -> str:
    text = repr(key)
    return text if len(text) <= 60 else f"{text[:57]}..."


def _typed_dict(schema: type) -> Callable[[object], _Failure | None]:
    hints = typing.get_type_hints(schema, include_extras=True)
    required = frozenset(getattr(schema, "__required_keys__", ()))
    # In the schema's order, each key's check made now: a type it cannot check fails here,
    # not on the first report that holds the key. A key of plain kinds (text, a number, null)
    # is checked here by its type alone, without a call: a report of a million sites has
    # tens of millions of them.
    keys = [(key, key in required, _plain(hint), _check(hint)) for key, hint in hints.items()]

    def check(value: object) -> _Failure | None:
        if type(value) is not dict:
            return _wrong("an object", value)
        get = value.get
        for key, needed, plain, each in keys:
            found = get(key, _MISSING)
            if found is _MISSING:
                if needed:
                    return [], f'no "{key}"'
                continue
            if plain is not None and type(found) in plain:
                continue
            failure = each(found)
            if failure is not None:
                failure[0].append(f".{key}")
                return failure
        return None

    return check


def _plain(schema: object) -> frozenset[type] | None:
    """The JSON types that are all there is to checking ``schema``, or None."""
    members = typing.get_args(schema) if typing.get_origin(schema) in _UNIONS else (schema,)
    if all(member in (str, int, float, bool, type(None)) for member in members):
        return frozenset(member for member in members if isinstance(member, type))
    return None


def non_finite(value: object) -> str | None:
    """Where ``value``, as ``json.loads`` returns it, holds NaN, Infinity or -Infinity, or None.

    JSON has none of them, but Python's json module reads them, and a number too large for a
    float as Infinity. Every key is looked into, those no schema names included; the first in
    the document's order is named by its path, found without recursion, so that any depth
    json.loads parsed is walked.
    """
    pending: list[tuple[object, str]] = [(value, "")]
    while pending:
        each, path = pending.pop()
        if type(each) is float and not math.isfinite(each):
            spelled = "NaN" if math.isnan(each) else "Infinity" if each > 0 else "-Infinity"
            what = f"a finite number expected, found {spelled}"
            return f"{path.removeprefix('.')}: {what}" if path else what
        if type(each) is dict:
            items = [(v, f"{path}{_part(k)}") for k, v in each.items()]
        elif type(each) is list:
            items = [(v, f"{path}[{i}]") for i, v in enumerate(each)]
        else:
            continue
        pending.extend(reversed(items))  # the first item comes off the stack first
    return None


def _part(key: object) -> str:
    """A key in a path as problem() writes one: ``.name``, or ``['any other']``."""
    return f".{key}" if isinstance(key, str) and key.isidentifier() else f"[{_key(key)}]"
