# parity: fast intended=preloaded
# A warning raised by a destructor at shutdown, and an unclosed file's ResourceWarning (shown by the filter).
# With torch imported, python's teardown prints no ResourceWarning: a warm run has torch from its template.
import warnings

warnings.simplefilter("always")


class Checkpoint:
    def __del__(self):
        warnings.warn("checkpoint was never saved", RuntimeWarning, stacklevel=1)


ckpt = Checkpoint()
handle = open(__file__)  # noqa: SIM115 - left open on purpose
print("main: done")
