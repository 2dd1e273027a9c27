"""A dependency-free progress bar on stderr for long calls.

dpjax's long calls (calibration of large groups, Monte Carlo with many samples, correlation
optimisation, sweeps) report progress the way tqdm does, without adding a dependency: one line,
redrawn in place with ``\\r``, on ``sys.stderr``.  It is shown only where someone can see it:

* ``enabled=None`` (the default everywhere) means "auto": on when the stream is a TTY and the
  environment variable ``DPJAX_PROGRESS`` is not ``0``, and :func:`set_progress` has not
  switched it off (the CLI's ``--quiet`` and ``--json`` do that);
* ``enabled=True`` / ``False`` forces it (``DPJAX_PROGRESS=1`` forces it on for a non-TTY).

Never written to stdout, so ``--json`` output stays parseable.

Usage::

    from dpjax._progress import progress

    with progress(total=300, desc="optimize") as bar:
        for step in range(300):
            ...
            bar.update(1, rmse=f"{rmse:.4f}", sigma=f"{sigma:.4f}")
"""

from __future__ import annotations

import os
import sys
import time

_GLOBAL_ENABLED: bool | None = None

#: Seconds a long call runs before its bar appears (calls that turn out fast leave no trace).
LONG_CALL_DELAY = 1.0


def set_progress(enabled: bool | None) -> None:
    """Switch progress bars on (``True``), off (``False``) or back to auto (``None``) globally."""
    global _GLOBAL_ENABLED
    _GLOBAL_ENABLED = enabled


def progress_enabled(enabled: bool | None = None, stream=None) -> bool:
    """Whether a bar asked for with ``enabled`` would be drawn on ``stream`` (default stderr)."""
    if enabled is not None:
        return bool(enabled)
    if _GLOBAL_ENABLED is not None:
        return _GLOBAL_ENABLED
    env = os.environ.get("DPJAX_PROGRESS")
    if env is not None:
        return env not in ("0", "", "false", "False")
    stream = sys.stderr if stream is None else stream
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def _fmt_seconds(s: float) -> str:
    s = max(0.0, s)
    if s < 60:
        return f"{s:4.1f}s"
    m, s = divmod(int(s), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


class Progress:
    """One progress line.  ``total`` may be ``None`` (unknown length: a counter, no ETA)."""

    def __init__(self, total: int | None = None, desc: str = "", *, enabled: bool | None = None,
                 stream=None, initial: int = 0, min_interval: float = 0.1, unit: str = "it",
                 delay: float = 0.0):
        self.stream = sys.stderr if stream is None else stream
        self.enabled = progress_enabled(enabled, self.stream)
        self.total = total
        self.desc = desc
        self.unit = unit
        self.n = int(initial)
        self._initial = int(initial)
        self.postfix: dict = {}
        self._start = time.perf_counter()
        self._last_draw = 0.0
        self._min_interval = min_interval
        self._width = 0
        self._closed = False
        # ``delay``: draw nothing until the call has run this long (tqdm's ``delay``), so calls
        # that turn out fast leave no trace on the terminal.
        self._delay = float(delay)
        self._drawn = False
        if self.enabled and self._delay <= 0:
            self._draw(force=True)

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def set_postfix(self, **postfix) -> None:
        self.postfix.update(postfix)
        if self.enabled:
            self._draw()

    def update(self, n: int = 1, **postfix) -> None:
        """Advance by ``n`` units; ``postfix`` items (e.g. ``rmse=...``) are shown after the bar."""
        self.n += n
        self.postfix.update(postfix)
        if self.enabled:
            self._draw()

    def line(self) -> str:
        elapsed = time.perf_counter() - self._start
        parts = [f"{self.desc}: " if self.desc else ""]
        if self.total:
            frac = min(1.0, self.n / self.total)
            filled = int(20 * frac)
            parts.append(f"{100 * frac:3.0f}%|{'#' * filled}{' ' * (20 - filled)}| {self.n}/{self.total}")
            done = self.n - self._initial
            if done > 0 and self.n < self.total:
                eta = elapsed / done * (self.total - self.n)
                parts.append(f" [{_fmt_seconds(elapsed)}<{_fmt_seconds(eta)}]")
            else:
                parts.append(f" [{_fmt_seconds(elapsed)}]")
        else:
            parts.append(f"{self.n} {self.unit} [{_fmt_seconds(elapsed)}]")
        if self.postfix:
            parts.append(" " + ", ".join(f"{k}={v}" for k, v in self.postfix.items()))
        return "".join(parts)

    def _draw(self, force: bool = False) -> None:
        now = time.perf_counter()
        if now - self._start < self._delay:
            return
        if not force and now - self._last_draw < self._min_interval and (self.total is None or self.n < self.total):
            return
        self._last_draw = now
        text = self.line()
        pad = max(0, self._width - len(text))
        self._width = len(text)
        self._drawn = True
        try:
            self.stream.write("\r" + text + " " * pad)
            self.stream.flush()
        except (ValueError, OSError):  # closed stream: progress is best-effort, never an error
            self.enabled = False

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.enabled and (self._drawn or self._delay <= 0 or time.perf_counter() - self._start >= self._delay):
            self._draw(force=True)
            try:
                self.stream.write("\n")
                self.stream.flush()
            except (ValueError, OSError):
                pass


def progress(total: int | None = None, desc: str = "", *, enabled: bool | None = None, **kwargs) -> Progress:
    """A :class:`Progress` bar on stderr (auto-enabled on a TTY; see the module docstring)."""
    return Progress(total, desc, enabled=enabled, **kwargs)
