# parity: fast
# A list given to sys.exit: python prints its str() to stderr, exit code 1.
import sys

sys.exit([1, "two"])
