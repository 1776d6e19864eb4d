"""The interactive lab: the widget (``widget``), the live chart (``live``), ``%%isolate`` (``magic``) and
the tour of scenarios (``tour``).

``labutils.lab`` is this package and also the call that opens the lab: ``labutils.lab()`` shows the
widget. The module is made callable so that the public call kept its name when the lab got a folder;
ipywidgets is imported only on that call.
"""

import sys
import types


def lab(scenario: str = "worker_exception", which: str = "broken"):
    """The interactive lab (ipywidgets): pick a scenario, set limits, run it isolated, read the card."""
    from .widget import lab as _lab

    return _lab(scenario, which)


class _CallableModule(types.ModuleType):
    def __call__(self, scenario: str = "worker_exception", which: str = "broken"):
        return lab(scenario, which)


sys.modules[__name__].__class__ = _CallableModule
