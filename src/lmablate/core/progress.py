"""Progress bars for the long steps (training steps, decoding batches): tqdm on a terminal,
plain lines everywhere else.

On a terminal a bar refreshes twice a second (a tuning trial of a few seconds still moves) with
tqdm's rate and ETA, and is erased when done: the stage prints one summary line instead
(:func:`lmablate.cli.main`). When stderr is not a terminal (``dvc repro > log``, CI), tqdm's
carriage returns and cursor-moving escape codes would fill the log with control characters, so
the same bar is written as plain lines through :class:`PlainLines`: none for a step shorter
than :data:`LOG_INTERVAL`, then one line every :data:`LOG_INTERVAL` seconds and one when it ends
(``maxinterval`` and a fixed ``miniters`` of 1 too: tqdm's monitor thread would otherwise
redraw a bar with the count of its last refresh).
"""

from __future__ import annotations

import re
import sys
from typing import Iterable, TextIO

from tqdm.auto import tqdm

TERMINAL_INTERVAL = 0.5  # seconds between refreshes of a bar on a terminal
LOG_INTERVAL = 30.0  # seconds before a step shows up in a log, and between its lines there
_CONTROL = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")  # ANSI CSI sequences (cursor up, clear line)


class PlainLines:
    """A text stream for tqdm that turns its terminal output into plain lines: escape codes
    dropped, each carriage-return refresh a line of its own, blank lines skipped."""

    def __init__(self, stream: TextIO):
        self.stream = stream

    def write(self, text: str) -> int:
        for part in _CONTROL.sub("", text).replace("\r", "\n").split("\n"):
            if part.strip():
                self.stream.write(part.rstrip() + "\n")
        return len(text)

    def flush(self) -> None:
        self.stream.flush()


class _TerminalBar(tqdm):
    """A terminal bar whose close leaves the cursor at the start of a line. tqdm erases a bar
    below the first (another thread's, ``pos`` > 0) by moving down, blanking the line and moving
    back up, which leaves the cursor at the blanked width on the first bar's line: the next
    line printed would start there and wrap after one character."""

    def close(self) -> None:
        below = not self.disable and abs(getattr(self, "pos", 0)) > 0
        super().close()
        if below:
            with self.get_lock():
                self.fp.write("\r")
                self.fp.flush()


def progress(iterable: Iterable, *, desc: str, total: int | None = None, initial: int = 0,
             stream: TextIO | None = None) -> tqdm:
    """``iterable`` wrapped in a tqdm bar named ``desc`` (``total`` items, ``initial`` of them
    done already, e.g. on resume), on ``stream`` (default: stderr), as the module docstring
    describes for a terminal and for anything else."""
    stream = stream or sys.stderr
    if stream.isatty():
        return _TerminalBar(iterable, desc=desc, total=total, initial=initial, file=stream,
                            mininterval=TERMINAL_INTERVAL, leave=False, dynamic_ncols=True)
    # miniters=1: tqdm's monitor thread redraws a bar whose (dynamic) miniters grew above 1
    # once maxinterval passes, with the count of its last print (iteration keeps the count in a
    # local until it prints): a stale line in the log. At 1 the loop checks the clock each step.
    return tqdm(iterable, desc=desc, total=total, initial=initial, file=PlainLines(stream),
                mininterval=LOG_INTERVAL, maxinterval=LOG_INTERVAL, delay=LOG_INTERVAL,
                miniters=1, leave=True, ascii=True, ncols=110)


def note(line: str, stream: TextIO | None = None) -> None:
    """Print one progress line on ``stream`` (default: stderr) above any bars on a terminal
    (``tqdm.write`` keeps them intact), as a plain line anywhere else."""
    stream = stream or sys.stderr
    if stream.isatty():
        tqdm.write(line, file=stream)
    else:
        stream.write(line + "\n")
        stream.flush()
