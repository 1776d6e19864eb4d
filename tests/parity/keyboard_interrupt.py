# parity: fast
# An uncaught KeyboardInterrupt: python prints the traceback, runs the handlers, then kills itself with
# SIGINT (what a shell sees after Ctrl-C).
import atexit

atexit.register(print, "atexit runs before the SIGINT")


def train():
    raise KeyboardInterrupt


train()
