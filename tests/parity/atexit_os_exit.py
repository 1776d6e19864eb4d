# parity: fast
# os._exit inside a handler: the process ends there, with that code; later handlers never run.
import atexit
import os


def never():
    print("this never prints")


def leave():
    print("leaving with os._exit(7)", flush=True)
    os._exit(7)


atexit.register(never)
atexit.register(leave)
print("main: done")
