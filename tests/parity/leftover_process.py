# parity: fast intended=leftover
# A grandchild left running in its own session: python leaves it; the lab kills it when the run ends.
import os
import time

if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        time.sleep(30)
        os._exit(0)
    os._exit(0)
time.sleep(0.2)
print("main: done")
