"""docs/seed-checklist.md, the seed checklist (seed-apis.md §4) re-counted, holds to the code:
176 rows, each cell one of its five forms, every name it gives as crossrt's real, and the counts
it and docs/compat.md show equal to its table's (``tests/seed_checklist.py`` rewrites them).

Where the reference notes are beside the repository, each row's capability and which seeds
offer it are checked against them too.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import seed_checklist as sc


def test_the_page_has_the_176_rows_in_order() -> None:
    numbers = [row.number for row in sc.parse()]
    assert numbers == list(range(1, sc.ROWS + 1)), (
        f"docs/seed-checklist.md has rows {numbers[:3]}...{numbers[-3:]} ({len(numbers)}); "
        f"seed-apis.md §4 has 1..{sc.ROWS}: one table row per checklist row"
    )


def test_every_cell_is_one_of_the_five_forms() -> None:
    problems = []
    for row in sc.parse():
        if not row.offered():
            problems.append(f"#{row.number}: no seed offers it (all cells —)")
        for seed in sc.SEEDS:
            status = row.status(seed)
            if status == "?":
                problems.append(
                    f"#{row.number} {seed}: write '—' or start with **yes**: / **diff**: / "
                    f"**refused**: / **missing**: ({row.cells[seed][:40]!r})"
                )
            elif status in ("yes", "diff", "refused") and not sc.SPAN.search(row.cells[seed]):
                problems.append(
                    f"#{row.number} {seed}: {status} names no crossrt function, command or "
                    "module in backticks"
                )
    assert not problems, "\n".join(problems)


def test_every_name_given_as_crossrt_s_exists() -> None:
    problems = sc.bad_names(sc.parse())
    assert not problems, "names in docs/seed-checklist.md that do not exist:\n" + "\n".join(
        problems
    )


@pytest.mark.parametrize("page", [sc.PAGE, sc.COMPAT], ids=lambda p: p.name)
def test_the_counts_are_the_table_s(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    block = sc.summary(sc.parse())
    assert sc.with_summary(text, block) == text, (
        f"the counts in {page.name} are not the table's: run `python tests/seed_checklist.py`"
    )


def _reference() -> Path | None:
    candidates = [os.environ.get("CROSSRT_SEED_APIS", "")]
    candidates += [str(p / "shared" / "reference" / "seed-apis.md") for p in sc.REPO.parents]
    return next((Path(c) for c in candidates if c and Path(c).is_file()), None)


def test_rows_match_the_reference_notes() -> None:
    path = _reference()
    if path is None:
        pytest.skip("seed-apis.md is not beside the repository (set CROSSRT_SEED_APIS)")
    text = path.read_text(encoding="utf-8")
    reference = {row.number: row for row in sc.parse(text[text.index("## 4.") :])}
    assert sorted(reference) == list(range(1, sc.ROWS + 1))
    problems = []
    for row in sc.parse():
        ref = reference[row.number]
        if ref.capability != row.capability:
            problems.append(f"#{row.number}: capability {row.capability!r}, §4 {ref.capability!r}")
        for seed in sc.SEEDS:
            offered = ref.cells[seed].startswith(("✔", "~"))
            if offered != (row.status(seed) is not None):
                problems.append(f"#{row.number} {seed}: §4 says {ref.cells[seed][:30]!r}")
    assert not problems, "\n".join(problems)


# -- the checks can fail -----------------------------------------------------------------


def _page_with(old: str, new: str) -> list[sc.Row]:
    text = sc.PAGE.read_text(encoding="utf-8")
    assert old in text
    return sc.parse(text.replace(old, new, 1))


def test_a_wrong_name_is_reported() -> None:
    rows = _page_with("`nrt_init`, `nrt_close`", "`nrt_init`, `nrt_shutdown`")
    assert sc.bad_names(rows) == [
        "#9 A: `nrt_shutdown`: nrt_shutdown is neither in crossrt.compat.neuron, nor crossrt's, "
        "nor a variable src/ reads"
    ]
    rows = _page_with("`crossrt top`", "`crossrt htop`")
    assert any("no `crossrt htop` in COMMANDS" in p for p in sc.bad_names(rows))
    rows = _page_with("`crossrt.drivers.base.Capabilities`", "`crossrt.drivers.base.Caps`")
    assert any("crossrt.drivers.base.Caps does not exist" in p for p in sc.bad_names(rows))


def test_a_changed_cell_changes_the_counts() -> None:
    before = sc.counts(sc.parse())
    after = sc.counts(_page_with("| **yes**: `OH_NNDevice_GetType` |", "| **missing**: no |"))
    assert after["N"]["yes"] == before["N"]["yes"] - 1
    assert after["N"]["missing"] == before["N"]["missing"] + 1
    assert sc.summary(sc.parse()) != sc.summary(
        _page_with("| **yes**: `OH_NNDevice_GetType` |", "| **missing**: no |")
    )


def test_names_in_a_module_whose_extra_is_absent_are_read_from_its_source() -> None:
    # crossrt.server needs the serve extra (grpc); without it the names are found in the file
    assert sc._defined_in_source(["server", "remote_model", "RemoteModel", "post"])
    assert not sc._defined_in_source(["server", "remote_model", "RemoteModel", "postt"])
    assert not sc._defined_in_source(["server", "no_such_module", "X"])
