# parity: fast intended=fatal-stack
# A fatal error with faulthandler on: python prints the C-level crash and the Python stack. The lab's stack
# goes on below the script's frames, into the frames that run it (an intended difference).
import ctypes
import faulthandler

faulthandler.enable()


def crash():
    ctypes.string_at(0)


crash()
