# parity: fast
# weakref.finalize whose callback crashes in C at exit: SIGSEGV after the script's output.
import ctypes
import weakref


class Buffer:
    pass


buf = Buffer()
weakref.finalize(buf, ctypes.string_at, 0)
print("main: done")
