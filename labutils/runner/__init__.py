"""One isolated run: options -> launch (cold or warm) -> monitor -> ownership and clean-up -> RunResult.

``isolate`` is the door (:func:`labutils.run_isolated`); ``bootstrap``/``child`` run inside the run's
process; ``zygote``/``warm`` are the warm launcher; ``procs``/``pids``/``cgroup`` decide which processes
are the run's and what limits them; ``result`` is the record a run returns.
"""

from .._lazy import submodule_getattr

__getattr__ = submodule_getattr(__name__)
