"""The interactive lab: the widget (``widget``), the live chart (``live``, ``chart``), ``%%isolate`` (``magic``)
and the result card (``card``).

``labutils.lab`` is this package and also the call that opens the lab: ``labutils.lab()`` shows the
widget. The module is made callable so that the public call kept its name when the lab got a folder;
ipywidgets is imported only on that call.
"""

import sys
import types


def lab(scenario=None, which: str = "broken", mystery: bool = True, learner: str = ""):
    """The interactive lab (ipywidgets): a game of anonymous cases by default (``mystery=False``: every
    scenario by name); predict, run it isolated, watch the live chart, then the reveal."""
    from .widget import lab as _lab

    return _lab(scenario, which, mystery=mystery, learner=learner)


class _CallableModule(types.ModuleType):
    __call__ = staticmethod(lab)


sys.modules[__name__].__class__ = _CallableModule
