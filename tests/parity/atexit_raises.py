# parity: fast
# A handler that raises: python prints "Exception ignored in atexit callback" and still exits 0; the
# handlers registered before it still run.
import atexit


def first():
    print("first registered, runs last")


def boom():
    raise ValueError("the handler failed")


atexit.register(first)
atexit.register(boom)
print("main: done")
