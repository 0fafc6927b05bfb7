"""The guard's canaries (`reroll_sidecar.guard_canaries`): named, placed and written like the
task's own tests, judged exactly."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from reroll_sidecar import guard_canaries
from reroll_sidecar.guard_canaries import Canaries

REAL = """import os
import sys
import unittest

sys.path.insert(0, os.environ.get("REROLL_WORKSPACE", "/app"))
from calc import add, mean
DATA = open("data.txt").read()


class CalcTests(unittest.TestCase):
    def test_mean_of_values(self):
        self.assertEqual(mean([1, 2, 3]), 2)
"""


def test_names_follow_the_real_tests_style_and_carry_no_random_hex(tmp_path: Path) -> None:
    real = tmp_path / "calc_test.py"
    real.write_text(REAL)
    for _ in range(20):
        canaries = Canaries.fresh(str(real), str(tmp_path))
        assert 2 <= len(canaries.files) <= 3
        assert canaries.must_pass and len(canaries.must_fail) >= len(canaries.files)
        for module, klass, name in [*canaries.must_pass, *canaries.must_fail]:
            assert module.endswith("_test") and klass.endswith("Test") and name.startswith("test_")
            assert not re.search(r"[0-9a-f]{6}", f"{module}{klass}{name}")
            assert module != "calc_test"
        assert {module for module, _, _ in canaries.must_fail} == set(canaries.files)


def test_a_canary_module_imports_what_the_real_one_does_and_stops_before_other_code(tmp_path: Path) -> None:
    real = tmp_path / "test_calc.py"
    real.write_text(REAL)
    source = next(iter(Canaries.fresh(str(real), str(tmp_path)).files.values()))
    assert source.startswith("try:\n    import os\n") and "    from calc import add, mean\n" in source
    assert "sys.path.insert(0, os.environ.get('REROLL_WORKSPACE', '/app'))" in source
    assert "data.txt" not in source and "except Exception:\n    pass" in source
    compile(source, "canary.py", "exec")


def test_only_the_canaries_outcomes_as_they_must_be_are_right() -> None:
    canaries = Canaries.fresh()
    right = {f"{m}.py::{c}::{n}": "passed" for m, c, n in canaries.must_pass}
    right |= {f"{m}.{c}.{n}": "failed" for m, c, n in canaries.must_fail}  # unittest's ids
    assert not canaries.wrong({**right, "test_real.py::T::test_x": "failed"})
    assert all(canaries.key(test_id) for test_id in right) and not canaries.key("test_real.py::T::test_x")
    forged = {test_id: "passed" for test_id in right}
    assert "must have failed: passed" in canaries.wrong(forged)
    missing = dict(list(right.items())[1:])
    assert "missing" in canaries.wrong(missing)


def test_a_node_id_that_names_no_file_still_finds_its_canary(tmp_path: Path) -> None:
    """pytest names a test outside its rootdir (the tests in /verifier, the rootdir the workspace)
    ``../app/::Class::test``, without its file: seen on docker, every canary came back missing."""
    real = tmp_path / "test_calc.py"
    real.write_text(REAL)
    canaries = Canaries.fresh(str(real), str(tmp_path))
    ids = {f"../app/::{c}::{n}": "passed" for _, c, n in canaries.must_pass}
    ids |= {f"../app/::{c}::{n}": "failed" for _, c, n in canaries.must_fail}
    assert not canaries.wrong(ids | {"../app/::CalcTests::test_mean_of_values": "failed"})
    assert not canaries.key("../app/::CalcTests::test_mean_of_values")
    assert "CalcTests" not in {c for _, c, _ in [*canaries.must_pass, *canaries.must_fail]}


def test_canaries_go_among_the_real_files_spelt_alike_options_untouched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "test_a.py").write_text("")
    (tmp_path / "test_b.py").write_text("")
    canaries = Canaries.fresh(str(tmp_path / "test_a.py"), str(tmp_path))
    written = canaries.write(str(tmp_path), str(tmp_path / "fallback"))
    assert all(
        Path(path).parent == tmp_path and oct(Path(path).stat().st_mode & 0o777) == "0o644"
        for path in written
    )
    args = ["-q", "-p", "no:cacheprovider", "test_a.py", "-k", "x", "test_b.py"]
    monkeypatch.chdir(tmp_path)
    firsts = set()
    for _ in range(30):
        spelt = guard_canaries.as_given(written, "test_a.py")
        assert all("/" not in path for path in spelt)
        placed = guard_canaries.placed(args, spelt)
        assert placed[:3] == ["-q", "-p", "no:cacheprovider"] and placed[-2:] == ["-k", "x"]
        files = placed[3:-2]
        assert sorted(files) == sorted(["test_a.py", "test_b.py", *spelt])
        assert files.index("test_a.py") < files.index("test_b.py")
        firsts.add(files[0])
    assert len(firsts) > 1  # a canary comes first sometimes, the real file other times
    canaries.remove()
    assert not any(Path(path).exists() for path in written)
