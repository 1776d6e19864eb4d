"""``python -m labutils COMMAND``: doctor, diagnose, tour, run."""

from __future__ import annotations

import sys
from typing import Optional, Sequence

USAGE = """usage: python -m labutils COMMAND [options]

commands:
  tour                 every scenario, broken then fixed, as a table
  run SCENARIO         one scenario, broken then fixed, with the full evidence
  diagnose SCRIPT ...  run a training script isolated and name the cause of its crash
  doctor               check this machine for multi-process data loading

`python -m labutils COMMAND --help` shows the options of a command."""


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0 if args else 2
    command, rest = args[0], args[1:]
    if command == "doctor":
        from .doctor import doctor_main

        return doctor_main(rest)
    if command == "diagnose":
        from .diagnose_cli import diagnose_main

        return diagnose_main(rest)
    if command == "tour":
        from .tour import tour_main

        return tour_main(rest)
    if command == "run":
        from .tour import run_main

        return run_main(rest)
    print(f"labutils: unknown command {command!r}\n\n{USAGE}", file=sys.stderr)
    return 2
