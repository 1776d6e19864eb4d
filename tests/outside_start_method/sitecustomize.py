"""Set the default start method from outside the lab, the way a reviewer (or a newer Python) does.

Put this folder first on PYTHONPATH, as an absolute path, and set OUTSIDE_START_METHOD; every Python
process that starts (pytest, each Jupyter kernel, each isolated run, each spawn worker) then calls
``multiprocessing.set_start_method(...)`` before any lab code runs::

    PYTHONPATH="$PWD/tests/outside_start_method" OUTSIDE_START_METHOD=spawn pytest notebooks

A relative path names nothing in the kernels (they start in ``notebooks/``), and the pass then runs under
the machine's default without a word.

The lab's own switch (``LABUTILS_START_METHOD``) changes only the default; this one fixes it, which is
harsher: a script that calls ``set_start_method`` without ``force=True`` then fails. Both must pass.
"""

import os

_method = os.environ.get("OUTSIDE_START_METHOD")
if _method:
    import multiprocessing

    multiprocessing.set_start_method(_method, force=True)
