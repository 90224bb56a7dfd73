"""``simulate``'s arguments, checked and made into what each simulated rank is fed.

Metrics (``metric_source``), step outputs (``outputs_of``), the steps to
resume at (``resume_points``; one a stopped run never reaches: ``past_the_end``)
and each process's preemption boundaries (``stops_of``): every one refused
with an error naming the argument.
"""

from collections.abc import Callable, Iterable, Mapping

from pimm_fn.core.preemption import Boundaries
from pimm_fn.core.validate import int_at_least

__all__ = ["check_count", "metric_source", "outputs_of", "resume_points", "past_the_end", "stops_of", "hook_list"]


def check_count(name, value, minimum):
    """``value`` is an int >= ``minimum``, else an error naming ``simulate``'s argument ``name``."""
    int_at_least(minimum).check(value, name, owner="simulate")


def metric_source(metrics) -> Callable:
    """``metrics`` as ``source(step, rank) -> values or None``, what the executor answers ``Evaluate`` with."""
    if metrics is None:
        return lambda step, rank: None
    if isinstance(metrics, Mapping):
        for step, values in metrics.items():
            if not isinstance(step, int) or not isinstance(values, Mapping):
                raise TypeError(
                    f"simulate: 'metrics' as a mapping must be {{step: {{name: value}}}} "
                    f"(got {step!r}: {values!r:.80})"
                )
        return lambda step, rank: metrics.get(step)
    if callable(metrics):
        def checked(step, rank):
            values = metrics(step, rank)
            if values is not None and not isinstance(values, Mapping):
                raise TypeError(
                    f"simulate: metrics({step}, {rank}) must return a mapping of metric names to numbers "
                    f"or None (got {values!r:.80})"
                )
            return values

        return checked
    raise TypeError(
        f"simulate: 'metrics' must be None, a mapping {{step: {{name: value}}}} or a callable "
        f"metrics(step, rank) (got {metrics!r:.80})"
    )


def outputs_of(local, rank) -> Callable | None:
    """``rank``'s step outputs, ``outputs(step) -> mapping``, from ``local(step, rank)``; ``None`` without ``local``."""
    if local is None:
        return None
    if not callable(local):
        raise TypeError(f"simulate: 'local' must be a callable local(step, rank) -> mapping (got {local!r:.80})")

    def outputs(step):
        values = local(step, rank)
        if values.__class__ is dict:  # the common case, checked first: this runs every step
            return values
        if values is None:
            return {}
        if not isinstance(values, Mapping):
            raise TypeError(
                f"simulate: local({step}, {rank}) must return a mapping of step outputs or None (got {values!r:.80})"
            )
        return values

    return outputs


def resume_points(resume_at, max_steps: int) -> tuple:
    """``resume_at`` (None, an int, or increasing ints) as a validated tuple."""
    if resume_at is None:
        return ()
    points = (resume_at,) if isinstance(resume_at, int) and not isinstance(resume_at, bool) else tuple(resume_at)
    for k in points:
        if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= max_steps:
            raise ValueError(
                f"simulate: 'resume_at' must hold steps in [1, {max_steps}] (the run's steps; got {resume_at!r})"
            )
    if any(a >= b for a, b in zip(points, points[1:])):
        raise ValueError(f"simulate: 'resume_at' must be strictly increasing (got {resume_at!r})")
    return points


def past_the_end(k: int, ended) -> str:
    """What to say of ``resume_at=k`` in a run that a hook stopped at an earlier step, ending in state ``ended``."""
    step = ended.progress.global_step
    return (
        f"simulate: resume_at holds step {k}, but the run ended at step {step} before reaching it: a hook stopped "
        f"it ({ended.stop}). Resume at steps up to {step} (assert_resume_continuity leaves out the steps after "
        f"the run's end itself)"
    )


def stops_of(preempt, world_size, every, clock, max_time, margin, points):
    """A maker of each process's ``Boundaries`` (the first process gets the signals), or ``None`` without any."""
    if every is not None:
        check_count("check_every", every, 1)
    elif clock is None:
        raise TypeError("simulate: check_every=None (rank 0 picks the cadence from its clock) needs a 'clock'")
    if max_time is not None and clock is None:
        raise TypeError("simulate: 'max_time' needs a 'clock' (clock(step) -> rank 0's seconds since training began)")
    requests = dict(preempt or {})
    for rank, step in requests.items():
        if not (isinstance(rank, int) and 0 <= rank < world_size and isinstance(step, int) and step >= 1):
            raise ValueError(f"simulate: 'preempt' must map ranks in [0, {world_size}) to steps >= 1 "
                             f"(got {rank!r}: {step!r})")
    if not requests and max_time is None and clock is None:
        return None
    if points:
        raise ValueError("simulate: pass either 'resume_at' or 'preempt'/'clock'/'max_time', not both")
    def stops(first: bool) -> Boundaries:
        """The first process of a rank gets the signals; a resumed one only its clock and budget."""
        return Boundaries(requests if first else {}, world_size=world_size, every=every, max_time=max_time,
                          margin=margin)

    return stops


def hook_list(hooks) -> list:
    """``hooks`` as a list, refused when it is a single hook or not a list."""
    if callable(hooks) or not isinstance(hooks, Iterable):
        raise TypeError(f"simulate: 'hooks' must be a list of hooks (got {hooks!r:.80}); wrap a single hook: [hook]")
    return list(hooks)
