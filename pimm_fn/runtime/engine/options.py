"""``loop()``'s options beyond the daily arguments, as frozen values: how to resume, watch, spread and train.

``loop()`` takes what a user writes every day (model, optimizer or a dict of
named ones, data, hooks, budget, ``save_dir``, ``resume``, loggers) as
keywords, and the rest as a few values, each read by the part of the runtime
it configures: ``Resuming`` by ``resume.restore``, ``Watching`` by the
console, progress bar, logs and the interpreter's trace, ``Parallel`` by the
DDP wrapper and the agreement guard, ``Training`` by the feed, the step and
the checkpoint's contents. How to save is ``pimm_fn.checkpoint.saving.Saving``.
Each field keeps the name the keyword had when ``loop()`` took it, and is
checked at construction with the same message; the repr is the factory call.
A keyword that moved into one of them, or went, is refused with a
``TypeError`` saying what to pass instead (``pimm_fn.runtime.engine.loop``).

>>> Watching(console=False)
Watching(console=False, progress=None, log_reduce=None, keep_trace=10000, sanity_check=None)
>>> Resuming(resume_hyperparameters="user")
Traceback (most recent call last):
ValueError: loop: 'resume_hyperparameters' must be 'checkpoint' (the checkpoint's optimizer hyper-parameters win) or 'new' (this run's optimizer's win) (got 'user')
"""

import datetime
import signal
from collections.abc import Mapping
from typing import ClassVar

import attrs

from pimm_fn.checkpoint.saving import Saving
from pimm_fn.core import validate as v
from pimm_fn.core.preemption import EX_TEMPFAIL
from pimm_fn.runtime.engine.arguments import ARGUMENTS, check_on_nonfinite, check_resume_hyperparameters
from pimm_fn.runtime.engine.interpreter import KEEP_TRACE
from pimm_fn.runtime.logs.loggers import check_loggers

__all__ = ["Saving", "Resuming", "Watching", "FaultTolerance", "Parallel", "Training", "Preemption", "seconds"]

_BOOL = v.is_bool.with_hint("pass True or False")


def _hyperparameters(instance, attribute, value) -> None:
    check_resume_hyperparameters(value)


def _log_reduce(instance, attribute, value) -> None:
    check_loggers((), value)


def _on_nonfinite(instance, attribute, value) -> None:
    check_on_nonfinite(value, custom_step=False)  # 'skip' with a custom step_fn is loop()'s to refuse


@attrs.frozen
class Resuming:
    """How a resume treats what changed since the checkpoint.

    Attributes:
        strict_resume: refuse a resume that cannot restore the data position.
            Steps per epoch that changed since the checkpoint (another batch
            size) continue the interrupted epoch by samples consumed where
            that is exact, else restart it; ``global_step`` is kept and a
            ``ResumeNotExactWarning`` says which (``pimm_fn.runtime.data.positioning``).
        resume_hyperparameters: whose optimizer hyper-parameters win where this
            run's optimizer (``lr``, ``weight_decay``, ``momentum``, ``betas``...)
            differs from the checkpoint's: ``"checkpoint"`` (default) or
            ``"new"`` (applied after loading the optimizer state). Each
            difference is said either way. A scheduler's state still comes from
            the checkpoint (``pimm_fn.runtime.resume.checks``). An optimizer
            or scheduler of another class is a ``ResumeError`` under
            ``"checkpoint"``; under ``"new"`` it starts fresh, said on the
            console (``pimm_fn.runtime.resume.checks``).
    """

    factory_name: ClassVar[str] = "loop"  # its errors read as loop()'s did: these were loop()'s keywords

    strict_resume: bool = attrs.field(default=False, validator=_BOOL)
    resume_hyperparameters: str = attrs.field(default="checkpoint", validator=_hyperparameters)


@attrs.frozen
class Watching:
    """What a person (or a test) sees of a run: console lines, the progress bar, logged outputs, the trace.

    Attributes:
        console: print progress lines on the main rank.
        progress: a progress bar on the main rank (step/total, it/s, time left,
            the latest loss ``log_every`` read and metrics): ``None`` (default)
            shows it where someone watches (rank 0's stderr is a terminal, or a
            notebook) with ``console`` on; ``True``/``False`` force it. It adds
            no host sync (``pimm_fn.runtime.handlers.progress``); its hook joins
            ``run.hooks``, last, but not ``run.trace``.
        log_reduce: ``"mean"`` logs the training outputs (``train`` and
            ``epoch`` records) averaged over the ranks, with two small all-reduces
            per such record, on the steps that log only (the first checks that
            every rank logged the same step and names: else a
            ``CollectiveDivergenceError`` on every rank); ``None`` (default) logs
            rank 0's. With several ranks each record says which in its ``over``
            field (``"rank 0"`` or ``"mean of 4 ranks"``).
        keep_trace: how many executed effects ``run.trace`` keeps, the newest
            (default 10 000, so a long run's memory stays flat); ``None`` keeps
            every one. An entry logged every step (``log_every(1)``: the
            step's ``AfterStep`` and its ``Log``) holds about 0.75 KB: the
            default's 10 000 hold ~7.5 MB once full, and no more after.
        sanity_check: evaluators run once when ``loop()`` builds the run,
            before the first step (as Lightning's ``num_sanity_val_steps=2``).
            ``None`` (default): each ``loader_evaluator`` on its first 2
            batches per rank (an ``fn(model)`` evaluator cannot be shortened,
            so it is left to its first evaluation); ``n`` > 0: every
            evaluator, a ``loader_evaluator`` on its first ``n`` batches, an
            ``fn(model)`` one as it is; ``0``: off. What they return is
            checked (a metric some hook reads that none publishes, such as
            ``best_on("acc")`` beside ``"val/acc"``, is a ``ValueError`` in
            seconds, not at the first evaluation) and then dropped: no best,
            no log; the model, the training's RNG streams and its data are as
            they were (``pimm_fn.runtime.evaluation.sanity``).
    """

    factory_name: ClassVar[str] = "loop"

    console: bool = attrs.field(default=True, validator=_BOOL)
    progress: bool | None = attrs.field(
        default=None,
        validator=v.optional(v.is_bool.with_hint("pass None (a bar where someone watches), True or False")),
    )
    log_reduce: str | None = attrs.field(default=None, validator=_log_reduce)
    keep_trace: int | None = attrs.field(default=KEEP_TRACE, validator=ARGUMENTS["keep_trace"])
    sanity_check: int | None = attrs.field(
        default=None,
        validator=v.optional(
            v.int_at_least(0).with_hint(
                "pass the number of batches each loader_evaluator runs before the first step, 0 (off), or None "
                "(2 batches of each loader_evaluator)"
            )
        ),
    )


_SECONDS = v.number(above=0).with_hint("pass seconds")


_ADDRESS = v.optional(
    v.instance_of(str, expected="an address").with_hint(
        "pass the lighthouse's address ('http://host:29510'), or None to read TORCHFT_LIGHTHOUSE"
    )
)


@attrs.frozen
class FaultTolerance:
    """The run as replica groups that go on when one fails, a failed one rejoining from a live peer (torchft).

    Each replica group is one process, or one ``torchrun`` group whose
    ranks train the model in DDP (``Parallel(ddp=True)``), every group with
    as many ranks; every group runs the same script with its own
    ``replica_group``. At each
    step's start the groups alive form a quorum through torchft's
    lighthouse (a group that rejoins takes a live peer's whole state there:
    ``pimm_fn.runtime.replicas.heal``); once a step's gradients are
    complete they are averaged over the participants (before a
    ``GradScaler`` unscales them, so every group skips an overflowing step
    alike), and the optimizers step only when every participant voted to
    commit. A step whose vote fails is discarded: the hooks never see
    it, and it is drawn again after the next quorum. Each checkpoint and
    best-weights file is written by one group, the quorum's participating
    rank 0. Needs ``pip install 'pimm_fn[ft]'`` (torchft).

    The groups share ``save_dir``: start each with ``resume="auto"`` (a
    group restarted resumes from the last checkpoint, then heals from a
    live peer); each holds a lock of its own there and logs to
    ``save_dir/replica-<group>/log.jsonl``. The contract: not bit-identical
    to a run without failures, but every live group equals every other
    after every committed step (the model's floating buffers, such as batch
    norm's running statistics, are averaged with the gradients), and a
    healed group equals its source. The training data are dealt: each step's participants take
    the next batches of the epoch's one order from a shared cursor, so each
    sample of an epoch is trained once whoever is alive; they must be a
    ``DataLoader`` over a map-style dataset with a ``SequentialSampler`` or
    a ``DistributedSampler`` (``pimm_fn.runtime.data.dealing``). With a
    built-in step the groups agree on each loss before the update: one that
    is not finite on one group skips the step on every group (its batches
    consumed, as without replicas) under ``Training(on_nonfinite="skip")``,
    and raises ``NonFiniteLossError`` on every group, before any optimizer
    steps, under ``"raise"``. A dict of named optimizers votes once a step,
    at its first ``optimizer.step()``: run every backward of the step before it. Not
    taken: a sharded model (FSDP2), and a ``GradScaler`` with a custom
    ``step_fn`` (``pimm_fn.runtime.replicas.commit``).

    Attributes:
        min_replicas: the fewest replica groups a step commits with (>= 1).
            With fewer, the run waits, saying so, up to ``quorum_timeout``.
        lighthouse: the torchft lighthouse's address; ``None`` (default)
            reads ``TORCHFT_LIGHTHOUSE``.
        replica_group: this group's id, the same on each of its ranks;
            ``None`` (default) reads ``REPLICA_GROUP_ID``.
        quorum_timeout: seconds to wait for ``min_replicas`` groups before a
            ``pimm_fn.ReplicaError`` (default 60).
        timeout: seconds after which a collective with a hung peer gives up
            (its step discarded, the others go on without it; default 30).
        connect_timeout: seconds to reach the lighthouse at the start before
            a ``pimm_fn.ReplicaError`` (default 10).
    """

    factory_name: ClassVar[str] = "FaultTolerance"

    min_replicas: int = attrs.field(default=1, validator=v.int_at_least(1))
    lighthouse: str | None = attrs.field(default=None, validator=_ADDRESS)
    replica_group: str | None = attrs.field(
        default=None,
        validator=v.optional(
            v.instance_of(str, expected="a str").with_hint("pass this group's id, or None to read REPLICA_GROUP_ID")
        ),
    )
    quorum_timeout: float = attrs.field(default=60.0, validator=_SECONDS)
    timeout: float = attrs.field(default=30.0, validator=_SECONDS)
    connect_timeout: float = attrs.field(default=10.0, validator=_SECONDS)


@attrs.frozen
class Parallel:
    """How the run spreads over the ranks of a process group.

    Attributes:
        ddp: wrap ``model`` in ``DistributedDataParallel`` when a process group
            is initialized (a no-op without one, or when it is already wrapped);
            the wrapper is ``run.ctx.model``. A sharded model (FSDP2,
            ``fully_shard``) is passed as it is, without ``ddp``
            (``pimm_fn.checkpoint.formats.sharded``).
        check_agreement: compare collective effects across ranks before running
            them, raising ``CollectiveDivergenceError`` on every rank instead of
            hanging (default ``None``: on whenever a process group is
            initialized; ``False`` turns it off). Before the first step it
            compares each hook's identity and arguments and the schedule; then
            only the collective effects of hooks not declared
            ``rank_consistent`` (the built-ins are), with one small asynchronous
            all-reduce where such a hook is called (``benchmarks/guard.py``).
            Under ``fault_tolerant`` the replica groups are compared too, at
            each step's vote: their hooks, schedule and the collective effects
            they folded, a ``CollectiveDivergenceError`` naming the groups
            that differ (``pimm_fn.runtime.replicas.agreement``).
        fault_tolerant: a ``FaultTolerance``: the run as replica groups that
            go on when one fails (torchft); ``None`` (default): a failed rank
            stops every rank (``PeerFailureError``).
    """

    factory_name: ClassVar[str] = "loop"

    ddp: bool = attrs.field(default=False, validator=_BOOL)
    check_agreement: bool | None = attrs.field(default=None, validator=ARGUMENTS["check_agreement"])
    fault_tolerant: FaultTolerance | None = attrs.field(
        default=None,
        validator=v.optional(
            v.instance_of(FaultTolerance, expected="a pimm_fn.FaultTolerance").with_hint(
                "pass fault_tolerant=pimm_fn.FaultTolerance(min_replicas=...)"
            )
        ),
    )


@attrs.frozen
class Training:
    """What trains beside the model and optimizer, what a non-finite loss does, and how long an epoch is.

    Attributes:
        on_nonfinite: ``"raise"`` (default; ``NonFiniteLossError`` naming the
            global step), ``"skip"`` (the default step leaves the batch out of
            the update; each occurrence warns; refused with a custom
            ``step_fn``) or ``"warn"`` (``pimm_fn.runtime.step.nonfinite``).
        scaler: a ``GradScaler`` stepped by the default step and checkpointed.
            With ``None``, a ``TrainStep(precision="fp16")`` makes its own.
        extra_state: ``{name: obj}`` of objects with ``state_dict()`` and
            ``load_state_dict()`` checkpointed with the run and restored exactly
            (rank 0's is written). The ``ema()`` hooks' averages join it.
        config: the initial ``State.config`` (a pimm config, for ``compat``).
        iters_per_epoch: steps per epoch (default ``len(train_data)``, or
            ``len(train_data) // k`` for a step accumulating ``k`` batches).
        exact_retry: ``run()`` after an exception continues exactly (the
            default): before each forward the torch RNG is kept (and before
            each fetch of a loader without workers, whose dataset may draw
            from it, and before each effect), and ``optimizer.step()`` is watched to tell where a
            train step raised. ``False`` saves that per-step work (a few
            microseconds a step), for scripts that never continue
            in-process: then a step that raised trains its batch again from
            the RNG as it is, one that raised after its optimizer step is
            applied twice, a fetch that raised gives the same samples
            with augmentations drawn from the RNG as it is, and an effect
            that raised runs again from the RNG as it is
            (``ResumeNotExactWarning`` says so). Resuming from a checkpoint
            stays exact either way.
    """

    factory_name: ClassVar[str] = "loop"

    on_nonfinite: str = attrs.field(default="raise", validator=_on_nonfinite)
    scaler: object = attrs.field(default=None, validator=ARGUMENTS["scaler"])
    extra_state: Mapping | None = attrs.field(
        default=None,
        validator=v.optional(
            v.instance_of(Mapping, expected="a dict of {name: object with state_dict() and load_state_dict()}")
        ),
    )
    config: Mapping | None = attrs.field(default=None, validator=ARGUMENTS["config"])
    iters_per_epoch: int | None = attrs.field(default=None, validator=ARGUMENTS["iters_per_epoch"])
    exact_retry: bool = attrs.field(default=True, validator=v.instance_of(bool, expected="True or False"))


def seconds(value, name: str, *, owner: str = "loop") -> float:
    """``value`` (seconds, or a ``datetime.timedelta``) as float seconds >= 0, refused with the fix otherwise.

    >>> seconds(datetime.timedelta(minutes=2), "max_time")
    120.0
    >>> seconds(-1, "max_time")
    Traceback (most recent call last):
    ValueError: loop: 'max_time' must be seconds >= 0 or a datetime.timedelta (got -1)
    """
    if isinstance(value, datetime.timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0 or value == float("inf"):
        raise ValueError(f"{owner}: '{name}' must be seconds >= 0 or a datetime.timedelta (got {value!r:.80})")
    return float(value)


def _signals(value) -> tuple:
    """Signal numbers or names (``signal.SIGUSR1``, ``"SIGUSR1"``), as a tuple of names; SIGINT has its own option."""
    values = (value,) if isinstance(value, (str, int)) else tuple(value)
    found = []
    for one in values:
        try:
            sig = signal.Signals[one] if isinstance(one, str) else signal.Signals(one)
        except (KeyError, ValueError):
            raise ValueError(
                f"loop: Preemption 'signals' holds {one!r}, not a signal: pass e.g. signal.SIGTERM or 'SIGUSR1'"
            ) from None
        if sig == signal.SIGINT:
            raise ValueError(
                "loop: Preemption 'signals' holds SIGINT: Ctrl-C keeps its own handling; pass "
                "save_on_interrupt=True to save before a script exits on it"
            )
        if sig in (signal.SIGKILL, signal.SIGSTOP):
            raise ValueError(f"loop: Preemption 'signals' holds {sig.name}, which no process can catch")
        found.append(sig.name)
    return tuple(dict.fromkeys(found))


def _margin(value) -> float:
    return seconds(value, "margin")


@attrs.frozen
class Preemption:
    """How a run stops when its cluster asks it to, or its time is up (``pimm_fn.runtime.engine.preemption``).

    A signal in ``signals`` (or ``loop(max_time=...)`` running out) is held
    to the next step boundary; there every rank agrees on one step, saves a
    normal, resumable checkpoint of it (its marker says ``saved_for``), says
    one line and raises ``pimm_fn.Preempted``, a ``SystemExit`` with
    ``exit_code``: a script ends with that code and no traceback.

    Attributes:
        signals: the signals that ask for a save and a stop (default
            ``SIGTERM``, what Kubernetes, torchrun's agent and Slurm send
            first; add ``"SIGUSR1"`` for Slurm's ``--signal=USR1@90``).
            ``()`` leaves every signal alone.
        exit_code: the process's exit code after such a save (default 75,
            ``EX_TEMPFAIL``: "try again"; a batch script requeues on it, a
            Kubernetes ``podFailurePolicy`` can ignore it).
        save_on_interrupt: in a script (not a notebook or the REPL), a
            Ctrl-C saves the same way before the script exits (a second
            Ctrl-C stops at once); by default a script's Ctrl-C exits with
            where the last checkpoint is and how to continue.
        margin: for ``max_time``: the time (seconds or a ``timedelta``) left
            before the limit for the last save; the run stops at the last
            step boundary that leaves it.
        check_every: with several ranks, how many steps apart the ranks
            compare their requests and rank 0's clock (one small
            asynchronous all-reduce on a gloo group, read at the next
            comparison; a request is honoured within two comparisons).
            ``None`` (default): rank 0 picks the cadence from its step time,
            about one comparison a second, and sends it with each one.
    """

    factory_name: ClassVar[str] = "loop"

    signals: tuple = attrs.field(default=("SIGTERM",), converter=_signals)
    exit_code: int = attrs.field(default=EX_TEMPFAIL, validator=v.int_at_least(0))
    save_on_interrupt: bool = attrs.field(default=False, validator=_BOOL)
    margin: float = attrs.field(default=0.0, converter=_margin)
    check_every: int | None = attrs.field(default=None, validator=v.optional(v.int_at_least(1)))
