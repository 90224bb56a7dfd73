"""The fault-tolerant switch: one replica group of a run that goes on when another fails (``FaultTolerance``).

``loop()`` makes a ``Replicas`` for ``Parallel(fault_tolerant=...)`` (the
feed then deals each step's batches: ``Feed.deal``) and connects it once
the run is built. The walker asks it before each step's ``BeforeStep``
(``at_boundary``: every step walked, no quiet stretch): the quorum of the
groups alive (torchft's ``Manager.start_quorum``), where a rejoining group
takes a live peer's whole state (``pimm_fn.runtime.replicas.transport``)
and a group asked for its state sends it; then the epoch's length for the
participants (``sized``; before a ``BeforeEpoch`` too), as
``pimm_fn.core.membership`` and the simulator have it. Fewer than
``min_replicas`` groups: it waits, saying so, up to ``quorum_timeout``. Each
step votes once (``vote``): its gradients averaged over the participants,
then the commit (``pimm_fn.runtime.replicas.commit``); a built-in step
votes after its backward, a custom one at its first ``optimizer.step()``,
a step that updated nothing in ``took``. With a built-in step the groups
agree whether each loss is finite before the update (``finite_everywhere``),
so every group skips, warns or raises alike (``on_nonfinite``). The driver
asks ``took`` after the train step (the dealer's cursor moves past the
step), and a failed vote discards the step (``discard``: the model's
buffers as they were at the boundary, the same positions dealt again; the
walker's state back at the boundary, so the step's ``BeforeStep`` is
folded again).
Exactly one group writes each checkpoint and best-weights file: the
quorum's participating rank 0 (``writes``).
"""

import threading
import time

import torch

from pimm_fn import dist
from pimm_fn.checkpoint import storage
from pimm_fn.core import events as ev
from pimm_fn.core.membership import resized
from pimm_fn.core.state import State
from pimm_fn.runtime.errors import ReplicaError
from pimm_fn.runtime.replicas import agreement, commit, manager

__all__ = ["Replicas", "Watch", "check", "lock_name", "log_dir"]

_TELL_AFTER_S = 2.0  # a quorum not formed by then is said on the console
_RETRY_S = 0.2  # between two quorums while fewer than min_replicas groups take part
_MAX_DISCARDS = 10  # steps discarded in a row before the run stops: the failure is not a peer lost


def check(option, *, sharded: bool, scaler: bool, custom_step: bool) -> None:
    """Refuse ``FaultTolerance`` where it cannot run, before anything is built (torchft missing: the extra named)."""
    manager.require()
    manager.group_id(option)
    manager.lighthouse(option)
    if sharded:
        raise ValueError(
            "loop: Parallel(fault_tolerant=...) does not take a sharded model (FSDP2; its heal is not built yet)"
        )
    if scaler and custom_step:
        raise ValueError(
            "loop: Parallel(fault_tolerant=...) takes a GradScaler with a built-in step only (the default one, or "
            "pimm_fn.TrainStep(precision='fp16')): the scaler checks the gradients for inf and NaN before "
            "optimizer.step(), and a custom step_fn gives the replica groups no point between its backward and "
            "that check to average them, so the groups would skip different steps. Use "
            "step_fn=pimm_fn.TrainStep(precision='fp16'), or train without the scaler"
        )


def log_dir(save_dir, option):
    """Where one replica group logs (``log.jsonl``): ``save_dir/replica-<group>``; the groups share ``save_dir``."""
    if save_dir is None or storage.is_store(save_dir):
        return save_dir  # no log file on a store
    return save_dir / f"replica-{manager.group_id(option)}"


def lock_name(group: str) -> str:
    """The ``save_dir`` lock of one replica group: the groups share ``save_dir``, each holds its own lock."""
    return f"pimm_fn.replica-{group}.lock"


class Replicas:
    """This replica group's part in a fault-tolerant run.

    Args:
        option: the ``FaultTolerance``.
        say: the run's console line (``Context.say``).
        feed: the run's ``Feed``, dealt from now on (``Feed.deal``).
        agree: compare what the groups fold at each vote (``pimm_fn.runtime.replicas.agreement``).

    Attributes:
        group: this group's id.
        writes: this group writes the checkpoints and best weights (participating rank 0 of the last quorum).
        participants: the groups in the last quorum.
        ranks: the ranks of this group (its ``torchrun`` world; 1 for a single process), each drawing a share.
        healed: what the last heal brought here (``heal.Healed``), or ``None``.
        agreement: what this group folded, compared with the others at each vote (``None``: not compared).
    """

    def __init__(self, option, say, feed, *, agree=True):
        manager.require()
        self.option, self.say = option, say
        self.dealer = feed.deal(self.membership)  # each participant's batch dealt from one cursor
        self.group = manager.group_id(option)
        self.address = manager.lighthouse(option)
        self.manager = self.transport = self._store = None
        self._hooks: list = []
        self.writes, self.participants, self.healed = True, 0, None
        self.ranks, self._rank = dist.world_size(), dist.rank()
        self._voted: bool | None = None  # this step's vote, once cast
        self._seen: dict[int, torch.Tensor] = {}  # the gradients it averaged, by id (held, so the ids stay theirs)
        self._optimizers: list = []
        self._discards = 0  # steps discarded in a row
        self._buffers: list[torch.Tensor] = []
        self._model_buffers: list[torch.Tensor] = []
        self._averaged: list[torch.Tensor] = []
        self._watch: Watch | None = None  # says so when a quorum is slow to form
        self.agreement = agreement.Agreement(self.group) if agree else None

    def connect(self, run) -> None:
        """Join the lighthouse with ``run`` (a ``Loop``) at its global step; its steps vote from now on.

        Raises:
            ReplicaError: the lighthouse cannot be reached within ``connect_timeout``.
        """
        self.manager, self.transport, self._store = manager.build(self.option, step=run.state.progress.global_step)
        self.transport.run = run
        ctx = run.ctx
        self._optimizers = list(ctx.named_optimizers().values())
        self._hooks = [o.register_step_pre_hook(self._before_step) for o in self._optimizers]
        if ctx.nonfinite is not None and ctx.nonfinite.before_update:  # every group skips, warns or raises alike
            ctx.nonfinite.across = self.finite_everywhere
        self._model_buffers = list(ctx.model.buffers())
        self._averaged = [b for b in self._model_buffers if b.is_floating_point()]  # averaged with the gradients

    def at_boundary(self) -> bool:
        """The quorum at a step's boundary, a heal in it; True when this replica was healed (its state replaced).

        Raises:
            ReplicaError: no quorum, or fewer than ``min_replicas`` groups, within ``quorum_timeout``.
            HealError: this replica cannot take its peer's state (its run is built otherwise).
        """
        option, ft = self.option, self.manager
        since = time.monotonic()
        told = was_healed = False
        while True:
            self._quorum()
            self.transport.receive_pending()  # a heal the quorum asked for (in a torchrun group, its rank 0's)
            self._heal_failed()
            healed, self.transport.healed = self.transport.healed, None
            if healed is not None:
                self.healed, was_healed = healed, True
                if self.agreement is not None:
                    self.agreement.healed()
            self._send()
            self.participants = ft.num_participants()
            if self.participants >= option.min_replicas:
                break
            if not told:
                self.say(
                    f"waiting for {option.min_replicas} replica groups (min_replicas), {self.participants} in the "
                    f"quorum; up to {option.quorum_timeout:g} s (quorum_timeout)"
                )
                told = True
            if time.monotonic() - since > option.quorum_timeout:
                raise ReplicaError(
                    f"only {self.participants} of min_replicas={option.min_replicas} replica groups joined within "
                    f"quorum_timeout={option.quorum_timeout:g} s: start the others (REPLICA_GROUP_ID) or lower "
                    f"min_replicas"
                )
            time.sleep(_RETRY_S)
        self.writes = ft.participating_rank() == 0
        self._voted, self._seen = None, {}  # a step cut short before took() left its vote behind
        self._buffers = [b.detach().clone() for b in self._model_buffers]
        if self.agreement is not None:  # in flight through the step, read after its vote (``took``)
            self.agreement.start(ft, self.transport.group, self.transport.run)
        return was_healed

    def membership(self) -> tuple[int, int]:
        """``(participant, participants)`` of the last quorum: which share of the step this rank draws.

        Each rank of each participating group draws one: rank ``r`` of the
        group at participating rank ``p`` is participant ``p * ranks + r``.
        """
        rank = self.manager.participating_rank() if self.manager is not None else None
        if rank is None:
            raise ReplicaError("this replica group draws a batch outside a quorum (it takes part in none)")
        return rank * self.ranks + self._rank, self.participants * self.ranks

    def sized(self, state: State, event) -> State:
        """``state`` with its epoch as long as the participants of the last quorum make it, before ``event``.

        Before an epoch (``BeforeEpoch``): its steps for them from position 0;
        before a step: the steps done and those left from the dealer's cursor
        (``pimm_fn.core.membership.resized``). Before the first quorum the
        length stays.
        """
        cls = event.__class__
        if not self.participants or (cls is not ev.BeforeStep and cls is not ev.BeforeEpoch):
            return state
        dealer, epoch = self.dealer, cls is ev.BeforeEpoch
        return resized(
            state,
            0 if epoch else dealer.cursor,
            self.participants * self.ranks,
            length=dealer.length,
            batch_size=dealer.batch_size,
            drop_last=dealer.drop_last,
            done=0 if epoch else None,
        )

    def _quorum(self) -> None:
        option = self.option
        if self._watch is None:
            self._watch = Watch(
                self.say,
                f"waiting for the quorum of the replica groups at {self.address} (min_replicas={option.min_replicas}, "
                f"up to {option.quorum_timeout:g} s)",
            )
        self._watch.begin()
        try:
            self.manager.start_quorum()
        except TimeoutError as exc:
            raise ReplicaError(
                f"no quorum of min_replicas={option.min_replicas} replica groups at {self.address} within "
                f"quorum_timeout={option.quorum_timeout:g} s ({str(exc)[:120]}): start the other groups, or check "
                f"the lighthouse's min_replicas"
            ) from None
        finally:
            self._watch.end()

    def _heal_failed(self) -> None:
        """A heal cut on the way changed nothing here: this step fails its vote, and the next quorum heals again."""
        failed, self.transport.failed = self.transport.failed, None
        if failed is None:
            return
        ft = self.manager
        self.say(f"the heal from a peer failed ({type(failed).__name__}: {str(failed)[:200]}); healing again")
        step = self.transport.run.state.progress.global_step
        ft.load_state_dict({"step": step, "batches_committed": ft.batches_committed()})  # behind: healed next time
        ft.report_error(failed)

    def _send(self) -> None:
        """Send this run's state to the replicas the quorum asked for; a failure there is theirs: this run goes on."""
        try:
            self.transport.send_pending()
        except Exception as exc:  # noqa: BLE001 - a receiver that refused or died: its step fails, not this one
            self.say(f"could not heal a peer ({type(exc).__name__}: {str(exc)[:200]}); going on")
            self.manager.report_error(exc)

    def vote(self) -> bool:
        """This step's vote, cast once: its gradients averaged over the participants, then the commit.

        The built-in steps call it after their backward, before the scaler or
        the optimizer reads a gradient; a custom step at its first
        ``optimizer.step()``; ``took`` for a step that called neither. False:
        the gradients were dropped, and the step must update nothing.
        """
        if self._voted is None:
            self._voted, grads = commit.vote(self.manager, self._optimizers, self._averaged)
            self._seen = {id(g): g for g in grads}
        return self._voted

    def finite_everywhere(self, finite: bool) -> bool:
        """Whether the step's loss is finite on every participant (``NonFinite.finite``, read before the update)."""
        return not commit.anywhere(self.manager, not finite)

    def _before_step(self, optimizer, args, kwargs) -> None:
        """Each optimizer's step pre-hook: the step's vote, cast here by a custom step; refused after a new backward.

        Raises:
            ReplicaError: the optimizer holds a gradient the vote did not
                average (a backward after an earlier optimizer step of the
                same train step): the groups would step it apart.
        """
        if self._voted is None:
            self.vote()
            return
        seen = self._seen
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None and id(p.grad) not in seen:
                    raise ReplicaError(
                        f"{type(optimizer).__name__}.step() got gradients computed after this train step's vote: "
                        f"under FaultTolerance a step's gradients are averaged over the replica groups once, at its "
                        f"first optimizer.step(). Run every backward of the step first (each loss), then step the "
                        f"optimizers"
                    )

    def took(self, step: int) -> bool:
        """Whether ``step``, trained, was committed by every participant: its vote, cast now if the step cast none.

        Raises:
            CollectiveDivergenceError: the groups folded otherwise up to this committed step.
        """
        voted = self.vote()  # a step that updated nothing (its batch skipped) votes here: every step votes once
        self._voted, self._seen = None, {}
        if voted:
            self._discards = 0
            self.dealer.commit()  # the cursor past the whole step's positions
        if self.agreement is not None:
            self.agreement.judge(self.manager, self.transport.group, step, voted)
        return voted

    def discard(self, step: int) -> None:
        """A step whose vote failed: the model's buffers back to the boundary, said on the console.

        Raises:
            ReplicaError: the ``_MAX_DISCARDS``-th step discarded in a row, naming the manager's last error.
        """
        for buffer, kept in zip(self._model_buffers, self._buffers, strict=True):
            buffer.copy_(kept)
        self.dealer.discard()  # the same positions dealt again
        self._discards += 1
        error = self.manager.errored()
        cause = f" ({str(error.original_exception)[:200]})" if error is not None else ""
        if self._discards >= _MAX_DISCARDS:
            raise ReplicaError(
                f"step {step} was not committed {self._discards} times in a row{cause}: not a replica group lost, "
                f"which costs one step; see torchft's lines above for the cause"
            )
        self.say(
            f"step {step} was not committed by every replica group{cause}: discarded, drawn again after a new quorum"
        )

    def close(self) -> None:
        """Leave the quorum: the manager shut down, the optimizers' vote and the loss agreement removed."""
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        nonfinite = self.transport.run.ctx.nonfinite if self.transport is not None else None
        if nonfinite is not None and nonfinite.across == self.finite_everywhere:
            nonfinite.across = None
        if self.manager is not None:
            self.manager.shutdown(wait=False)
            self.manager = None
        if self._watch is not None:
            self._watch.close()
            self._watch = None


class Watch:
    """Says ``message`` once a wait between ``begin()`` and ``end()`` lasts ``after`` seconds: one thread for all waits.

    A ``threading.Timer`` a wait would start a thread each step (about 0.2 ms);
    this one thread sleeps until a wait begins, and a wait costs a lock.
    """

    def __init__(self, say, message: str, after: float = _TELL_AFTER_S):
        self._say, self._message, self._after = say, message, after
        self._cond = threading.Condition()
        self._since: float | None = None  # when the wait being watched began
        self._closed = False
        threading.Thread(target=self._run, name="pimm_fn-quorum-watch", daemon=True).start()

    def begin(self) -> None:
        with self._cond:
            self._since = time.monotonic()
            self._cond.notify()

    def end(self) -> None:
        with self._cond:
            self._since = None

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._since is None and not self._closed:
                    self._cond.wait()
                since = self._since
                if self._closed:
                    return
                if since is None:
                    continue
                left = since + self._after - time.monotonic()
                if left > 0:
                    self._cond.wait(left)
                    continue
                self._since = None  # said once a wait
            self._say(self._message)
