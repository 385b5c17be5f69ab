"""Fail CI when the test run proves less than it should: fewer tests than the floor, or a skip
outside the browser tests (a skip hides a failure; only a missing Chromium may excuse one).

``python .ci/check_report.py REPORT.xml MIN_TESTS`` reads pytest's JUnit XML report.
"""

import sys
import xml.etree.ElementTree as ET


def main(report: str, floor: int) -> int:
    cases = list(ET.parse(report).getroot().iter("testcase"))
    skipped = []
    for case in cases:
        for skip in case.findall("skipped"):
            if skip.get("type") == "pytest.xfail":  # expected failures are results, not skips
                continue
            if not case.get("classname", "").startswith("tests.e2e."):
                skipped.append(f"{case.get('classname')}::{case.get('name')}: {skip.get('message')}")
    problems = []
    if len(cases) < floor:
        problems.append(f"only {len(cases)} tests ran; the floor is {floor}")
    problems += [f"skipped outside the browser tests: {line}" for line in skipped]
    for line in problems:
        print(f"ci: {line}", file=sys.stderr)
    print(f"ci: {len(cases)} tests ran (floor {floor}), {len(skipped)} non-browser skips")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2])))
