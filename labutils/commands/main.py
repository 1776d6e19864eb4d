"""``python -m labutils COMMAND``: doctor, preflight, diagnose, tour, run, cheatsheet, class-sheet (argparse
subcommands).

Each command keeps its own parser; this one picks the command and hands it the rest of the command line
untouched, so ``COMMAND --help`` shows that command's options and ``diagnose`` passes everything after SCRIPT
to the script.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Optional, Sequence

COMMANDS = {
    "tour": "every scenario, broken then fixed, as a table",
    "run": "one scenario (run SCENARIO), broken then fixed, with the full evidence",
    "diagnose": "run a training script or notebook isolated and name the cause of its crash",
    "doctor": "check this machine for multi-process data loading",
    "preflight": "an attendee's check (about a minute): the doctor, one real run per failure family, a kernel, "
                 "and which notebooks this machine can show",
    "cheatsheet": "print the error text -> cause -> fix table (Markdown) from the cause catalogue; --handout: "
                  "the one-page version",
    "class-sheet": "merge the learners' exported lab sheets: confusion table, most missed, numbers, challenges",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m labutils", description="DataLoader Crash Lab command line.",
                                     epilog="`python -m labutils COMMAND --help` shows the options of a command.")
    # the commands, for the help only: each command's own parser reads the rest of its command line
    sub = parser.add_subparsers(metavar="COMMAND", title="commands")
    for name, text in COMMANDS.items():
        sub.add_parser(name, help=text)
    return parser


#: each command's module (relative to this package) and its function, imported only when it runs
_MAINS = {"doctor": ("..machine.doctor", "doctor_main"), "diagnose": (".diagnose", "diagnose_main"),
          "preflight": (".preflight", "preflight_main"), "cheatsheet": (".cheatsheet", "cheatsheet_main"),
          "class-sheet": (".class_sheet", "class_sheet_main"), "tour": (".tour", "tour_main"),
          "run": (".tour", "run_main")}


def _dispatch(command: str, rest: list) -> int:
    module, name = _MAINS[command]
    return getattr(importlib.import_module(module, __package__), name)(rest)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if not args:
        parser.print_help(sys.stderr)
        return 2
    if args[0] in ("-h", "--help", "help"):
        parser.print_help()
        return 0
    if args[0] not in COMMANDS:
        print(f"labutils: unknown command {args[0]!r}; commands: {', '.join(COMMANDS)}", file=sys.stderr)
        parser.print_usage(sys.stderr)
        return 2
    return _dispatch(args[0], args[1:])
