"""`pytest notebooks/...` loads the suite's plugin too (tests/labsuite: one pass per start method, the
leak check, the longest-first scheduler); plain `pytest` loads it from tests/conftest.py as well."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "tests"))

pytest_plugins = ["labsuite.pytest_plugin"]
