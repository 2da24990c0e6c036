"""`python -m nodeagent`: the same entry point as the `nodeagent` console script.

The stop signals are taken first, before anything else is imported: until nodeagent.cli's
handler is in place a SIGINT or SIGTERM is only noted, and the command then acts on it as on
one that came while it parsed its flags (no KeyboardInterrupt traceback, the documented exit
code). What is left is the interpreter's own start, before this line (docs/troubleshooting.md).
"""

import signal

noted: list[int] = []  # the stop signals that came before nodeagent.cli's handler


def _note(signum: int, _frame: object) -> None:
    noted.append(signum)


signal.signal(signal.SIGINT, _note)
signal.signal(signal.SIGTERM, _note)

from nodeagent.cli import main  # noqa: E402  (after the handler, on purpose)

raise SystemExit(main(noted=noted))
