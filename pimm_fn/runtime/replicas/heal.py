"""Healing a replica from a live peer: a running ``Loop``'s whole restorable state, sent over a process group, no pickle.

On the live peer, between two steps (a committed one), ``send_state(run,
dst, group)``; on the rejoining replica, built as the peer's run is (the
same model, optimizers, scheduler, scaler, extra state and hooks),
``receive_state(run, src, group)``. The receiver then holds what a resume
from a checkpoint of that step would give it: the weights, the optimizer,
scheduler and scaler states, the extra state (``ema`` averages), the whole
``State`` (progress, hook slots, best values, metrics; its ``rank`` and
``world_size`` are the receiver's own), the RNG states and the data cursor.
Trained on, it draws the same batches and the same random numbers as its
source, and stays equal to it bit for bit. Not sent: what only describes
the run (``trace``, ``history``, the log files).

What is sent is what a checkpoint holds (``pimm_fn.checkpoint.contents``:
``to_parts`` of the sender's contents, with its own ``State`` as the agreed
one, and the weights beside them), split by ``pimm_fn.checkpoint.formats.pack``
into a JSON skeleton and its tensors. On the wire, each message with the
group's own ``send``/``recv`` (they serve a group made apart from the
default one, as torchft makes its own; ``torch.distributed.recv`` asks the
default group's registry):

1. the header, 4 ``int64``: ``MAGIC``, the format ``VERSION``, the
   document's bytes, the number of tensors (this layout is every version's);
2. the document, UTF-8 JSON as a ``uint8`` tensor: the pack skeleton, each
   tensor's dtype and shape in the skeleton's numbering, the step;
3. the receiver's answer: the document checked against its own run (below),
   or refused with the reason;
4. each tensor, in the skeleton's numbering (empty ones are not sent);
5. the receiver's answer again: restored, or refused after the tensors
   arrived (RNG states that do not restore, an optimizer state that does not
   load), with the reason.

A refusal raises a ``HealError`` on both sides, the sender's naming the
receiver's reason, and changes nothing on the receiver. The receiver
refuses a format version it does not know, a document that does not decode
(not JSON, not a pack skeleton, not the parts of a checkpoint), tensors
that do not fit in what its own run holds (below), and a run that does not
fit its own: other weight names, shapes or dtypes, other optimizer or
scheduler classes (or names), a scaler or extra state on one side only,
other hooks, other training data or steps per epoch. No byte of the peer's
is unpickled: the document is read as JSON, the tensors are received into
buffers of the dtypes and shapes it declares.

The peer's bytes are untrusted input, and a buffer is allocated for each
tensor the document declares; so before any is allocated the tensors are
bounded by what the receiver's own run holds (``Room``): their number and
bytes at most those of its own state (weights, optimizer and extra state,
RNG states), with room for the optimizer state of each parameter its
optimizer holds none for yet (Adam before its first step: up to four
tensors of the parameter's size), for one copy of the model for each
extra state that holds no tensor yet (an ``ema`` before its first update),
and a little more (``_SLACK``: 16 tensors, 1 MB) for the generator states a
data position holds once an epoch began. A peer built as the receiver's run is sends no more; anything beyond is
refused, naming the largest tensor declared. The document itself is bounded
by ``_MAX_DOCUMENT``.

A heal cut on the way (the peer died, or a message waited past the group's
timeout) raises a ``HealCut`` (a ``HealError``) on the side that saw it:
the receiver has loaded nothing, and heals again from a live peer (under
``FaultTolerance`` the next quorum does). Once every tensor arrived and was
restored, the receiver is healed whole: its last answer lost on the way is
said, not raised.

Both sides return what was sent as a ``Healed`` (the document's bytes, the
number and bytes of the tensors, the seconds from the first message to the
receiver's last answer) and say it on the console (``ctx.say``).

Not yet: a sharded model (FSDP2), whose shards would go rank to rank as a
resume on the same world size loads them; tensors on a CUDA device are
copied to the host and sent over gloo (``nccl`` would take them as they are).
"""

import json
import math
import time
from typing import Any

import attrs
import torch

from pimm_fn.checkpoint.contents import TrainerContents, from_parts, saved_state, to_parts
from pimm_fn.checkpoint.formats.pack import pack, skeleton_to_tensor, tensor_to_skeleton, unpack
from pimm_fn.core import untrusted_json
from pimm_fn.core.slots import Keyed
from pimm_fn.core.state import State
from pimm_fn.runtime.data.positioning import changes, describe
from pimm_fn.runtime.engine.interpreter import unwrap
from pimm_fn.runtime.engine.run import Loop
from pimm_fn.runtime.handlers.checkpointing import trainer_contents
from pimm_fn.runtime.resume.checks import recorded, weight_differences
from pimm_fn.runtime.step.rng import restore_rng, rng_problem

__all__ = [
    "MAGIC",
    "VERSION",
    "HealError",
    "HealCut",
    "Healed",
    "Room",
    "send_state",
    "receive_state",
    "header",
    "document",
    "room",
]

MAGIC = 0x70665F6865616C  # "pf_heal": the first int64 of every header
VERSION = 1  # the format of what follows the header; the header's own layout never changes
_MAX_DOCUMENT = 1 << 30  # bytes of JSON a receiver takes: a skeleton of millions of tensors fits
_DTYPES = {str(d).removeprefix("torch."): d for d in vars(torch).values() if isinstance(d, torch.dtype)}
_MAX_ANSWER = 4096  # bytes of a refusal's reason
_MAX_DIMS = 64  # dimensions of a declared tensor
_PER_PARAMETER = 4  # optimizer state tensors a parameter may come with: Adam's moments, AMSGrad's maximum, the step
_SLACK = (16, 1 << 20)  # tensors and bytes beyond: the generator states a data position holds once an epoch began
_TAG = 0


class HealError(RuntimeError):
    """A heal refused: by the receiver (what it found, how to fix it), said on the sender too; nothing was restored."""


class HealCut(HealError):
    """A heal cut on the way: the peer died or hung past the group's timeout; nothing was restored, heal again."""


@attrs.frozen
class Healed:
    """What one heal moved, and how long it took.

    Attributes:
        step: the global step of the state sent.
        peer: the other side's rank in the group.
        json_bytes: bytes of the JSON document (the skeleton and the tensor list).
        tensors: the number of tensors.
        tensor_bytes: their bytes.
        seconds: from the first message to the receiver's last answer, on this side.
    """

    step: int
    peer: int
    json_bytes: int
    tensors: int
    tensor_bytes: int
    seconds: float

    def __str__(self) -> str:
        return (
            f"step {self.step}: {self.json_bytes / 1024:.1f} KB of JSON and {self.tensors} tensors "
            f"({self.tensor_bytes / 2**20:.1f} MB) in {self.seconds:.2f} s"
        )


# -- the live peer --------------------------------------------------------------------------------
def send_state(run: Loop, dst: int, group: torch.distributed.ProcessGroup) -> Healed:
    """Send ``run``'s whole restorable state to rank ``dst`` of ``group``, which calls ``receive_state``.

    Call it between steps. The outputs that wait on the device are read
    into the hooks' slots first and a background save in flight is
    published (``run.run(0)``), as before a checkpoint.

    Raises:
        HealError: the run was interrupted mid-step (complete it with
            ``run.step()`` first), its model is sharded, or the receiver
            refused the state (its reason given).
        HealCut: the receiver died or hung past the group's timeout on the way.
    """
    start = time.perf_counter()
    ctx, state = run.ctx, _between_steps(run, "send")
    if ctx.sharded:
        raise HealError(
            "cannot send the state of a sharded model (FSDP2) to a peer yet: restart the replica from the last "
            "checkpoint (resume='auto'), which loads the shards on any world size"
        )
    skeleton, found = _packed(run)
    tensors = [t.cpu().contiguous() for t in found]
    step = state.progress.global_step
    sent = document(skeleton, tensors, step)
    wire = _Wire(group, dst, sending=True)
    wire.send(header(VERSION, len(sent), len(tensors)), "the header")
    wire.send(sent, "the document")
    _answered(wire, step, "the document")
    for i, tensor in enumerate(tensors):
        if tensor.numel():
            wire.send(tensor, f"tensor {i + 1} of {len(tensors)}")
    _answered(wire, step, "the tensors")
    healed = _healed(step, dst, sent, tensors, start)
    ctx.say(f"sent the state of {healed} to rank {dst}")
    return healed


def _packed(run: Loop) -> tuple[str, list[torch.Tensor]]:
    """``run``'s state as a heal sends it: the pack skeleton and its tensors, in the skeleton's numbering."""
    ctx = run.ctx
    trainer, local = to_parts(trainer_contents(ctx, run.state, agree=False))  # this rank's own State, no collective
    skeleton, found = pack({"weights": ctx.weights(), "trainer": trainer, "local": local})
    return skeleton, [found[str(i)] for i in range(len(found))]


def header(version: int, size: int, count: int) -> torch.Tensor:
    """The first message: ``MAGIC``, the format ``version``, the document's ``size`` in bytes, the tensor ``count``."""
    return torch.tensor([MAGIC, version, size, count], dtype=torch.int64)


def document(skeleton: str, tensors: list[torch.Tensor], step: int) -> torch.Tensor:
    """The second message: the pack ``skeleton``, each tensor's dtype and shape, and the ``step``, as UTF-8 JSON."""
    listed = [[str(t.dtype).removeprefix("torch."), list(t.shape)] for t in tensors]
    return skeleton_to_tensor(json.dumps({"skeleton": skeleton, "tensors": listed, "step": step}))


@attrs.frozen
class Room:
    """How many tensors, of how many bytes, a receiver takes from a peer: what its own run holds, or could.

    Attributes:
        tensors: the most tensors a document may declare.
        bytes: the most bytes they may hold together.
        held: what the run holds itself, said in a refusal.
    """

    tensors: int
    bytes: int
    held: str


def room(run: Loop) -> Room:
    """The tensors ``run`` takes from a peer built as it is (see the module): its own, and the state it may lack.

    >>> import pimm_fn as pf
    >>> model = torch.nn.Linear(4, 2)  # 10 parameters' values in 2 tensors
    >>> run = pf.loop(model, torch.optim.Adam(model.parameters()), [torch.zeros(4)], max_epochs=1,
    ...               step_fn=lambda *a, **k: {}, watching=pf.Watching(console=False, progress=False))
    >>> r = room(run)  # Adam before its first step: 4 tensors of each parameter's size in float32, and 16 more
    >>> r.tensors - len(_packed(run)[1]), r.held.split(";")[0]
    (24, '2 parameters without optimizer state (160 B)')
    """
    ctx = run.ctx
    _, own = _packed(run)
    count, size = len(own), sum(_bytes(t) for t in own)
    lacking = [
        p
        for optimizer in ctx.named_optimizers().values()
        for group in optimizer.param_groups
        for p in group["params"]
        if not optimizer.state.get(p)
    ]
    room_for = sum(_PER_PARAMETER * p.numel() * max(p.element_size(), 4) for p in lacking)
    empty = [name for name, obj in ctx.extra_state.items() if not pack(obj.state_dict())[1]]
    model = list(unwrap(ctx.model).state_dict().values())
    copies = len(empty) * sum(t.numel() * max(t.element_size(), 4) for t in model)
    held = (
        f"{len(lacking)} parameters without optimizer state ({_size(room_for)}); extra state without tensors: "
        f"{empty or 'none'} ({_size(copies)}); {count} tensors of its own ({_size(size)}); {_SLACK[0]} more of "
        f"{_size(_SLACK[1])} for a data position's generators"
    )
    tensors = count + _PER_PARAMETER * len(lacking) + len(empty) * len(model) + _SLACK[0]
    return Room(tensors, size + room_for + copies + _SLACK[1], held)


# -- the rejoining replica ------------------------------------------------------------------------
def receive_state(run: Loop, src: int, group: torch.distributed.ProcessGroup) -> Healed:
    """Take the state rank ``src`` of ``group`` sends (``send_state``) into ``run``, as a resume would.

    ``run`` is built as the peer's run is; its own state is replaced whole.
    Everything that can refuse the state is checked before the tensors are
    sent (their number and bytes against ``room(run)`` before any is
    allocated), and the RNG states once they arrived, before anything is
    loaded.

    Raises:
        HealError: the header is not a pimm_fn heal's (not answered: the
            sender is not ``send_state``); the format version is unknown,
            the document does not decode, declares more than ``run`` holds,
            the peer's run does not fit this one, or what arrived does not
            restore (each answered, so the sender raises too). ``run`` is as
            it was.
        HealCut: the peer died or hung past the group's timeout before its
            last tensor arrived. ``run`` is as it was: heal again.
    """
    start = time.perf_counter()
    ctx = run.ctx
    _between_steps(run, "receive")
    limit = room(run)
    wire = _Wire(group, src, sending=False)
    got = torch.zeros(4, dtype=torch.int64)
    wire.recv(got, "the header")
    magic, version, size, count = got.tolist()
    if magic != MAGIC or not 0 < size <= _MAX_DOCUMENT or count < 0:
        raise HealError(
            f"cannot heal from rank {src}: its first message {got.tolist()} is not the header of a pimm_fn heal: "
            f"call send_state on the peer, over the same group"
        )
    received = torch.empty(size, dtype=torch.uint8)
    wire.recv(received, "the document")
    try:
        step, buffers, payload = _decoded(received, version, count, src, limit)
        held, state = _fitting(run, payload, src, step)
    except HealError as refused:
        _answer(wire, str(refused))
        raise
    _answer(wire, "")
    for i, buffer in enumerate(buffers):
        if buffer.numel():
            wire.recv(buffer, f"tensor {i + 1} of {len(buffers)}")
    try:
        state = _restored(run, payload["weights"], held, state, src, step)  # the buffers, filled in place
    except HealError as refused:
        _answer(wire, str(refused))
        raise
    run.state = state
    healed = _healed(step, src, received, buffers, start)
    try:
        _answer(wire, "")
    except HealCut as cut:  # every byte arrived and is loaded: healed whole, the peer may not know
        ctx.say(f"healed from rank {src}, which did not take the last answer ({str(cut)[:200]})")
    ctx.say(f"healed from rank {src}, the state of {healed}")
    return healed


def _decoded(received: torch.Tensor, version: int, count: int, src: int, limit: Room):
    """``(step, buffers, payload)`` of the document: buffers of the declared dtypes and shapes, unfilled.

    The declared tensors are bounded by ``limit`` before any buffer is
    allocated. The payload is unpacked over the empty buffers, which it
    holds as they are: its structure (the weights' shapes and dtypes, the
    states' JSON) is checked before any tensor is sent, and the tensors
    received into the buffers are then in it.
    """
    if version != VERSION:
        raise HealError(
            f"cannot heal from rank {src}: it sends heal format {version}, this pimm_fn reads format {VERSION}: "
            f"run the same version of pimm_fn on every replica"
        )
    try:
        doc = untrusted_json.loads(tensor_to_skeleton(received))
        step, skeleton, listed = doc["step"], doc["skeleton"], doc["tensors"]
        if (
            not (isinstance(step, int) and isinstance(skeleton, str) and isinstance(listed, list))
            or len(listed) != count
        ):
            raise ValueError(f"{len(listed)} tensors listed, {count} in the header")
        declared = [_declared(entry) for entry in listed]
    except (ValueError, TypeError, KeyError, UnicodeDecodeError, RuntimeError) as exc:  # any damage: not JSON, ...
        raise _undecoded(src, exc) from None
    _bounded(declared, limit, src, step)
    try:
        buffers = [torch.empty(shape, dtype=dtype) for dtype, shape, _ in declared]
        payload = unpack(skeleton, _numbered(buffers))
        if not isinstance(payload, dict) or sorted(payload) != ["local", "trainer", "weights"]:
            raise ValueError("not the parts of a run (weights, trainer, local)")
        if not all(isinstance(v, torch.Tensor) for v in dict(payload["weights"]).values()):
            raise ValueError("weights that are not tensors")
    except (ValueError, TypeError, KeyError, RuntimeError) as exc:
        raise _undecoded(src, exc) from None
    return step, buffers, payload


def _declared(entry) -> tuple[torch.dtype, list[int], int]:
    """``(dtype, shape, bytes)`` of one tensor the document lists as ``[dtype, shape]``; malformed: ``ValueError``."""
    dtype, shape = entry
    if not isinstance(shape, list) or len(shape) > _MAX_DIMS:
        raise ValueError(f"a tensor's shape {shape!r:.80}")
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape):
        raise ValueError(f"a tensor's shape {shape!r:.80}")
    kind = _DTYPES[dtype]
    return kind, shape, math.prod(shape) * kind.itemsize  # Python ints: no overflow, nothing allocated


def _bounded(declared: list, limit: Room, src: int, step: int) -> None:
    """Refuse tensors beyond ``limit``, naming the largest, before any is allocated."""
    total = sum(size for *_, size in declared)
    if len(declared) <= limit.tensors and total <= limit.bytes:
        return
    dtype, shape, size = max(declared, key=lambda d: d[2])
    raise HealError(
        f"cannot heal from rank {src} (step {step}): it declares {len(declared)} tensors of {_size(total)} (the "
        f"largest {str(dtype).removeprefix('torch.')} {shape}, {_size(size)}), more than this run takes from a "
        f"peer built as it is: {limit.tensors} tensors of {_size(limit.bytes)} ({limit.held}). Refused before "
        f"allocating any: build this replica as the peer's run is built, or restart it from the last checkpoint "
        f"(resume='auto')"
    )


def _undecoded(src: int, exc: Exception) -> HealError:
    return HealError(
        f"cannot heal from rank {src}: its state does not decode ({type(exc).__name__}: {str(exc)[:160]}): the "
        f"peer runs another pimm_fn, or the bytes were damaged on the way. Send again, or restart this replica "
        f"from the last checkpoint (resume='auto')"
    )


def _fitting(run: Loop, payload: dict, src: int, step: int) -> tuple[TrainerContents, State]:
    """The peer's parts and its ``State`` for this run's hooks, when its run is built as this one.

    Raises:
        HealError: naming each difference.
    """
    ctx = run.ctx
    try:
        held = from_parts(payload["trainer"], payload["local"])
        if held.local is None:
            raise ValueError("no per-rank part")
        state, dropped = held.local.state.restored(run.hooks.hooks)
    except (ValueError, TypeError) as exc:  # SlotMismatch included: a slot that no longer fits its hook
        raise HealError(f"cannot heal from rank {src} (step {step}): {exc}") from None
    peer = held.replicated
    found = weight_differences(unwrap(ctx.model).state_dict(), payload["weights"], dtypes=True, theirs="sent")
    if peer.classes != recorded(ctx):
        found.append(f"its optimizers and scheduler are {peer.classes}, this run's {recorded(ctx)}")
    if (peer.scaler is None) != (ctx.scaler is None):
        found.append(f"{'this run' if peer.scaler is None else 'the peer'} has no scaler")
    if sorted(peer.extra or {}) != sorted(ctx.extra_state):
        found.append(f"its extra state is {sorted(peer.extra or {})}, this run's {sorted(ctx.extra_state)}")
    own = saved_state(run.state, run.hooks.hooks).slots
    keys = held.local.state.slots.keys() if isinstance(held.local.state.slots, Keyed) else None
    if dropped or not isinstance(own, Keyed) or keys != own.keys():
        found.append(f"its hooks are {keys}, this run's {own.keys() if isinstance(own, Keyed) else None}")
    data = changes(held.local.cursor.get("data"), describe(ctx.feed.data))
    dealt = ctx.feed.dealer is not None  # a dealt epoch is as long as its participants make it, not the data
    if data or not dealt and state.progress.iters_per_epoch != ctx.feed.iters_per_epoch:
        found.append(
            f"its training data differ ({data or 'steps per epoch'}: "
            f"{state.progress.iters_per_epoch} there, {ctx.feed.iters_per_epoch} here)"
        )
    if found:
        raise HealError(
            f"cannot heal from rank {src} (step {step}): its run does not fit this one ({'; '.join(found)}). Build "
            f"this replica as the peer's run is built: the same model, optimizers, scheduler, scaler, extra state, "
            f"hooks and data"
        )
    return held, state


def _restored(run: Loop, weights: dict, held: TrainerContents, state: State, src: int, step: int) -> State:
    """Load what arrived into ``run``'s objects; the state to walk on from. Checked first: nothing loads on a refusal.

    ``weights`` and ``held`` are the parts ``_fitting`` read, their tensors
    received since; ``state`` is the peer's ``State`` for this run's hooks.
    The optimizers load first: ``Optimizer.load_state_dict`` changes nothing
    when it refuses a state.
    """
    ctx = run.ctx
    peer, local = held.replicated, held.local
    try:
        problem = "no per-rank part" if local is None else rng_problem(local.rng)
        if local is None or problem is not None:
            raise ValueError(f"its RNG states do not restore ({problem})")
        states = {None: peer.optimizer} if ctx.optimizers is None else peer.optimizers or {}
        for name, optimizer in ctx.named_optimizers().items():
            optimizer.load_state_dict(states[name])
    except (ValueError, TypeError, KeyError, IndexError, AttributeError) as exc:
        raise HealError(
            f"cannot heal from rank {src} (step {step}): {type(exc).__name__}: {str(exc)[:160]}. Restart this "
            f"replica from the last checkpoint (resume='auto')"
        ) from None
    unwrap(ctx.model).load_state_dict(weights)
    if ctx.scheduler is not None:
        ctx.scheduler.load_state_dict(peer.scheduler)
    if ctx.scaler is not None:
        ctx.scaler.load_state_dict(peer.scaler)
    for name, obj in ctx.extra_state.items():
        obj.load_state_dict((peer.extra or {})[name])
    p = state.progress
    restore_rng(local.rng)  # then the cursor, which positions the data from it (as a resume does)
    ctx.feed.resume(local.cursor, p.epoch, p.iter_in_epoch)
    return attrs.evolve(state, rank=ctx.rank, world_size=ctx.world_size)


# -- both sides -----------------------------------------------------------------------------------
def _between_steps(run: Loop, verb: str) -> State:
    """``run``'s state between two steps: what waits read into the slots, a background save published."""
    stopped = run.interrupted
    if stopped is not None:
        raise HealError(
            f"cannot {verb} a state while step {stopped.step} is interrupted ({stopped.phase}): complete it "
            f"with run.step() first"
        )
    if not run.finished:
        run.run(0)
    return run.state


def _healed(step: int, peer: int, sent: torch.Tensor, tensors: list[torch.Tensor], start: float) -> Healed:
    size = sum(_bytes(t) for t in tensors)
    return Healed(step, peer, sent.numel(), len(tensors), size, time.perf_counter() - start)


@attrs.frozen
class _Wire:
    """The messages of one heal with ``peer`` over ``group``: a failure on the way is a ``HealCut`` saying where."""

    group: Any
    peer: int
    sending: bool  # this side sends the state

    def send(self, tensor: torch.Tensor, what: str) -> None:
        self._done(lambda: self.group.send([tensor], self.peer, _TAG), f"sending {what}")

    def recv(self, tensor: torch.Tensor, what: str) -> None:
        self._done(lambda: self.group.recv([tensor], self.peer, _TAG), f"receiving {what}")

    def _done(self, start, doing: str) -> None:
        try:
            start().wait()
        except Exception as exc:  # noqa: BLE001 - whatever the transport raises: the peer died or hung
            other = f"rank {self.peer}"
            where = f"the heal of {other}" if self.sending else f"the heal from {other}"
            left = (
                "this run goes on as it was"
                if self.sending
                else "nothing of its state was loaded here: heal again from a live peer (under FaultTolerance the "
                "next quorum does)"
            )
            raise HealCut(
                f"{where} was cut while {doing} ({type(exc).__name__}: {str(exc)[:160]}): the peer died or hung "
                f"past the group's timeout; {left}"
            ) from None


def _answer(wire: _Wire, refusal: str) -> None:
    """The receiver's answer: ``""`` to go on, else why it refused (UTF-8 text: never unpickled)."""
    text = refusal.encode("utf-8")[:_MAX_ANSWER]
    wire.send(torch.tensor([len(text)], dtype=torch.int64), "its answer")
    if text:
        wire.send(torch.frombuffer(bytearray(text), dtype=torch.uint8), "its answer")


def _answered(wire: _Wire, step: int, what: str) -> None:
    """Wait for the receiver's answer; its refusal raised here as a ``HealError`` with its reason."""
    peer = wire.peer
    size = torch.zeros(1, dtype=torch.int64)
    wire.recv(size, f"its answer to {what}")
    n = int(size.item())
    if not n:
        return
    if not 0 < n <= _MAX_ANSWER:
        raise HealError(f"rank {peer} answered {n} for the state of step {step}: it does not run receive_state")
    text = torch.empty(n, dtype=torch.uint8)
    wire.recv(text, f"its answer to {what}")
    reason = bytes(text.numpy().tobytes()).decode("utf-8", errors="replace")
    raise HealError(f"rank {peer} refused the state of step {step} after {what}: {reason}")


def _bytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def _size(n: int) -> str:
    """``n`` bytes for a person: ``512 B``, ``15.3 KB``, ``256.0 GB``."""
    for unit, scale in (("GB", 2**30), ("MB", 2**20), ("KB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def _numbered(tensors: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """The tensors by the names ``pack`` gave them: their positions, as strings."""
    return {str(i): t for i, t in enumerate(tensors)}
