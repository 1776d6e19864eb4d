"""``python -m labutils class-sheet FILES...``: the learners' exports of the lab merged, in one screen
(:mod:`labutils.lab.classsheet`). Exit status 0 when at least one file was read, 1 when none was, 2 for bad
options.
"""

from __future__ import annotations

import argparse
import glob
import sys
from typing import Optional, Sequence

from ..lab.classsheet import merge

__all__ = ["class_sheet_main"]


def class_sheet_main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m labutils class-sheet",
                     description="Merge the learners' exported Class sheets (CSV or JSON) into one screen.")
    parser.add_argument("files", nargs="+", metavar="FILE",
                        help="exported sheets (lab_answers_NAME.csv or .json); a quoted pattern such as "
                             "'sheets/*.csv' is expanded")
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    paths = []
    for name in args.files:
        found = sorted(glob.glob(name)) if any(ch in name for ch in "*?[") else [name]
        paths += found or [name]
    report = merge(paths)
    print(report.text())
    if not report.files:
        print("class-sheet: no lab export among the files given: each learner exports hers from the lab's "
              "Class tab (Export the sheet)", file=sys.stderr)
        return 1
    return 0
