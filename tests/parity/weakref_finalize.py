# parity: fast
# weakref.finalize callbacks of live objects run at exit (atexit=True), one with atexit=False does not.
import weakref


class Model:
    pass


a, b = Model(), Model()
weakref.finalize(a, print, "finalize a at exit")
f = weakref.finalize(b, print, "finalize b: atexit=False, never")
f.atexit = False
print("main: done")
