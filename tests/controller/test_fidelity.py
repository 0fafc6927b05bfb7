"""The workspace comparison of ``reroll replay`` (pure)."""

from __future__ import annotations

from reroll.fidelity import _compare_workspaces


def test_a_volatile_file_that_differs_is_reported_but_not_a_change() -> None:
    original = {"calc.py": "a", ".git/index": "i1", ".aider.tags.cache.v4/cache.db": "c1", "gone": "x"}
    rebuilt = {"calc.py": "b", ".git/index": "i2", ".aider.tags.cache.v4/cache.db": "c2", "new": "y"}
    report = _compare_workspaces(original, rebuilt, [".git/index", ".aider.tags.cache.v4/*"])
    assert report is not None and not report.equal
    assert report.changed == ["calc.py"]
    assert report.volatile == [".aider.tags.cache.v4/cache.db", ".git/index"]
    assert (report.missing, report.extra) == (["gone"], ["new"])


def test_only_volatile_differences_leave_the_workspaces_equal() -> None:
    report = _compare_workspaces({".git/index": "i1"}, {".git/index": "i2"}, [".git/index"])
    assert report is not None and report.equal and report.volatile == [".git/index"]
    assert not _compare_workspaces({".git/index": "i1"}, {".git/index": "i2"}).equal  # type: ignore[union-attr]
