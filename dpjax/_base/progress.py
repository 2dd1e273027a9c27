"""Progress on long calls, where the user is: a terminal, a notebook, or a log file.

dpjax's long calls (calibration of large groups, Monte Carlo with many samples, correlation
optimisation, sweeps) report progress on ``sys.stderr``, never on stdout (so ``--json`` output
stays one JSON object).  What is drawn depends on where stderr goes:

* **a terminal or a Jupyter notebook**: a bar redrawn in place.  It is tqdm's
  (:mod:`tqdm`, the optional ``progress`` extra: ``pip install "dpjax[progress]"``; in a
  notebook with ipywidgets its widget bar) when tqdm is installed, else a built-in bar of the
  same form;
* **anything else** (a pipe, a CI log, a file): one plain line every :data:`LOG_INTERVAL`
  seconds (``DPJAX_PROGRESS_INTERVAL`` overrides it) and a last line at the end, no ``\\r``
  redraws; calls shorter than the interval write nothing.

A long call's meter appears only after :func:`long_call_delay` seconds (``DPJAX_PROGRESS_DELAY``
overrides the default of one second; ``0`` shows every meter at once).

Switches, strongest first: the call's own argument (``progress=False`` / ``True``; ``None``,
the default everywhere, means "auto"), then :func:`set_progress` (the CLI's ``--quiet`` sets it
off for its run), then the environment variable ``DPJAX_PROGRESS`` (``0`` off, ``1`` on).

The meter is pluggable: ``set_progress(backend=factory)`` routes every bar to
``factory(total=..., desc=..., unit=..., initial=..., delay=...)``, any object with
``update(n)``, ``set_postfix(dict, refresh=...)`` and ``close()`` -- tqdm's classes qualify,
e.g. ``set_progress(backend=tqdm.rich.tqdm)``; ``backend="builtin"`` never uses tqdm.

Usage::

    from dpjax._base.progress import progress

    with progress(total=300, desc="optimize") as bar:
        for step in range(300):
            ...
            bar.update(1, rmse=f"{rmse:.4f}", sigma=f"{sigma:.4f}")

All progress state of the process (the switch, the backend, and the bar that compiled Monte
Carlo loops report to from their host callbacks, :func:`tick`) is the one :data:`_STATE`.
"""

from __future__ import annotations

import dataclasses
import io
import os
import sys
import threading
import time
from typing import Any

#: Seconds a long call runs before its bar appears (calls that turn out fast leave no trace).
LONG_CALL_DELAY = 1.0

#: Seconds between two lines where stderr is not a terminal (a log); ``DPJAX_PROGRESS_INTERVAL``.
LOG_INTERVAL = 10.0

_OFF = ("0", "", "false", "False", "off", "no")

#: The meters' clock (a module name so that tests can drive it without touching ``time``).
_clock = time.perf_counter


@dataclasses.dataclass
class _ProgressState:
    enabled: bool | None = None  # set_progress: None = auto
    backend: Any = "auto"  # "auto", "builtin" or a factory
    active: Any = None  # the bar Monte Carlo host callbacks tick (see ``tick``)


_STATE = _ProgressState()
_LOCK = threading.Lock()
_UNSET = object()


def set_progress(enabled: bool | None = _UNSET, *, backend: Any = _UNSET) -> None:  # type: ignore[assignment]
    """Switch progress on (``True``), off (``False``) or back to auto (``None``) for the whole
    process, and/or choose the meter: ``"auto"`` (tqdm when installed, else the built-in bar),
    ``"builtin"``, or a factory (see the module docstring)."""
    if enabled is not _UNSET:
        _STATE.enabled = enabled
    if backend is not _UNSET:
        if not (backend in ("auto", "builtin") or callable(backend)):
            raise ValueError(f"backend must be 'auto', 'builtin' or a callable, got {backend!r}")
        _STATE.backend = backend


def get_progress() -> tuple[bool | None, Any]:
    """``(enabled, backend)`` as set by :func:`set_progress` (to restore them later)."""
    return _STATE.enabled, _STATE.backend


def in_notebook() -> bool:
    """Whether this process is a Jupyter kernel (its stderr shows in the notebook)."""
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return False
    try:
        shell = ipython.get_ipython()
    except Exception:  # noqa: BLE001 - an IPython without a shell
        return False
    if shell is None:
        return False
    return type(shell).__name__ == "ZMQInteractiveShell" or "IPKernelApp" in getattr(shell, "config", {})


def _isatty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def _interactive(stream) -> bool:
    """A bar redrawn in place makes sense on ``stream``: a terminal, or a notebook's stderr."""
    return _isatty(stream) or (stream is sys.stderr and in_notebook())


def progress_enabled(enabled: bool | None = None, stream=None) -> bool:
    """Whether a meter asked for with ``enabled`` shows anything (see the module docstring)."""
    if enabled is not None:
        return bool(enabled)
    if _STATE.enabled is not None:
        return bool(_STATE.enabled)
    env = os.environ.get("DPJAX_PROGRESS")
    if env is not None and env.strip() in _OFF:
        return False
    return True  # a terminal or notebook gets a bar, anything else lines in a log


def long_call_delay() -> float:
    """Seconds a long call runs before its meter appears: ``DPJAX_PROGRESS_DELAY``, else
    :data:`LONG_CALL_DELAY`."""
    try:
        return max(0.0, float(os.environ.get("DPJAX_PROGRESS_DELAY", LONG_CALL_DELAY)))
    except ValueError:
        return LONG_CALL_DELAY


def _log_interval() -> float:
    try:
        return max(0.0, float(os.environ.get("DPJAX_PROGRESS_INTERVAL", LOG_INTERVAL)))
    except ValueError:
        return LOG_INTERVAL


def _fmt_seconds(s: float) -> str:
    s = max(0.0, s)
    if s < 60:
        return f"{s:4.1f}s"
    m, s = divmod(int(s), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


def _width(stream) -> dict:
    """tqdm's size options for ``stream``: follow the terminal's size, or 100 columns and 20 rows
    where the terminal reports none (a pseudo-terminal whose size was never set reports 0 x 0,
    and tqdm then draws nothing)."""
    try:
        size = os.get_terminal_size(stream.fileno())
    except (AttributeError, ValueError, OSError, io.UnsupportedOperation):
        return {}
    return {"dynamic_ncols": True} if size.columns > 0 and size.lines > 0 else {"ncols": 100, "nrows": 20}


def _tqdm_class(stream):
    """tqdm's class for ``stream`` (its widget bar in a notebook with ipywidgets, its text bar
    otherwise), or None when tqdm is not installed."""
    try:
        from tqdm import std
    except ImportError:
        return None
    if stream is sys.stderr and in_notebook():
        try:
            import ipywidgets  # noqa: F401  (tqdm.notebook needs it; without it the text bar)
            from tqdm.notebook import tqdm as notebook_tqdm

            return notebook_tqdm
        except ImportError:
            pass
    return std.tqdm


class Progress:
    """One progress meter (see the module docstring).  ``total`` may be ``None`` (unknown
    length: a counter, no ETA).  ``stream`` defaults to ``sys.stderr``; ``delay``: show nothing
    until the call has run this long.  ``warmup``: the first ``warmup`` units (a step that
    compiles its program) do not count toward the rate, so the ETA is the remaining units at the
    rate of those after them (a 70 s compile before 0.2 s steps put 1:36:53 on an 82 s run)."""

    def __init__(self, total: int | None = None, desc: str = "", *, enabled: bool | None = None,
                 stream=None, initial: int = 0, min_interval: float = 0.1, unit: str = "it",
                 delay: float = 0.0, warmup: int = 0, external: bool = True):
        self.stream = sys.stderr if stream is None else stream
        self.enabled = progress_enabled(enabled, self.stream)
        self.total = total
        self.desc = desc
        self.unit = unit
        self.n = int(initial)
        self._initial = int(initial)
        self._warmup_end = int(initial) + max(0, int(warmup))  # the rate counts from here
        self._rate_start = None  # clock and count where the rate starts (None: from the start)
        self._rate_initial = int(initial)
        self.postfix: dict = {}
        self._start = _clock()
        self._last_draw = 0.0
        self._min_interval = min_interval
        self._width = 0
        self._closed = False
        self._delay = float(delay)
        self._drawn = False
        self._drawn_n = -1
        self._external = None  # a tqdm (or user-supplied) meter doing the drawing
        self._log = False  # plain lines, no redraws
        if not self.enabled:
            return
        backend = _STATE.backend if external else "builtin"
        if callable(backend):
            self._external = backend(total=total, desc=desc, unit=unit, initial=self.n, delay=self._delay)
        elif _interactive(self.stream):
            cls = _tqdm_class(self.stream) if backend == "auto" else None
            if cls is not None:
                self._external = cls(total=total, desc=desc, unit=unit, initial=self.n, delay=self._delay,
                                     file=self.stream, mininterval=min_interval, **_width(self.stream))
            elif self._delay <= 0:
                self._draw(force=True)
        else:
            self._log = True
            self._min_interval = _log_interval()
            self._delay = max(self._delay, self._min_interval)

    @property
    def live(self) -> bool:
        """Whether the meter is drawn in place (a terminal, a notebook, a custom backend), not as
        lines in a log."""
        return self.enabled and not self._log

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def set_postfix(self, **postfix) -> None:
        self.postfix.update(postfix)
        if self._external is not None:
            self._external.set_postfix(self.postfix, refresh=False)
        elif self.enabled:
            self._draw()

    def update(self, n: int = 1, **postfix) -> None:
        """Advance by ``n`` units; ``postfix`` items (e.g. ``rmse=...``) are shown after the bar."""
        before = self.n
        self.n += n
        self.postfix.update(postfix)
        if self._external is not None:
            if postfix:
                self._external.set_postfix(self.postfix, refresh=False)
            self._external.update(n)
        if before < self._warmup_end <= self.n:
            self._start_rate()
        if self._external is None and self.enabled:
            self._draw()

    def _start_rate(self) -> None:
        """From now on the rate (and the ETA) counts only the units still to come."""
        self._rate_start, self._rate_initial = _clock(), self.n
        ext = self._external
        if ext is not None and hasattr(ext, "reset"):
            # tqdm's rate is an average since its start: restart it at the current count (its
            # elapsed time restarts too; the description says what was excluded).
            n = getattr(ext, "n", self.n)
            ext.reset(total=getattr(ext, "total", self.total))
            for name in ("initial", "n", "last_print_n"):
                if hasattr(ext, name):
                    setattr(ext, name, n)
            if hasattr(ext, "refresh"):
                ext.refresh()

    def line(self) -> str:
        elapsed = _clock() - self._start
        parts = [f"{self.desc}: " if self.desc else ""]
        if self.total:
            frac = min(1.0, self.n / self.total)
            filled = int(20 * frac)
            parts.append(f"{100 * frac:3.0f}%|{'#' * filled}{' ' * (20 - filled)}| {self.n}/{self.total}")
            # The rate counts the units after the warm-up (the first ones compile).
            warm = self.n >= self._warmup_end
            since = _clock() - self._rate_start if self._rate_start is not None else elapsed
            done = self.n - (self._rate_initial if self._rate_start is not None else self._initial)
            if warm and done > 0 and self.n < self.total:
                eta = since / done * (self.total - self.n)
                parts.append(f" [{_fmt_seconds(elapsed)}<{_fmt_seconds(eta)}]")
            else:
                parts.append(f" [{_fmt_seconds(elapsed)}]")
        elif self.unit == "s":  # an elapsed-time meter (:func:`elapsed_meter`)
            parts.append(f"{_fmt_seconds(elapsed)} elapsed")
        else:
            parts.append(f"{self.n} {self.unit} [{_fmt_seconds(elapsed)}]")
        if self.postfix:
            parts.append(" " + ", ".join(f"{k}={v}" for k, v in self.postfix.items()))
        return "".join(parts)

    def _draw(self, force: bool = False) -> None:
        now = _clock()
        if now - self._start < self._delay and not (force and self._log and self._drawn):
            return
        if not force and now - self._last_draw < self._min_interval and (
                self._log or self.total is None or self.n < self.total):
            return
        self._last_draw = now
        text = self.line()
        try:
            if self._log:
                self.stream.write(text + "\n")
            else:
                pad = max(0, self._width - len(text))
                self._width = len(text)
                self.stream.write("\r" + text + " " * pad)
            self.stream.flush()
            self._drawn = True
            self._drawn_n = self.n
        except (ValueError, OSError):  # closed stream: progress is best-effort, never an error
            self.enabled = False

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._external is not None:
            self._external.close()
            return
        if not self.enabled:
            return
        if self._log:
            if self._drawn and self._drawn_n != self.n:  # a log that showed the call shows its end
                self._draw(force=True)
            return
        if self._drawn or _clock() - self._start >= self._delay:
            self._draw(force=True)
            try:
                self.stream.write("\n")
                self.stream.flush()
            except (ValueError, OSError):
                pass


def progress(total: int | None = None, desc: str = "", *, enabled: bool | None = None, **kwargs) -> Progress:
    """A :class:`Progress` meter on stderr (auto-enabled; see the module docstring)."""
    return Progress(total, desc, enabled=enabled, **kwargs)


class elapsed_meter:
    """A meter for a call whose length is not known in advance (a certificate's ladder stops at
    the first rung that verifies): the seconds elapsed, redrawn every ``interval`` seconds by a
    background thread, shown once the call has run :func:`long_call_delay` seconds.  A context
    manager::

        with elapsed_meter("certify", enabled=progress):
            cert = certify_noise(...)
    """

    def __init__(self, desc: str, *, enabled: bool | None = None, interval: float = 1.0):
        self.interval = float(interval)
        self.bar = Progress(None, desc, enabled=enabled, unit="s", delay=long_call_delay(), min_interval=0.0,
                            external=False)
        self._stop = threading.Event()
        self._thread = None

    def __enter__(self) -> "elapsed_meter":
        if self.bar.enabled:
            self._thread = threading.Thread(target=self._run, name="dpjax-elapsed-meter", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.bar.update(1)

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.bar.close()


def note(text: str, *, enabled: bool | None = None, stream=None) -> None:
    """One line on ``stream`` (default stderr) where progress shows (the same switches as a
    meter: ``enabled``, :func:`set_progress`, ``DPJAX_PROGRESS``): a stage of a long call
    starting, in a terminal, a notebook and a log alike."""
    stream = sys.stderr if stream is None else stream
    if not progress_enabled(enabled, stream):
        return
    try:
        stream.write(text + "\n")
        stream.flush()
    except (ValueError, OSError):  # a closed stream: progress is best-effort, never an error
        pass


def set_active(bar: Progress | None) -> None:
    """Make ``bar`` the meter that :func:`tick` advances (``None``: none)."""
    with _LOCK:
        _STATE.active = bar


def tick(n: int = 1) -> None:
    """Advance the active meter by ``n`` (called from compiled loops' host callbacks)."""
    bar = _STATE.active
    if bar is not None:
        bar.update(n)


__all__ = ["LOG_INTERVAL", "LONG_CALL_DELAY", "long_call_delay", "Progress", "elapsed_meter", "get_progress",
           "in_notebook", "note", "progress", "progress_enabled", "set_active", "set_progress", "tick"]
