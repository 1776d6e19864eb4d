# parity: fast
# A signal received while the exit handlers run: the process dies of it.
import atexit
import os
import signal

atexit.register(print, "registered first: never runs")
atexit.register(os.kill, os.getpid(), signal.SIGTERM)
print("main: done")
