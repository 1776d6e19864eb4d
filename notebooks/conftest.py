"""`pytest notebooks/...` loads the suite's plugin too (tests/labsuite: one pass per start method, the
leak check, the longest-first scheduler); plain `pytest` loads it from tests/conftest.py as well.

notebooks/reading/ holds executed reading copies (tests/tools/reading_copies.py): they are read, not run as
lessons, so nbval does not collect them (tests/test_reading.py checks they match their notebooks)."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "tests"))

pytest_plugins = ["labsuite.pytest_plugin"]
collect_ignore_glob = ["reading/*", "reading/**/*"]
