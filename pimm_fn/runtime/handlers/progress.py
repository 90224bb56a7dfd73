"""The progress bar of a run, on the main rank: the handler side of ``pimm_fn.hooks.progress``.

One bar, counting the epoch its label names, as Lightning's and Ignite's
bars do, drawn by tqdm::

    epoch 2:  40%|████      | 120/300 [00:03<00:04, 35.1it/s, loss=0.38, score=0.404]

the steps done in epoch 2 (counting from 0, as ``Progress.epoch`` and the
log lines do) out of its length (shorter where ``max_steps`` ends it), it/s
and the epoch's time left, and beside them the latest value of each output
read (``log_every``'s cadence) and of each metric published. A new epoch
starts the count again. A step only moves a counter: tqdm redraws at most
ten times a second. In a notebook with ``ipywidgets`` the bar is a widget
in the cell that runs: a later cell's ``run()`` sets the earlier cell's
bar aside (drawn where it stopped, not as failed) and shows its own. In a
notebook without ``ipywidgets`` the bar is text on stdout, the stream of
the run's console lines; in a terminal it is text on stderr. While it is
shown the console lines are written above it (``tqdm.write``), so they
never break it.

It is on by default where someone watches: a terminal (stderr is a TTY) or
a notebook kernel, with ``console`` on; ``loop(watching=Watching(progress=False))`` turns it
off and ``progress=True`` on. Rank 0 decides for every rank, since the
bar's hook must be in every rank's hook list alike.
"""

import functools
import sys

__all__ = ["ProgressBar", "show_progress", "wanted", "watched"]


def _notebook_shell():
    """The notebook kernel's IPython shell; ``None`` outside a notebook."""
    get_ipython = getattr(sys.modules.get("IPython"), "get_ipython", None)
    shell = get_ipython() if get_ipython is not None else None
    return shell if type(shell).__name__ == "ZMQInteractiveShell" else None


def _in_notebook() -> bool:
    return _notebook_shell() is not None


def _cell():
    """Which notebook cell runs now (its execution count); ``None`` outside a notebook."""
    return getattr(_notebook_shell(), "execution_count", None)


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
    """tqdm's notebook widget in a notebook that has ipywidgets, else its text bar (on stdout in a notebook)."""
    from tqdm.std import tqdm as text

    if not _in_notebook():
        return text
    try:
        import ipywidgets  # noqa: F401
        from tqdm.notebook import tqdm

        return tqdm
    except ImportError:
        return functools.partial(text, file=sys.stdout)  # one stream with the console lines, as they are printed


def _short(value):
    return f"{value:.4g}" if isinstance(value, float) else value


class ProgressBar:
    """The run's bar: opened at the first ``ShowProgress``, closed with the run's writers, opened again after."""

    def __init__(self):
        self._bar = None
        self._values: dict = {}
        self._epoch = None
        self._cell = None  # the notebook cell the bar is shown in

    @property
    def showing(self) -> bool:
        return self._bar is not None

    def show(self, effect, progress) -> None:
        """Move to ``effect.step``, with ``effect.values`` the latest beside the bar."""
        if self._bar is not None and self._cell != _cell():  # a later notebook cell runs: a bar of its own
            self._set_aside()
        start = progress.global_step - progress.iter_in_epoch  # the global step the epoch started after
        bar = self._bar if self._bar is not None else self._open(progress, start)
        if effect.values:
            self._values.update(effect.values)
            # By name: the same order whichever hook read a value first (outputs are read only where asked for).
            bar.set_postfix({k: _short(v) for k, v in sorted(self._values.items())}, refresh=False)
        if progress.epoch != self._epoch:  # a new epoch: its own count, from 0 (reset redraws: the label first)
            self._epoch = progress.epoch
            bar.set_description_str(f"epoch {progress.epoch}", refresh=False)
            bar.reset(total=progress.epoch_end_step - start)
        bar.update(effect.step - start - bar.n)  # tqdm redraws when its interval has passed
        if bar.n == bar.total:
            bar.refresh()  # the epoch's end is drawn, whatever the interval, before the next epoch's count

    def _open(self, progress, start: int):
        self._epoch, self._cell = progress.epoch, _cell()
        self._bar = _tqdm()(
            total=progress.epoch_end_step - start,
            initial=progress.iter_in_epoch,
            desc=f"epoch {progress.epoch}",
            dynamic_ncols=True,
            leave=True,
        )
        return self._bar

    def write(self, line: str) -> None:
        """``line`` on stdout, above the bar."""
        self._bar.write(line, file=sys.stdout)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def _set_aside(self) -> None:
        """Close the bar an earlier cell shows: its run paused there, it did not fail, so it is not painted red."""
        bar = self._bar
        self.close()
        container = getattr(bar, "container", None)  # tqdm.notebook's widget: it paints an unfinished bar 'danger'
        if container is not None:
            container.children[1].bar_style = ""


def show_progress(effect, state, ctx) -> tuple:
    """The ``ShowProgress`` handler: the run's bar moves (a no-op where none is shown)."""
    if ctx.bar is not None:
        ctx.bar.show(effect, state.progress)
    return ()
