# parity: fast
# After an uncaught exception, sys.last_value is set and the failed frame's locals stay alive until the
# interpreter's teardown: their destructor runs after the atexit handlers.
import atexit
import sys


class Held:
    def __del__(self):
        print("__del__ of a local of the failed frame")


def report():
    print("atexit sees", type(getattr(sys, "last_value", None)).__name__)


atexit.register(report)


def step():
    local = Held()  # noqa: F841
    raise ValueError("step failed")


step()
