"""The suite's xdist scheduler (``pytest -n N --dist loadfile``, see ``pytest_plugin``).

xdist's ``loadfile`` hands out whole files in collection order, so the longest notebooks, collected
last, used to start last and leave one process working alone at the end. This scheduler keeps the
grouping (a notebook's cells run in order, in one kernel, on one process) with two changes:

* a test file's tests under an extra start method (ids ``[forkserver-...]``, from the plugin's
  ``lab_start_method`` parameter) form a group of their own, so the two passes of ``test_scenarios.py``
  can run side by side;
* the next group handed out is the longest one left (longest processing time first), by the
  measured seconds in ``tests/durations.json`` (refresh it with ``python tests/tools/update_durations.py
  JUNIT.xml``); a group missing from the file counts one second per test.

Only the order and the grouping change: every collected test runs once, as before.
"""

from __future__ import annotations

import json
import os

from xdist.scheduler import LoadScopeScheduling

DURATIONS = os.path.join("tests", "durations.json")


def split_scope(nodeid: str, methods) -> str:
    """The group of ``nodeid``: its file (a notebook pass is a file of its own), plus ``::M`` for a test
    parametrized with the extra start method ``M``."""
    path, _, rest = nodeid.partition("::")
    if rest and path.endswith(".py") and "[" in rest and rest.endswith("]"):
        first = rest[rest.index("[") + 1 : -1].split("-", 1)[0]
        if first in methods:
            return f"{path}::{first}"
    return path


def load_durations(rootdir) -> dict:
    try:
        with open(os.path.join(str(rootdir), DURATIONS), encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in data.items() if isinstance(v, (int, float))}


class LongestFirstScheduling(LoadScopeScheduling):
    def __init__(self, config, log=None) -> None:
        super().__init__(config, log)
        self._methods = tuple(getattr(config, "_lab_also", ()))
        self._durations = load_durations(config.rootpath)

    def _split_scope(self, nodeid: str) -> str:
        return split_scope(nodeid, self._methods)

    def _cost(self, scope: str) -> float:
        return self._durations.get(scope, float(len(self.workqueue.get(scope, ()))))

    def _assign_work_unit(self, node) -> None:
        longest = max(self.workqueue, key=self._cost)
        self.workqueue.move_to_end(longest, last=False)
        super()._assign_work_unit(node)
