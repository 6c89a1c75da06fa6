"""MkDocs hook: the configuration and CLI reference pages, generated at build time.

A page that holds a marker gets it replaced by tables built from the code itself, so the reference
cannot drift from what `fleetrl` accepts:

    <!-- fleetrl:config-reference -->   every RunConfig field: name, type, default, help line
    <!-- fleetrl:cli-reference -->      every `fleetrl` subcommand and its arguments
    <!-- fleetrl:provenance A.json B.json -->   what made each raw result under benchmarks/results/:
                                        its command, commit, machine and date (a missing file fails the build)

mkdocs.yml names this file under `hooks:`; it imports fleetrl from the repository root.
"""

from __future__ import annotations

import argparse
import dataclasses
import html
import pathlib
import re
import sys
import typing
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[2]
CONFIG_MARKER = "<!-- fleetrl:config-reference -->"
CLI_MARKER = "<!-- fleetrl:cli-reference -->"
PROVENANCE = re.compile(r"<!-- fleetrl:provenance (?P<files>[^>]*?) -->")
RESULTS = ROOT / "benchmarks" / "results"
NOTE_HEADING = re.compile(r"^#+ .*\{#(?P<anchor>[\w.]+)\}\s*$", re.MULTILINE)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if CONFIG_MARKER in markdown:
        notes = set(NOTE_HEADING.findall(markdown))
        markdown = markdown.replace(CONFIG_MARKER, config_reference(notes))
    if CLI_MARKER in markdown:
        markdown = markdown.replace(CLI_MARKER, cli_reference())
    return PROVENANCE.sub(lambda match: provenance(match.group("files").split()), markdown)


def cell(text: Any) -> str:
    """Text safe inside a Markdown table cell: HTML escaped, pipes and line breaks neutral."""
    return html.escape(str(text), quote=False).replace("|", "&#124;").replace("*", r"\*").replace("\n", " ")


def code(text: Any) -> str:
    return f"<code>{cell(text)}</code>"


# --- configuration ---------------------------------------------------------------------------


def _import_config() -> Any:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from foundation import config

    return config


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    return "(required)"


def config_sections(cls: type, prefix: str = "") -> list[tuple[str, type, list[tuple[str, str, Any, str]]]]:
    """(section name, class, rows) for `cls` and every nested section, depth first; a row is
    (dotted field name, type, default, help line)."""
    hints = typing.get_type_hints(cls)
    rows: list[tuple[str, str, Any, str]] = []
    nested = []
    for f in dataclasses.fields(cls):
        kind = hints[f.name]
        if dataclasses.is_dataclass(kind):
            nested.extend(config_sections(kind, f"{prefix}{f.name}."))  # type: ignore[arg-type]
        else:
            type_name = f.type if isinstance(f.type, str) else getattr(kind, "__name__", str(kind))
            rows.append((prefix + f.name, type_name, _default(f), f.metadata.get("help", "")))
    return [(prefix.rstrip(".") or "run", cls, rows), *nested]


def config_reference(notes: set[str]) -> str:
    config = _import_config()
    out = []
    for section, cls, rows in config_sections(config.RunConfig):
        if not rows:
            continue
        out.append(f"## `{section}` {{#section-{section.replace('.', '-')}}}\n")
        doc = (cls.__doc__ or "").strip()
        if doc and not doc.startswith(cls.__name__ + "("):  # a dataclass's generated signature is no help
            out.append(doc.split("\n\n")[0].replace("\n", " ") + "\n")
        out.append(f"`{cls.__name__}` in `{cls.__module__}`. Set with `--set {rows[0][0]}=VALUE`.\n")
        out.append("| field | type | default | help |")
        out.append("| --- | --- | --- | --- |")
        for name, type_name, default, help_line in rows:
            more = f" ([notes](#{name}))" if name in notes else ""
            out.append(f"| {code(name)} | {code(type_name)} | {code(repr(default))} | {cell(help_line)}{more} |")
        out.append("")
    return "\n".join(out)


# --- command line ----------------------------------------------------------------------------


def _import_parser() -> Any:
    """fleet.cli.args.build_parser, from this checkout."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from fleet.cli.args import build_parser

    return build_parser


def _make_parser() -> argparse.ArgumentParser:
    build_parser = _import_parser()
    try:
        return build_parser("fleetrl: train robot manipulation policies with an asynchronous fleet")
    except TypeError:  # a build_parser that takes no description
        return build_parser()


def _help(action: argparse.Action, parser: argparse.ArgumentParser) -> str:
    text = action.help or ""
    if "%" in text:
        params = {k: v for k, v in vars(action).items() if v is not argparse.SUPPRESS}
        params["prog"] = parser.prog
        if params.get("choices") is not None:
            params["choices"] = ", ".join(str(c) for c in params["choices"])
        try:
            text = text % params
        except (KeyError, TypeError, ValueError):
            pass
    return text


def _argument_rows(parser: argparse.ArgumentParser) -> list[str]:
    rows = []
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)) or action.help == argparse.SUPPRESS:
            continue
        if action.option_strings:
            name = ", ".join(action.option_strings)
            if action.nargs != 0:
                metavar = action.metavar or (
                    "{" + ",".join(map(str, action.choices)) + "}" if action.choices else action.dest.upper()
                )
                name += f" {metavar if isinstance(metavar, str) else ' '.join(metavar)}"
        else:
            name = str(action.metavar or action.dest)
        default = action.default
        shown = "" if default in (None, argparse.SUPPRESS, False, []) or action.nargs == 0 else code(repr(default))
        if action.required:
            shown = "required"
        rows.append(f"| {code(name)} | {shown} | {cell(_help(action, parser))} |")
    return rows


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, str, argparse.ArgumentParser]]:
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            for name, sub in action.choices.items():
                out.append((name, helps.get(name, ""), sub))
    return out


def _command_section(path: str, summary: str, parser: argparse.ArgumentParser, level: int) -> list[str]:
    out = [f"{'#' * level} `{path}`\n"]
    if summary:
        out.append(cell(summary) + "\n")
    if parser.description and parser.description != summary:
        out.append(cell(parser.description) + "\n")
    usage = parser.format_usage().strip().removeprefix("usage: ")
    out.append(f"```text\n{usage}\n```\n")
    rows = _argument_rows(parser)
    if rows:
        out += ["| argument | default | help |", "| --- | --- | --- |", *rows, ""]
    for name, sub_help, sub in _subcommands(parser):
        out += _command_section(f"{path} {name}", sub_help, sub, min(level + 1, 4))
    return out


def cli_reference() -> str:
    parser = _make_parser()
    out = []
    for name, sub_help, sub in _subcommands(parser):
        out += _command_section(f"fleetrl {name}", sub_help, sub, 2)
    return "\n".join(out)


# --- results -----------------------------------------------------------------------------------


def _machine(machine: Any) -> str:
    if isinstance(machine, dict):
        return f"{machine.get('cpu', '?')}, {machine.get('cores', '?')} cores"
    return str(machine)


def provenance(names: list[str]) -> str:
    """A table of what made each raw result: file, command, commit, machine, date."""
    import json

    header = "| raw result (benchmarks/results/) | command | commit | machine | date |"
    rows = [header, "| --- | --- | --- | --- | --- |"]
    for name in names:
        path = RESULTS / name
        if not path.is_file():
            raise FileNotFoundError(f"the results page cites benchmarks/results/{name}, which does not exist")
        record = json.loads(path.read_text())
        command = record.get("command", "")
        figures = record.get("figures")
        if command in ("", "-") and isinstance(figures, dict):
            command = figures.get("command", command)
        commit = str(record.get("commit", ""))[:9]
        date = str(record.get("date", ""))[:10]
        rows.append(
            f"| {code(name)} | {code(command)} | {code(commit)} | "
            f"{cell(_machine(record.get('machine')))} | {cell(date)} |"
        )
    return "\n".join(rows) + "\n"
