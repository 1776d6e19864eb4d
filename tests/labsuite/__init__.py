"""The pytest plugin (one pass or ``--lab-matrix``, graceful kernel stops, the session's leftover check in
:mod:`.leaks` with its per-process ledger in ``_site/sitecustomize.py``) and the longest-first xdist scheduler."""
