"""Naming the cause: the catalogue (``causes``), the rules over a run's evidence (``diagnose``), the
machine probes shared with ``doctor``, the ``diagnose`` command line (``cli``) and the cheat sheet."""
