# parity: fast
# A Python signal handler still works while the exit handlers run.
import atexit
import os
import signal


def on_term(signum, frame):
    print("handler: got", signal.Signals(signum).name)


signal.signal(signal.SIGTERM, on_term)
atexit.register(print, "last handler")
atexit.register(os.kill, os.getpid(), signal.SIGTERM)
print("main: done")
