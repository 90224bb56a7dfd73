"""The progress bar of a run, on the main rank: the handler side of ``pimm_fn.hooks.progress``.

One bar for the whole run, as tqdm draws it::

    epoch 2:  40%|████      | 120/300 [00:03<00:04, 35.1it/s, loss=0.38, score=0.404]

the global step out of the run's last, it/s and the time left, and beside
them the latest value of each output read (``log_every``'s cadence) and of
each metric published. A step only moves a counter: tqdm redraws at most
ten times a second. In a notebook with ``ipywidgets`` the bar is a widget,
else text on stderr. While it is shown the run's console lines are written
above it (``tqdm.write``), so they never break it.

It is on by default where someone watches: a terminal (stderr is a TTY) or
a notebook kernel, with ``console`` on; ``loop(watching=Watching(progress=False))`` turns it
off and ``progress=True`` on. Rank 0 decides for every rank, since the
bar's hook must be in every rank's hook list alike.
"""

import sys

__all__ = ["ProgressBar", "show_progress", "wanted", "watched"]


def _in_notebook() -> bool:
    get_ipython = getattr(sys.modules.get("IPython"), "get_ipython", None)
    shell = get_ipython() if get_ipython is not None else None
    return type(shell).__name__ == "ZMQInteractiveShell"


def watched() -> bool:
    """Whether someone watches this process's output: stderr is a terminal, or this is a notebook kernel."""
    isatty = getattr(sys.stderr, "isatty", None)
    return _in_notebook() or bool(isatty is not None and isatty())


def wanted(progress: bool | None, console: bool) -> bool:
    """Whether this process would show the bar: ``progress`` when given, else ``console`` and someone watching.

    Raises:
        TypeError: ``progress`` is not ``None``, ``True`` or ``False``.
    """
    if progress is not None and not isinstance(progress, bool):
        raise TypeError(
            f"loop: 'progress' must be None (a bar where someone watches), True or False (got {progress!r})"
        )
    return progress if progress is not None else bool(console) and watched()


def _tqdm():
    """tqdm's notebook widget in a notebook that has ipywidgets, else its text bar."""
    if _in_notebook():
        try:
            import ipywidgets  # noqa: F401
            from tqdm.notebook import tqdm
            return tqdm
        except ImportError:
            pass
    from tqdm.std import tqdm
    return tqdm


def _short(value):
    return f"{value:.4g}" if isinstance(value, float) else value


class ProgressBar:
    """The run's bar: opened at the first ``ShowProgress``, closed with the run's writers, opened again after."""

    def __init__(self):
        self._bar = None
        self._values: dict = {}
        self._epoch = None

    @property
    def showing(self) -> bool:
        return self._bar is not None

    def show(self, effect, progress) -> None:
        """Move to ``effect.step``, with ``effect.values`` the latest beside the bar."""
        bar = self._bar if self._bar is not None else self._open(progress)
        if effect.values:
            self._values.update(effect.values)
            bar.set_postfix({k: _short(v) for k, v in self._values.items()}, refresh=False)
        if progress.epoch != self._epoch:
            self._epoch = progress.epoch
            bar.set_description_str(f"epoch {progress.epoch}", refresh=False)
        bar.update(effect.step - bar.n)  # tqdm redraws when its interval has passed

    def _open(self, progress):
        self._epoch = None
        self._bar = _tqdm()(total=progress.global_step + progress.steps_left, initial=progress.global_step,
                            dynamic_ncols=True, leave=True)
        return self._bar

    def write(self, line: str) -> None:
        """``line`` on stdout, above the bar."""
        self._bar.write(line, file=sys.stdout)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def show_progress(effect, state, ctx) -> tuple:
    """The ``ShowProgress`` handler: the run's bar moves (a no-op where none is shown)."""
    if ctx.bar is not None:
        ctx.bar.show(effect, state.progress)
    return ()
