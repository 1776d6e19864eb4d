# parity: fast
# The crashing object hangs off another module (json): only the interpreter's module teardown frees it.
import ctypes
import json


class Native:
    def __del__(self):
        ctypes.string_at(0)


json._held = Native()
print("main: done")
