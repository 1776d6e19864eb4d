# parity: fast
# sys.exit inside a handler.
import atexit
import sys


def other():
    print("other handler still runs")


def leave():
    print("handler calls sys.exit(5)")
    sys.exit(5)


atexit.register(other)
atexit.register(leave)
print("main: done")
