"""Progress bars: tqdm on a terminal, plain lines with no control codes in a log."""

from __future__ import annotations

import io
import re

from lmablate.core import progress as P


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_plain_lines_drop_escape_codes_and_turn_each_refresh_into_a_line():
    out = io.StringIO()
    P.PlainLines(out).write("\r  a: 10%|#\x1b[A\r  a: 20%|##\n\x1b[2K\n")
    assert out.getvalue() == "  a: 10%|#\n  a: 20%|##\n"


def test_a_log_gets_no_line_for_a_short_step():
    out = io.StringIO()
    for _ in P.progress(range(50), desc="trial 3", stream=out):
        pass
    assert out.getvalue() == ""  # shorter than LOG_INTERVAL: the stage summary says it


def test_a_log_gets_plain_progress_lines_with_rate_and_eta_for_a_long_step(monkeypatch):
    monkeypatch.setattr(P, "LOG_INTERVAL", 0.0)  # every step is "long" and refreshes
    out = io.StringIO()
    for _ in P.progress(range(5, 20), desc="seed 0", total=20, initial=5, stream=out):
        pass
    text = out.getvalue()
    assert "\r" not in text and "\x1b" not in text
    lines = text.splitlines()
    assert len(lines) >= 2 and all(line.startswith("seed 0:") for line in lines)
    assert "20/20" in lines[-1]  # it ends with a line saying it finished
    assert re.search(r"<\d\d:\d\d", lines[1]) and "it/s" in lines[-1]  # ETA and rate


def test_in_a_log_no_bar_is_redrawn_between_its_scheduled_lines():
    bar = P.progress(range(3), desc="seed 1", stream=io.StringIO())
    assert bar.mininterval == bar.maxinterval == bar.delay == P.LOG_INTERVAL and bar.leave
    bar.close()


def test_in_a_log_tqdms_monitor_has_no_stale_count_to_redraw(monkeypatch):
    """tqdm's monitor thread refreshes a bar whose miniters is above 1 once maxinterval has
    passed, printing ``bar.n``, which iteration updates only when it prints itself. A log bar
    keeps miniters at 1: the monitor leaves it alone, and every line it prints is current."""
    monkeypatch.setattr(P, "LOG_INTERVAL", 0.0)
    out = io.StringIO()
    bar = P.progress(range(40), desc="seed 2", stream=out)
    it = iter(bar)
    for _ in range(25):
        next(it)
    assert bar.miniters == 1 and not bar.dynamic_miniters  # the monitor's condition is false
    counts = [int(m) for m in re.findall(r"\| *(\d+)/40", out.getvalue())]
    assert counts == sorted(counts) and counts[-1] >= 24  # in order, up to date
    bar.close()


def test_on_a_terminal_the_bar_refreshes_often_and_is_erased_when_done():
    term = Terminal()
    bar = P.progress(range(3), desc="trial 1", stream=term)
    assert bar.mininterval == P.TERMINAL_INTERVAL <= 0.5 and not bar.leave
    list(bar)
    assert "\r" in term.getvalue()  # a live bar, redrawn in place


def test_a_progress_note_is_a_plain_line_in_a_log_and_starts_a_clean_line_on_a_terminal():
    log = io.StringIO()
    P.note("tune arithmetic/rope: 4 of 16 trials done", log)
    assert log.getvalue() == "tune arithmetic/rope: 4 of 16 trials done\n"
    term = Terminal()
    P.note("tune arithmetic/rope: 4 of 16 trials done", term)
    # through tqdm.write, which clears and redraws any bar around it
    assert term.getvalue() == "tune arithmetic/rope: 4 of 16 trials done\n"


def test_on_a_terminal_a_bar_erased_below_another_leaves_the_cursor_at_a_line_start():
    """Two threads' bars: erasing the lower one moves down, blanks and moves back up; without a
    carriage return after it, the next line printed starts at the blanked width and wraps."""
    term = Terminal()
    upper = P.progress(range(3), desc="trial 1", total=3, stream=term)
    lower = P.progress(range(3), desc="trial 2", total=3, stream=term)
    assert (upper.pos, lower.pos) == (0, 1)
    list(lower)  # run to its end: closed and erased
    assert term.getvalue().endswith("\r")
    upper.close()
