# parity: fast
# A relative import in the script itself fails: it has no parent package.
from . import helper  # noqa: F401
