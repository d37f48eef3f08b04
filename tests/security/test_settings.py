"""A malformed CROSSRT_* variable never stops ``import crossrt``: each setting is parsed when it
is used, ``crossrt ls`` names every bad variable on one line and lists the rest. Run as real
processes, since the environment is read at import."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

import crossrt
from crossrt.tools import ls

# One malformed value per variable: the values of issue 13 first.
BAD = {
    "CROSSRT_VISIBLE_CORES": "1,3",
    "CROSSRT_LOG_LEVEL": "x",
    "CROSSRT_NUM_CORES": "two",
    "CROSSRT_VALIDATE_HASH": "maybe",
    "CROSSRT_CACHE_MAX_SIZE": "lots",
    "CROSSRT_MEMLOG_MAX_SIZE": "many",
    "CROSSRT_EXEC_TIMEOUT": "soon",
    "CROSSRT_CHECK_NUMERICS": "perhaps",
    "CROSSRT_SIM": "devices=0",
    "CROSSRT_OBSERVE": "often",
    "CROSSRT_PROCESS_TAG": "tab\there",
}


def _python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "CROSSRT_DISABLE_DRIVERS": "", **env},
        check=False,
    )


def test_import_works_with_every_variable_malformed() -> None:
    done = _python("import crossrt; print(crossrt.__version__)", BAD)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""


def test_each_malformed_variable_raises_where_its_setting_is_used() -> None:
    done = _python(
        """
        import crossrt
        from crossrt.model import GraphBuilder

        b = GraphBuilder("m")
        b.output(b.op("Relu", [b.input("x", "float32", [2])], outputs=["y"]))
        model = b.finish()
        for name, use in [
            ("CROSSRT_VISIBLE_CORES", lambda: crossrt.Runtime()),
            ("CROSSRT_LOG_LEVEL", lambda: crossrt.compile(model, "cpu")),
        ]:
            try:
                use()
            except crossrt.InvalidOptionError as exc:
                print(name, exc.details["setting"], exc.code.name)
        """,
        {"CROSSRT_VISIBLE_CORES": "1,3", "CROSSRT_LOG_LEVEL": "x"},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == [
        "CROSSRT_VISIBLE_CORES CROSSRT_VISIBLE_CORES INVALID_OPTION",
        "CROSSRT_LOG_LEVEL CROSSRT_LOG_LEVEL INVALID_OPTION",
    ]


def test_a_program_that_does_not_use_the_bad_setting_runs() -> None:
    """A bad core list spoils nothing that reserves no cores."""
    done = _python(
        """
        import crossrt
        from crossrt.model import GraphBuilder

        b = GraphBuilder("m")
        b.output(b.op("Relu", [b.input("x", "float32", [2])], outputs=["y"]))
        exe = crossrt.compile(b.finish(), "cpu")
        print(crossrt.compiler.list_networks(crossrt.compiler.executables_to_bytes([exe])))
        """,
        {"CROSSRT_VISIBLE_CORES": "1,3"},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['m']"


def test_crossrt_ls_prints_one_line_per_bad_variable_and_lists_the_rest() -> None:
    done = _python("from crossrt.tools.cli import main; raise SystemExit(main(['ls']))", BAD)
    assert done.returncode == 1
    lines = done.stderr.splitlines()
    assert len(lines) == len(BAD), done.stderr
    assert all(line.startswith("crossrt ls: error [INVALID_OPTION (2006)]: ") for line in lines)
    named = [line.split(": ")[2].partition("=")[0] for line in lines]  # the line leads with it
    assert sorted(named) == sorted(BAD)
    assert "DRIVERS" in done.stdout and "DEVICES" in done.stdout and "CORES" in done.stdout
    assert "reference     PASS" in done.stdout
    assert "sim           FAIL" in done.stdout  # its variable is the bad one


@pytest.mark.parametrize("variable", ["CROSSRT_VISIBLE_CORES", "CROSSRT_LOG_LEVEL"])
def test_crossrt_ls_in_process_names_the_variable(monkeypatch, capsys, variable) -> None:
    monkeypatch.setenv(variable, BAD[variable])
    assert ls.main(["--json"]) == 1
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and variable in err
    doc = json.loads(out)
    assert [e["setting"] for e in doc["settings_errors"]] == [variable]
    assert doc["drivers"] and doc["cores"]["host_cpus"]


def test_crossrt_ls_with_good_settings_exits_0(monkeypatch, capsys) -> None:
    monkeypatch.setenv("CROSSRT_VISIBLE_CORES", "0")
    assert ls.main(["--json"]) == 0
    assert json.loads(capsys.readouterr().out)["settings_errors"] == []
    assert crossrt.config.problems() == []
