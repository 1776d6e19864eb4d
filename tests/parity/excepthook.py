# parity: fast
# A custom sys.excepthook gets the uncaught exception, with the script's frames only.
import sys
import traceback


def hook(kind, value, tb):
    frames = [f"{f.name}:{f.lineno}" for f in traceback.extract_tb(tb)]
    print(f"custom hook: {kind.__name__}: {value} at {frames}", file=sys.stderr)


sys.excepthook = hook


def load():
    raise FileNotFoundError("data.csv")


load()
