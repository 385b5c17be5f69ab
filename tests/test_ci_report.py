"""`.ci/check_report.py`: CI fails when tests are missing or a non-browser test was skipped."""

import subprocess
import sys

import pytest

from tests.helpers import REPO

CASE = '<testcase classname="{cls}" name="{name}">{body}</testcase>'
SKIP = '<skipped type="{kind}" message="why" />'


def check(tmp_path, cases: list[str], floor: int) -> subprocess.CompletedProcess:
    report = tmp_path / "report.xml"
    report.write_text(f'<testsuites><testsuite name="pytest">{"".join(cases)}</testsuite></testsuites>')
    return subprocess.run(
        [sys.executable, str(REPO / ".ci" / "check_report.py"), str(report), str(floor)], capture_output=True, text=True
    )


@pytest.mark.parametrize(
    ("cases", "floor", "ok", "says"),
    [
        ([CASE.format(cls="tests.test_a", name="t", body="")] * 3, 3, True, "3 tests ran"),
        ([CASE.format(cls="tests.test_a", name="t", body="")] * 2, 3, False, "only 2 tests ran; the floor is 3"),
        ([CASE.format(cls="tests.e2e.test_ui", name="t", body=SKIP.format(kind="pytest.skip"))], 1, True, ""),
        ([CASE.format(cls="tests.test_a", name="t", body=SKIP.format(kind="pytest.xfail"))], 1, True, ""),
        (
            [CASE.format(cls="tests.test_a", name="t", body=SKIP.format(kind="pytest.skip"))],
            1,
            False,
            "skipped outside the browser tests: tests.test_a::t",
        ),
    ],
)
def test_floor_and_skips(tmp_path, cases, floor, ok, says):
    proc = check(tmp_path, cases, floor)
    assert (proc.returncode == 0) is ok and says in proc.stdout + proc.stderr
