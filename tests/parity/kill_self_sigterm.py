# parity: fast
# The main code is killed by a signal: no handler, no atexit, exit status -15.
import atexit
import os
import signal

atexit.register(print, "never")
print("about to die", flush=True)
os.kill(os.getpid(), signal.SIGTERM)
