# parity: fast
# An exception raised from another, three frames deep: the traceback python prints, line for line.
import atexit

atexit.register(print, "atexit after the traceback")


def parse(text):
    return int(text)


def load(text):
    try:
        return parse(text)
    except ValueError as exc:
        raise RuntimeError("could not load the config") from exc


load("x")
