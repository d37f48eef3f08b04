"""The exclusions file written from measured failures (``regenerate.py``): a reason derived from
each error, the cases grouped by cause, and the TOML text.

A reason is the error's type and its first line, with what names one case or one node cut away
(the model's name, node names, mismatch counts, source paths and C++ signatures inside ORT's
messages), so that every case failing for the same cause has the same reason.
"""

from __future__ import annotations

import json
import re
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .suite import Config, Exclusions

_MAX_REASON = 240

# The heading of each kind of failure, by the exception type that reports it.
_CAUSES = {
    "UnsupportedError": "Refused when compiling: no driver placed here can run a node",
    "CompileError": "The engine refuses the model when compiling it",
    "ExecutionError": "The engine fails while running the model",
    "AssertionError": "The outputs differ from ONNX's expected outputs",
}


def _differs(match: re.Match[str]) -> str:
    tolerance, output, location = match.groups()
    what = f" ({location})" if location else ""
    return f"{output} differs from the expected output beyond {tolerance}{what}"


_SUBSTITUTIONS: list[tuple[re.Pattern[str], Any]] = [
    # crossrt's status prefix: the exception type says as much
    (re.compile(r"^\[[A-Z_]+ \(\d+\)\] "), ""),
    (re.compile(r"^driver '(\w+)' on \S+ cannot run"), r"\1 cannot run"),
    # "driver 'x' on cpu:0 cannot run 3 of 5 nodes of 'model': Name_1 (Op): why"
    (re.compile(r"cannot run \d+ of \d+ nodes of '[^']*': \S+ \((\w+)\): "), r"cannot run \1: "),
    (re.compile(r"can run \d+ nodes of '[^']*': \S+ \((\w+)\): "), r"can run \1: "),
    (re.compile(r" could not compile model '[^']*'"), " could not compile the model"),
    (re.compile(r"\[ONNXRuntimeError\] : \d+ : \w+ : "), ""),
    (
        re.compile(r"Non-zero status code returned while running (\w+) node\. Name:'[^']*' "),
        r"\1: ",
    ),
    (re.compile(r"Status Message: "), ""),
    # a source position inside ORT, then the C++ function it is in
    (
        re.compile(
            r"/\S+\.(?:cc|h|cpp):\d+ (?:[\w:<>,&*]+ ){0,3}[\w:~<>]+\([^()]*\)"
            r"(?: const)?(?:::<lambda\(\)>)?(?: \[with [^\]]*\])? ?"
        ),
        "",
    ),
    # numpy's assert_allclose: which output, not how many elements differ
    (
        re.compile(
            r"^Not equal to tolerance (rtol=\S+, atol=\S+) \| (output [^|]*?)"
            r"(?: \| ([a-z]+ location mismatch):)?(?: \|.*)?$"
        ),
        _differs,
    ),
    # the remedies crossrt adds: the same for every case
    (re.compile(r"\. Choose another device or driver.*$"), ""),
]


def reason(error: str) -> str:
    """The reason of an exclusion for ``error`` (``"Type: message"``, lines joined by
    `` | ``): its type and first line without what is particular to one case."""
    kind, _, message = error.partition(": ")
    for pattern, replacement in _SUBSTITUTIONS:
        message = pattern.sub(replacement, message)
    message = message.partition(" | ")[0].strip()  # the first line
    # Other nodes the same engine cannot run: the first says why
    message = re.sub(r"; \S+ \(\w+\): .*$", " (and more nodes)", message)
    text = f"{kind}: {message}" if message else kind
    return text if len(text) <= _MAX_REASON else text[: _MAX_REASON - 3] + "..."


def cause(error_reason: str) -> str:
    """The heading a reason is listed under."""
    kind = error_reason.partition(":")[0]
    return _CAUSES.get(kind, f"Other errors ({kind})")


@dataclass
class Table:
    """One configuration's entries, as written to the file."""

    config: Config
    excluded: dict[str, str] = field(default_factory=dict)
    flaky: dict[str, str] = field(default_factory=dict)
    passed: int = 0
    measured: bool = True
    review: list[str] = field(default_factory=list)  # flaky entries that passed every run

    def summary(self, total: int) -> str:
        return (
            f"[{self.config.name}] {self.passed} of {total} passed; {len(self.excluded)} "
            f"excluded, {len(self.flaky)} flaky"
        )


def measured_table(
    config: Config,
    runs: Sequence[Mapping[str, str | None]],
    old: Exclusions | None,
    names: Sequence[str],
    flaky_causes: Mapping[tuple[str, str], tuple[str, str]] | None = None,
) -> Table:
    """The table of ``config`` from its runs (case -> error, or ``None`` when it passed): a case
    failing every run is excluded, one whose outcome differs between runs is flaky; a flaky
    entry of ``old`` is kept while onnx has the case. ``flaky_causes`` (see
    :func:`flaky_causes`) makes a case flaky here too when it fails for the reason that made it
    flaky on another configuration (a missing locale fails every engine built on ORT alike)."""
    table = Table(config)
    old_flaky = old.flaky if old is not None else {}
    for name in names:
        errors = [run[name] for run in runs]
        failed = [e for e in errors if e is not None]
        table.passed += not failed
        why = reason(failed[0]) if failed else ""
        elsewhere = (flaky_causes or {}).get((name, why))
        if name in old_flaky:
            table.flaky[name] = old_flaky[name]
            if not failed:
                table.review.append(name)
        elif failed and len(failed) < len(errors):
            table.flaky[name] = f"passed {len(errors) - len(failed)} of {len(errors)} runs; {why}"
        elif failed and elsewhere is not None and elsewhere[0] != config.name:
            other, other_why = elsewhere
            table.flaky[name] = f"as in [{other}.flaky]: {other_why}"
        elif failed:
            table.excluded[name] = why
    return table


def flaky_causes(
    runs: Mapping[str, Sequence[Mapping[str, str | None]]], old: Mapping[str, Exclusions]
) -> dict[tuple[str, str], tuple[str, str]]:
    """(case, reason it failed for) -> (configuration, its flaky entry's words), for every flaky
    entry of ``old`` whose case failed in this measurement of its configuration."""
    causes: dict[tuple[str, str], tuple[str, str]] = {}
    for config, rules in old.items():
        for name, words in rules.flaky.items():
            errors = [run.get(name) for run in runs.get(config, [])]
            failed = [e for e in errors if e is not None]
            if failed:
                original = re.sub(r"^as in \[[^\]]*\]: ", "", words)  # not "as in ... as in"
                causes.setdefault((name, reason(failed[0])), (config, original))
    return causes


def kept_table(config: Config, rules: Exclusions, measured: bool = False) -> Table:
    """A table as the file had it: one that could not be measured here, or (``measured``)
    one measured before and not run this time (``regenerate.py --only``)."""
    return Table(config, dict(rules.excluded), dict(rules.flaky), measured=measured)


def header(onnx_version: str, cases: int, versions: Mapping[str, str]) -> str:
    engines = ", ".join(f"{name} {version}" for name, version in sorted(versions.items()))
    return f"""\
# Node tests of the ONNX backend suite that a crossrt driver is known not to pass, with why.
#
# One table per configuration of tests/conformance (each driver alone, and onnxruntime with
# fallback); one entry per case: test_name = "reason". An excluded case that passes fails the
# conformance test (remove the entry), except entries under [<config>.flaky]: cases whose
# outcome depends on the run (random operators) or on the machine (installed locales,
# optional packages); they may pass or fail.
#
# Written by `make exclusions` (tests/conformance/regenerate.py), which derives each reason
# from the error; the reasons of flaky entries are a person's and are kept.
#
{_comment(f"Measured with onnx {onnx_version} ({cases} node tests) and {engines}.")}
"""


def render(head: str, tables: Sequence[Table]) -> str:
    """The whole exclusions file."""
    parts = [head]
    for table in tables:
        parts.append(_render_table(table))
    return "\n".join(parts)


def _render_table(table: Table) -> str:
    config = table.config
    lines = [f"[{config.name}]", "", _comment(_describe_config(config))]
    if not table.measured:
        lines.append(_comment(f"Not measured by `make exclusions`: {config.unavailable}."))
    by_cause: dict[str, list[tuple[str, str]]] = {}
    for name, why in table.excluded.items():
        by_cause.setdefault(cause(why), []).append((why, name))
    for heading in sorted(by_cause, key=_cause_order):
        entries = sorted(by_cause[heading])
        lines += ["", f"# -- {heading} ({len(entries)})"]
        lines += [f"{_key(name)} = {_string(why)}" for why, name in entries]
    lines += ["", f"[{config.name}.flaky]"]
    lines += [f"{_key(name)} = {_string(why)}" for name, why in sorted(table.flaky.items())]
    return "\n".join(lines) + "\n"


def _comment(text: str) -> str:
    return "\n".join(textwrap.wrap(text, 98, initial_indent="# ", subsequent_indent="# "))


def _describe_config(config: Config) -> str:
    if config.fallback is None:
        return f"{config.name}: every node on the {config.driver} driver (strict placement)."
    return (
        f"{config.name}: {config.driver}, with the nodes it cannot run placed on "
        f'fallback="{config.fallback}" (the other CPU drivers). The cases below fail on a '
        f"node {config.driver} accepts, or on no driver at all."
    )


def _cause_order(heading: str) -> int:
    titles = list(_CAUSES.values())
    return titles.index(heading) if heading in titles else len(titles)


def _key(name: str) -> str:
    return name if re.fullmatch(r"[A-Za-z0-9_-]+", name) else _string(name)


def _string(text: str) -> str:
    # A JSON string is a TOML basic string: the same quotes and escapes.
    return json.dumps(text, ensure_ascii=False)
