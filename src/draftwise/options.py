"""Typed component configs read from `KEY=VALUE` strings, once, at the edge.

A component's config is a frozen dataclass; each field may carry an external key (the
spelling the CLI's `--set` and the bench's method strings use), a help line and a parser
for types that are not plain scalars.  `parse_config` builds the dataclass from strings and
refuses an unknown key with the list of valid ones; `config_items` writes it back, so a
configuration reads the same in a report as on a command line.  The defaults stay where
they are defined: in the dataclass.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from typing import Any, Callable, Mapping, TypeVar

from draftwise.errors import InputError

C = TypeVar("C")
_TRUE, _FALSE = ("true", "1", "yes"), ("false", "0", "no")


def option(default: Any = dataclasses.MISSING, *, key: str | None = None, help: str = "",
           parse: Callable[[str], Any] | None = None, show: Callable[[Any], str] | None = None) -> Any:
    """A dataclass field with its external key, help text and (for non-scalar types) parser."""
    metadata = {"key": key, "help": help, "parse": parse, "show": show}
    return dataclasses.field(default=default, metadata=metadata)


def config_keys(cls: type) -> dict[str, dataclasses.Field[Any]]:
    """External key -> field, for every field of the config dataclass `cls`."""
    return {f.metadata.get("key") or f.name: f for f in dataclasses.fields(cls)}


def parse_config(cls: type[C], values: Mapping[str, str], owner: str) -> C:
    """`cls` with the given keys parsed from strings and every other field at its default."""
    keys = config_keys(cls)
    unknown = sorted(set(values) - set(keys))
    if unknown:
        raise InputError(f"{owner}: unknown key(s) {', '.join(unknown)}; valid keys: {', '.join(sorted(keys)) or 'none'}")
    hints = typing.get_type_hints(cls)
    kwargs = {keys[k].name: parse_value(keys[k], hints[keys[k].name], text, f"{owner}: {k}")
              for k, text in values.items()}
    try:
        return cls(**kwargs)
    except InputError:
        raise
    except (TypeError, ValueError) as exc:  # the config's own checks (__post_init__)
        raise InputError(f"{owner}: {exc}") from exc


def parse_value(field: dataclasses.Field[Any], hint: Any, text: str, where: str) -> Any:
    parse = field.metadata.get("parse")
    try:
        if parse is not None:
            return parse(text)
        return _parse_typed(hint, text.strip())
    except InputError:
        raise
    except (TypeError, ValueError) as exc:
        raise InputError(f"{where}={text!r} {exc}") from exc


def _parse_typed(hint: Any, text: str) -> Any:
    options = _optional_of(hint)
    if options is not None:
        return None if text.lower() in ("", "none") else _parse_typed(options, text)
    if hint is bool:
        word = text.lower()
        if word not in _TRUE + _FALSE:
            raise ValueError("not true/false")
        return word in _TRUE
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        valid = [m.value for m in hint]
        if text not in valid:
            raise ValueError(f"choose one of {', '.join(map(str, valid))}")
        return hint(text)
    if hint is int:
        try:
            return int(text)
        except ValueError:
            raise ValueError("is not an integer") from None
    if hint is float:
        try:
            return float(text)
        except ValueError:
            raise ValueError("is not a number") from None
    if hint is str:
        return text
    raise TypeError(f"no parser for a field of type {hint!r}; give the field a parse= function")


def _optional_of(hint: Any) -> Any:
    """X for `X | None` (or Optional[X]), else None."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(hint)) == 2:
            return args[0]
    return None


def config_items(config: Any) -> dict[str, str]:
    """External key -> value as text, for every field of `config`."""
    items = {}
    for key, f in config_keys(type(config)).items():
        value = getattr(config, f.name)
        show = f.metadata.get("show")
        items[key] = show(value) if show is not None else _show(value)
    return items


def _show(value: Any) -> str:
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return "none" if value is None else str(value)


def config_help(cls: type) -> list[tuple[str, str, str]]:
    """(key, default, help) for every field of `cls`: what `--set` accepts."""
    rows = []
    for key, f in config_keys(cls).items():
        default = f.default if f.default is not dataclasses.MISSING else "(required)"
        show = f.metadata.get("show")
        shown = show(default) if show is not None and default != "(required)" else _show(default)
        rows.append((key, shown, f.metadata.get("help", "")))
    return rows
