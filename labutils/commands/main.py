"""``python -m labutils COMMAND``: doctor, preflight, diagnose, tour, run, cheatsheet, class-sheet (argparse
subcommands).

Each subcommand keeps its own parser (``doctor_main``, ``preflight_main``, ``diagnose_main``, ``tour_main``,
``run_main``); this one picks the command and hands it the rest of the command line, so ``python -m labutils
COMMAND --help`` shows that command's options and ``diagnose`` can pass everything after SCRIPT to
the script untouched.
"""

from __future__ import annotations

import argparse
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
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    for name, text in COMMANDS.items():
        # add_help=False: the command's own parser answers --help with its own options
        p = sub.add_parser(name, help=text, description=text, add_help=False)
        p.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    return parser


def _dispatch(command: str, rest: list) -> int:
    if command == "doctor":
        from ..machine.doctor import doctor_main

        return doctor_main(rest)
    if command == "diagnose":
        from .diagnose import diagnose_main

        return diagnose_main(rest)
    if command == "preflight":
        from .preflight import preflight_main

        return preflight_main(rest)
    if command == "cheatsheet":
        from .cheatsheet import cheatsheet_main

        return cheatsheet_main(rest)
    if command == "class-sheet":
        from .class_sheet import class_sheet_main

        return class_sheet_main(rest)
    if command == "tour":
        from .tour import tour_main

        return tour_main(rest)
    from .tour import run_main

    return run_main(rest)


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
    try:
        ns = parser.parse_args(args[:1] + ["--", *args[1:]] if len(args) > 1 else args)
    except SystemExit as exc:
        return int(exc.code) if isinstance(exc.code, int) else 2
    rest = list(ns.rest)
    if rest[:1] == ["--"]:
        rest = rest[1:]
    return _dispatch(ns.command, rest)
