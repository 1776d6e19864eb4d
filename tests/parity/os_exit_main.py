# parity: fast
# os._exit in the main code: no atexit handlers, no flush of buffered text, the code given.
import atexit
import os

atexit.register(print, "never")
print("before os._exit", flush=True)
os._exit(4)
