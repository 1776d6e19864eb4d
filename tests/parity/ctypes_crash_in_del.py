# parity: fast
# A destructor that crashes in C (a NULL read through ctypes) at interpreter exit, after the atexit handlers:
# SIGSEGV, and the handler's line printed first.
import atexit
import ctypes


class Native:
    def __del__(self):
        ctypes.string_at(0)


keep = Native()
atexit.register(print, "atexit handler ran")
print("main: done")
