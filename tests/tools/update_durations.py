"""python tests/tools/update_durations.py JUNIT.xml: rewrite tests/durations.json from a run's JUnit report
(``pytest --junitxml=JUNIT.xml``). The scheduler (tests/labsuite/xdist_schedule.py) hands out the longest
group first by these seconds; a stale file only changes the order, never what runs."""

import collections
import json
import os
import sys
import xml.etree.ElementTree as ET

TESTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir)
sys.path.insert(0, TESTS)  # labsuite, the suite's plugin
from labsuite.xdist_schedule import DURATIONS, split_scope  # noqa: E402

ROOT = os.path.join(TESTS, os.pardir)


def also_methods() -> tuple:
    """The extra start methods a report may hold: ``--lab-matrix``'s, and any of ``lab_also_start_methods``
    in pyproject.toml (the scheduler's own split)."""
    import tomllib

    from labsuite.pytest_plugin import MATRIX

    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as fh:
        ini = tomllib.load(fh)["tool"]["pytest"]["ini_options"]
    return tuple(dict.fromkeys([*MATRIX, *ini.get("lab_also_start_methods", ())]))


def nodeid(classname: str, name: str) -> str:
    for ext in (".ipynb", ".py"):
        head, sep, tail = classname.partition(ext)
        if sep:
            return head.replace(".", "/") + ext + tail + "::" + name
    return classname.replace(".", "/") + ".py::" + name


def main(argv) -> int:
    if len(argv) != 1 or not os.path.isfile(argv[0]):
        print("usage: python tests/tools/update_durations.py JUNIT.xml (from pytest --junitxml=JUNIT.xml)",
              file=sys.stderr)
        return 2
    methods = also_methods()
    seconds = collections.defaultdict(float)
    for case in ET.parse(argv[0]).iter("testcase"):
        seconds[split_scope(nodeid(case.get("classname", ""), case.get("name", "")), methods)] += float(
            case.get("time") or 0
        )
    out = os.path.join(ROOT, DURATIONS)
    with open(out, "w", encoding="utf-8") as fh:
        json.dump({k: round(v, 1) for k, v in sorted(seconds.items())}, fh, indent=1)
        fh.write("\n")
    print(f"{len(seconds)} groups, {sum(seconds.values()):.0f} s in all -> {os.path.normpath(out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
