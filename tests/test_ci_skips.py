"""The root conftest's CI rule: under CI=true a skip fails, unless it is allowlisted with a reason.

Runs a throwaway suite with this very conftest through pytest's own ``pytester``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

CONFTEST = Path(__file__).resolve().parent / "conftest.py"
SUITE = """
import pytest

def test_skips():
    pytest.skip("nothing to run against")

@pytest.mark.xfail(reason="a known bug", strict=True)
def test_known_bug():
    assert False

def test_passes():
    pass
"""


@pytest.mark.parametrize("ci, outcomes", [("true", {"failed": 1, "passed": 1, "xfailed": 1}),
                                          ("", {"skipped": 1, "passed": 1, "xfailed": 1})])
def test_a_skip_fails_under_ci_and_skips_elsewhere(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
                                                    ci: str, outcomes: dict[str, int]) -> None:
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makepyfile(test_suite=SUITE)
    monkeypatch.setenv("CI", ci)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(**outcomes)
    if ci:
        result.stdout.fnmatch_lines(["*skipped under CI=true (Skipped: nothing to run against)*CI_SKIP_ALLOWLIST*"])


def test_an_allowlisted_skip_still_skips_under_ci(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    text = CONFTEST.read_text().replace("CI_SKIP_ALLOWLIST: dict[str, str] = {",
                                        'CI_SKIP_ALLOWLIST: dict[str, str] = {\n    "test_suite.py::test_skips": "why",')
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    pytester.makeconftest(text)
    pytester.makepyfile(test_suite=SUITE)
    monkeypatch.setenv("CI", "true")
    pytester.runpytest_inprocess("-p", "no:cacheprovider").assert_outcomes(skipped=1, passed=1, xfailed=1)
