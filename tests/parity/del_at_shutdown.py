# parity: fast
# __del__ of an object held by a global runs at interpreter shutdown, after the atexit handlers.
import atexit


class Resource:
    def __init__(self, name):
        self.name = name

    def __del__(self):
        print(f"__del__ {self.name}")


keep = Resource("global")
atexit.register(print, "atexit handler")
print("main: done")
