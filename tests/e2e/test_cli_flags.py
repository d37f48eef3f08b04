"""Every ``crossrt`` tool spells a shared flag the same (issue 25.4): the parsers of every
subcommand are walked, and docs/cli.md is checked to name each tool's flags."""

from __future__ import annotations

import argparse
import importlib
import re
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest

from crossrt.tools import flags
from crossrt.tools.cli import COMMANDS

CLI_DOC = Path(__file__).resolve().parents[2] / "docs" / "cli.md"

# (command, flag) defined otherwise on purpose, with why; its form is still checked.
EXCEPTIONS = {
    ("compile", "--shape"): "fixes the shape the model is compiled for (compile(shapes=)), "
    "where the others shape random inputs; the same NAME=DxD... form",
}


def walk(name: str, parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.Action]]:
    """``(command, action)`` for every flag of ``parser`` and its subcommands."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub, subparser in action.choices.items():
                yield from walk(f"{name} {sub}", subparser)
        elif action.option_strings and not isinstance(action, argparse._HelpAction):
            yield name, action


def every_flag() -> list[tuple[str, argparse.Action]]:
    return [
        found
        for command, (module, _) in COMMANDS.items()
        for found in walk(command, importlib.import_module(module).parser())
    ]


def form(action: argparse.Action) -> tuple[object, ...]:
    """How a flag takes its value: the action's kind, nargs, type, and the long flag each of
    its short forms stands for."""
    longs = [s for s in action.option_strings if s.startswith("--")]
    shorts = sorted(s for s in action.option_strings if not s.startswith("--"))
    return (type(action).__name__, action.nargs, action.type, tuple(longs[:1]), tuple(shorts))


def definition(action: argparse.Action) -> tuple[object, ...]:
    """Everything ``--help`` and parsing show of a flag."""
    return (
        sorted(action.option_strings),
        *form(action),
        action.metavar,
        action.default,
        action.choices,
        action.help,
    )


def shared_action(flag: str) -> argparse.Action:
    parser = argparse.ArgumentParser()
    flags.add(parser, flag)
    return parser._actions[-1]


def shared_definition(flag: str) -> tuple[object, ...]:
    return definition(shared_action(flag))


def test_every_tool_is_walked() -> None:
    commands = {command for command, _ in every_flag()}
    assert {c.split()[0] for c in commands} == set(COMMANDS)
    assert {"cache ls", "cache verify", "cache prune"} <= commands


def test_shared_flags_are_defined_once_for_every_tool() -> None:
    """A flag of :data:`flags.SHARED` has the same spellings, form, metavar, default and help
    in every tool that takes it."""
    differ = []
    seen: dict[str, set[str]] = defaultdict(set)
    for command, action in every_flag():
        for flag in set(action.option_strings) & set(flags.SHARED):
            seen[flag].add(command)
            if (command.split()[0], flag) in EXCEPTIONS:
                if form(action) != form(shared_action(flag)):
                    differ.append(f"{command} {flag}: {form(action)}")
            elif definition(action) != shared_definition(flag):
                differ.append(f"{command} {flag}: {definition(action)}")
    assert not differ, "defined otherwise than tools/flags.py SHARED:\n" + "\n".join(differ)
    assert all(len(seen[flag]) >= 2 for flag in flags.SHARED), dict(seen)


def test_a_flag_takes_its_value_alike_in_every_tool() -> None:
    """Any flag two tools both have (shared or not) takes its value the same way, and a
    short form stands for the same long flag everywhere: no ``--json`` that is a switch in
    one tool and takes a FILE in another, no ``--fallback A B`` beside a repeated one."""
    forms: dict[str, dict[tuple[object, ...], list[str]]] = defaultdict(lambda: defaultdict(list))
    for command, action in every_flag():
        for spelling in action.option_strings:
            forms[spelling][form(action)].append(command)
    differ = {flag: dict(found) for flag, found in forms.items() if len(found) > 1}
    assert not differ, differ


def _sections() -> dict[str, str]:
    text = CLI_DOC.read_text(encoding="utf-8")
    parts = re.split(r"^## `crossrt (\w+)", text, flags=re.MULTILINE)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts), 2)}


def test_docs_cli_names_every_flag_of_every_tool() -> None:
    sections = _sections()
    text = CLI_DOC.read_text(encoding="utf-8")
    missing = []
    for command, action in every_flag():
        tool = command.split()[0]
        section = sections.get(tool, "")
        for spelling in action.option_strings:
            if not re.search(rf"`{re.escape(spelling)}\b", section):
                missing.append(f"{command} {spelling}")
    assert set(COMMANDS) <= set(sections), set(COMMANDS) - set(sections)
    assert not missing, "docs/cli.md does not name, in the tool's section:\n" + "\n".join(missing)
    for flag, (_, options) in flags.SHARED.items():
        assert options["help"] in text, f"docs/cli.md's shared flags table lacks {flag}'s help"


@pytest.mark.parametrize("flag", sorted(flags.SHARED))
def test_the_checker_catches_a_flag_defined_otherwise(flag: str) -> None:
    """The definition check can fail: another help, spelling or form is seen."""
    parser = argparse.ArgumentParser()
    names, options = flags.SHARED[flag]
    parser.add_argument(*names, **{**options, "help": "something else"})
    assert definition(parser._actions[-1]) != shared_definition(flag)
