# parity: fast
# The OS keeps the low 8 bits: sys.exit(256) is exit status 0.
import sys

sys.exit(256)
