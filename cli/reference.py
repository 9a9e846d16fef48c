"""The configuration and command-line references of the documentation, generated from the
config model and the Typer app so that they cannot drift from the code (docs/_hooks)."""

from __future__ import annotations

from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import typer
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from broker.config import Config, QueueConfig, ServiceConfig


def _type(annotation: Any) -> str:
    """A key's type in words: text, integer, duration, one of `a`, `b`, ..."""
    args = [a for a in get_args(annotation) if a is not type(None)]
    origin = get_origin(annotation)
    if origin is Literal:
        return "one of " + ", ".join(f'`"{a}"`' for a in get_args(annotation))
    if origin is Annotated:
        return _type(args[0])
    if origin in (Union, UnionType):
        return " or ".join(_type(a) for a in args)
    if origin is dict:
        return "table"
    if origin is tuple:
        return "list of tables"
    names = {str: "text", int: "integer", bool: "true or false", float: "number"}
    if annotation in names:
        return names[annotation]
    return {"Duration": "duration (e.g. `\"30s\"`)", "ByteSize": "size (e.g. `\"64MiB\"`)"
            }.get(getattr(annotation, "__name__", ""), str(annotation))


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        made = field.default_factory()  # type: ignore[call-arg]
        return "(host name)" if isinstance(made, str) else f"`{made!r}`" if made else "empty"
    value = field.default
    if value is PydanticUndefined:
        return "required"
    if value is None:
        return "none"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, str):
        return f'`"{value}"`'
    if type(value).__name__ == "ByteSize":
        return f"`{value.human_readable()}`"
    return f'`"{value}"`' if type(value).__name__ == "Duration" else f"`{value}`"


def _rows(model: type[BaseModel]) -> list[str]:
    rows = ["| key | type | default | what it does |", "|---|---|---|---|"]
    for name, field in model.model_fields.items():
        key = field.alias or name
        about = " ".join((field.description or "").split()).replace("|", "\\|")
        rows.append(f"| `{key}` | {_type(field.annotation)} | {_default(field)} | "
                    f"{about} |")
    return rows


def config_reference() -> str:
    """Markdown: every key of `[service]`, `[auth]` and `[[queue]]`, with its type, default
    and description (the docstring under the field in broker/config.py)."""
    tables = Config.model_fields
    return "\n".join([
        "## `[service]`", "", tables["service"].description or "", "", *_rows(ServiceConfig),
        "", "## `[auth]`", "", " ".join((tables["auth"].description or "").split()), "",
        "## `[[queue]]`", "", tables["queue"].description or "", "", *_rows(QueueConfig), ""])


def _option_rows(command: Any) -> list[str]:
    rows = []
    for param in command.params:
        if param.param_type_name == "argument":
            rows.append(f"| `{param.name.upper()}` | {_help(param)} |")
        elif param.param_type_name == "option" and not param.hidden:
            names = ", ".join(f"`{o}`" for o in (*param.opts, *param.secondary_opts))
            extra = ["required"] if param.required else []
            if param.envvar:
                extra.append(f"env `{param.envvar}`")
            default = _option_default(param)
            if default is not None:
                extra.append(f"default `{default}`")
            tail = f" ({'; '.join(extra)})" if extra else ""
            rows.append(f"| {names} | {_help(param)}{tail} |")
    if not rows:
        return []
    return ["| argument or option | meaning |", "|---|---|", *rows]


def _option_default(param: Any) -> str | None:
    """An option's default as the docs say it: a pair of flags names the one that is on; a
    single flag is off and an option without a value is unset unless given: nothing said."""
    value = param.default
    if param.is_flag:
        if param.secondary_opts and isinstance(value, bool):
            return (param.opts if value else param.secondary_opts)[0]  # type: ignore[no-any-return]
        return None
    if value is None or value == () or param.required:
        return None
    return str(value)


def _help(param: Any) -> str:
    return _text(" ".join((getattr(param, "help", None) or "").split())).replace("|", "\\|")


def _text(help_text: str) -> str:
    """Help text as Markdown: brackets are the CLI's optional parts, not links."""
    return help_text.replace("[", "\\[").replace("]", "\\]")


def _commands(group: Any, prefix: str) -> list[str]:
    """(typer carries its own copy of click: its objects are read by what they have)"""
    out = []
    context = group.context_class(group)
    for name in group.list_commands(context):
        command = group.get_command(context, name)
        if command is None or command.hidden:
            continue
        full = f"{prefix} {name}"
        if hasattr(command, "list_commands"):
            out += _commands(command, full)
            continue
        usage = " ".join(command.collect_usage_pieces(command.context_class(command)))
        out += [f"## `{full}`", "", f"```\n{full} {usage}\n```", "",
                _text((command.help or "").strip()), "", *_option_rows(command), ""]
    return out


def cli_reference() -> str:
    """Markdown: every `kq` command with its usage, help and options (from the Typer app)."""
    from cli.main import app

    group = typer.main.get_command(app)
    return "\n".join(_commands(group, "kq"))
