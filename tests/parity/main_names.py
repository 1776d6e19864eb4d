# parity: fast argv=--epochs,3
# What a script learns about itself: __name__, __file__, its globals, argv, sys.path[0], __mp_main__.
import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
print("name", __name__, "file", os.path.relpath(__file__, here), "abs", os.path.isabs(__file__))
print("globals", sorted(k for k in globals() if k.startswith("__")))
print("builtins", type(__builtins__).__name__, "loader", type(__loader__).__name__, "spec", __spec__)
print("package", __package__, "cached", __cached__, "doc", __doc__)
print("argv", [os.path.relpath(sys.argv[0], here), *sys.argv[1:]])
print("orig_argv", [os.path.relpath(a, here) if a.endswith(".py") else "-" for a in sys.orig_argv[1:]])
print("path0", os.path.relpath(sys.path[0], here), "cwd", os.path.relpath(os.getcwd(), here))
print("main is module", sys.modules["__main__"] is sys.modules[__name__])
import multiprocessing  # noqa: E402,F401

print("mp_main", sys.modules.get("__mp_main__") is sys.modules["__main__"])
