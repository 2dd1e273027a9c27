"""docs/benchmarks.md is generated from benchmarks/results/*.json and stays in step with them.

The page is re-rendered here and compared byte for byte with the committed file: a result file
changed without re-running ``python benchmarks/render_docs.py`` fails this test.  The renderer's
generic path (a new benchmark's file, with and without its run record) is checked on files made
here.
"""

from __future__ import annotations

import importlib.util
import json
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"


def _load(name):
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))  # the scripts import their sibling ``_meta``
    spec = importlib.util.spec_from_file_location(f"benchmarks_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def render_docs():
    return _load("render_docs")


def test_committed_page_matches_the_results(render_docs):
    committed = (ROOT / "docs" / "benchmarks.md").read_text()
    assert committed == render_docs.render(), (
        "docs/benchmarks.md is stale: run `python benchmarks/render_docs.py` and commit it")
    assert render_docs.main(["--check"]) == 0


def test_every_registered_file_exists_and_every_result_is_accounted_for(render_docs):
    names = set(render_docs.result_files())
    assert len(names) >= len(render_docs.RENDERERS)
    assert set(render_docs.RENDERERS) <= names  # a renamed result file must not drop its table silently
    page = render_docs.render()
    for name in names:
        assert f"`{name}`" in page or f"`benchmarks/results/{name}`" in page, name


def test_numbers_come_from_the_files(render_docs):
    # One cell traced by hand: the B1 steady speed-up of bench_pld.json, as the page prints it.
    data = json.loads((BENCH / "results" / "bench_pld.json").read_text())
    row = next(r for r in data["rows"] if r["case"] == "B1" and r["setting"] == "default")
    page = render_docs.render()
    assert f"| {render_docs.ratio(row['steady_speedup_vs_dp_accounting'])} |" in page
    assert render_docs.num(29.06588) == "29.1" and render_docs.num(1839.6) == "1840"
    assert render_docs.num(6.9e-6, 2) == "6.9e-06" and render_docs.seconds(0.0199) == "19.9 ms"


def test_a_new_benchmark_file_gets_a_table_with_machine_date_and_command(render_docs, tmp_path):
    meta = _load("_meta").run_metadata(str(BENCH / "bench_new.py"), ["--quick", "--n", "3"])
    assert meta["command"] == "python benchmarks/bench_new.py --quick --n 3"
    assert meta["date"].endswith("Z") and meta["machine"]["cpu_count"] >= 1
    (tmp_path / "bench_new.json").write_text(json.dumps({
        "benchmark": "bench_new", "note": "what it measures",
        "rows": [{"case": "a", "dpjax": {"seconds": 0.5}, "anchor_seconds": 2.0, "speedup": 4.0}],
        "meta": meta}))
    (tmp_path / "bench_old.json").write_text(json.dumps({"rows": [{"case": "b", "seconds": 1.25}]}))
    page = render_docs.render(tmp_path)
    new = page[page.index("## bench_new"):page.index("## bench_old")]
    assert f"- date: {meta['date']}" in new
    assert "- command: `python benchmarks/bench_new.py --quick --n 3`" in new
    assert "- machine: " in new and "not recorded" not in new
    assert "| case | dpjax.seconds | anchor_seconds | speedup |" in new and "| a | 0.500 | 2.00 | 4.00 |" in new
    old = page[page.index("## bench_old"):]
    assert "- machine: not recorded" in old and "- date: not recorded" in old
    assert "- command: not recorded (script: `benchmarks/bench_old.py`)" in old
    assert render_docs.render(tmp_path) == page  # deterministic


def test_every_table_carries_its_machine_date_and_command(render_docs):
    """The README says every table carries them: no field of any table is left unrecorded (a
    record added after the run says how each field was obtained)."""
    page = render_docs.render()
    assert render_docs.NOT_RECORDED not in page
    sections = page.split("\n## ")[2:]   # after the header and the headline ratios
    tables = [s for s in sections if s.startswith(tuple("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"))
              and "\nSource: " in s]
    assert tables
    for section in tables:
        title = section.splitlines()[0]
        for field in ("machine: ", "date: ", "command: "):
            assert field in section, (title, field)
    # What a record added afterwards says, as the page prints it.
    assert "recorded after the run: date: that of git commit 213261d" in page
