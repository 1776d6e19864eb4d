# parity: fast link=run.py
# Run through a symlink: sys.path[0] is the real file's folder (python resolves the link), __file__ the link.
import os
import sys

import neighbour

print("file", os.path.basename(__file__), "path0", os.path.basename(sys.path[0]), neighbour.WHERE)
