"""Resume by hook identity: a resumed run may reorder, add or remove hooks and still continue exactly."""

import collections
import warnings
from typing import ClassVar

import attrs
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pimm_fn as pf
from pimm_fn import checkpoint
from pimm_fn.core import codec
from pimm_fn.core.effects import Log, SaveCheckpoint
from pimm_fn.core.events import AfterStep
from pimm_fn.runtime.step.rng import capture_rng

import _tiny_workload as tw

EPOCHS = 2  # 10 steps: saves at 3, 6, 9 and the final one at 10
STOP = 7  # the interrupted run stops after step 7; its latest checkpoint is step 6


def progress(state, event):
    """A stateless hook, like a progress bar: no slot, no effects."""
    return state, ()


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """Final weights and trace of the run never interrupted, with the standard hooks in their usual order."""
    model, run = tw.build(tmp_path_factory.mktemp("full"), max_epochs=EPOCHS)
    run()
    return tw.weights(model), run.trace


def _interrupted(save_dir, hooks=None, **kwargs):
    _, run = tw.build(save_dir, hooks=hooks, max_epochs=EPOCHS, **kwargs)
    run.run(steps=STOP)
    return run


def _after(trace, start) -> list:
    return [(e.step, e.event, e.effect) for e in trace if e.step > start]


def _resumed(save_dir, hooks, **kwargs):
    """Resume ``save_dir`` with ``hooks`` and train to the end; returns (weights, trace from the resume point, start)."""
    model, run = tw.build(save_dir, hooks=hooks, max_epochs=EPOCHS, resume="auto", **kwargs)
    start = run.state.progress.global_step
    run()
    return tw.weights(model), _after(run.trace, start), start


def test_the_same_hooks_in_another_order_resume_bit_identically(tmp_path, uninterrupted):
    """Reversed hooks resume with identical weights and, event by event, the same effects as the uninterrupted run."""
    expected_weights, full_trace = uninterrupted
    _interrupted(tmp_path)
    got_weights, trace, start = _resumed(tmp_path, list(reversed(tw.standard_hooks())))
    assert start == 6
    assert tw.same_weights(got_weights, expected_weights)
    # Hook order legitimately reorders the effects within one event: compare them as multisets.
    assert collections.Counter(trace) == collections.Counter(_after(full_trace, start))


def test_an_added_stateless_hook_changes_nothing(tmp_path, uninterrupted):
    """A hook the checkpoint does not know starts fresh; with no effects of its own, weights and trace are unchanged."""
    expected_weights, full_trace = uninterrupted
    _interrupted(tmp_path)
    hooks = tw.standard_hooks()
    got_weights, trace, start = _resumed(tmp_path, hooks[:2] + [progress] + hooks[2:])
    assert tw.same_weights(got_weights, expected_weights)
    assert trace == _after(full_trace, start)


def test_a_removed_hook_is_dropped_and_the_rest_continue_exactly(tmp_path, uninterrupted):
    """Without log_every, the run continues bit-identically with every effect but the logs, in the same order."""
    expected_weights, full_trace = uninterrupted
    _interrupted(tmp_path)
    got_weights, trace, start = _resumed(tmp_path, [h for h in tw.standard_hooks() if repr(h) != "log_every(5)"])
    assert tw.same_weights(got_weights, expected_weights)
    assert trace == [t for t in _after(full_trace, start) if not isinstance(t[2], Log)]


def test_a_removed_hook_is_noted_in_one_console_line_and_no_warning(tmp_path, capsys):
    """Dropping a hook's slot prints one line naming it and warns nothing about it."""
    _interrupted(tmp_path)
    capsys.readouterr()
    torch.manual_seed(0)
    model = tw.TinyNet()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pf.loop(
            model,
            torch.optim.Adam(model.parameters(), lr=0.01),
            tw.loader(),
            hooks=tw.standard_hooks()[:3],
            max_epochs=EPOCHS,
            save_dir=tmp_path,
            resume="auto",
            watching=pf.Watching(console=True),
        )
    noted = [line for line in capsys.readouterr().out.splitlines() if "log_every(5)" in line]
    assert len(noted) == 1 and "dropped the checkpointed slot(s) of 'log_every(5)'" in noted[0]
    assert not [w for w in caught if "log_every" in str(w.message) or "slot" in str(w.message)]


def test_a_replaced_hook_starts_fresh_where_positions_handed_it_another_hooks_slot(tmp_path, uninterrupted):
    """log_every swapped for early_stop at the same position: the new hook gets a fresh slot, not the LogState.

    (Not a second best_on('score'): loop() refuses two best trackers of one metric.)"""
    expected_weights, _ = uninterrupted
    _interrupted(tmp_path)
    hooks = tw.standard_hooks()[:3] + [pf.early_stop("score", patience=10**6)]
    model, run = tw.build(tmp_path, hooks=hooks, max_epochs=EPOCHS, resume="auto")
    assert run.state.slots[3] == pf.EarlyStopState()
    run()
    assert tw.same_weights(tw.weights(model), expected_weights)


# -- a hook whose slot no longer fits ------------------------------------------------------------
@pf.register_slot_type
@attrs.frozen
class Tally:
    steps: int = 0


@pf.register_slot_type
@attrs.frozen
class TallyV2:
    count: int = 0


@attrs.frozen
class _Tallying:
    """Counts steps in a ``Tally``; identity 'tally'."""

    hook_key: ClassVar[str] = "tally"
    events: ClassVar[tuple] = (AfterStep,)

    def init(self):
        return Tally()

    def __call__(self, state, event):
        return state.with_slot(Tally(state.slot.steps + 1)), ()


@attrs.frozen
class _TallyingV2(_Tallying):
    """The same identity, a new slot class: a checkpoint of ``_Tallying`` does not fit it."""

    def init(self):
        return TallyV2()


def _refused(save_dir, hooks):
    """Resume that must be refused; returns the error and whether model, optimizer and RNG stayed untouched."""
    torch.manual_seed(0)
    model = tw.TinyNet()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    before, rng = tw.weights(model), torch.get_rng_state()
    with pytest.raises(pf.ResumeError) as caught:
        pf.loop(
            model,
            optimizer,
            tw.loader(),
            hooks=hooks,
            max_epochs=EPOCHS,
            save_dir=save_dir,
            resume="auto",
            watching=pf.Watching(console=False),
        )
    untouched = tw.same_weights(tw.weights(model), before) and not optimizer.state_dict()["state"]
    return str(caught.value), untouched and torch.equal(torch.get_rng_state(), rng)


def test_a_hook_whose_slot_type_changed_is_a_resume_error_naming_it_and_changes_nothing(tmp_path):
    """Same identity, another slot class: ResumeError naming the key and both types, before anything is loaded."""
    _interrupted(tmp_path, hooks=[pf.save_every(3), _Tallying()])
    message, untouched = _refused(tmp_path, [pf.save_every(3), _TallyingV2()])
    assert (
        "'tally'" in message and "test_resume_identity.Tally," in message and "test_resume_identity.TallyV2" in message
    )
    assert untouched


def test_a_slot_class_no_longer_registered_is_a_resume_error_naming_it(tmp_path, monkeypatch):
    """A slot that no longer decodes is a ResumeError naming the hook and the saved type, not a raw error."""
    _interrupted(tmp_path, hooks=[pf.save_every(3), _Tallying()])
    monkeypatch.delitem(codec._REGISTRY, "test_resume_identity:Tally")
    message, untouched = _refused(tmp_path, [pf.save_every(3), _Tallying()])
    assert "'tally'" in message and "no longer decodes" in message and "test_resume_identity.Tally" in message
    assert untouched


def test_a_slot_class_whose_fields_changed_is_a_resume_error(tmp_path, monkeypatch):
    """A registered slot class with other fields is a ResumeError naming the hook, not a TypeError from attrs."""
    _interrupted(tmp_path, hooks=[pf.save_every(3), _Tallying()])
    monkeypatch.setitem(codec._REGISTRY, "test_resume_identity:Tally", TallyV2)
    message, untouched = _refused(tmp_path, [pf.save_every(3), _TallyingV2()])
    assert "'tally'" in message and "no longer decodes" in message and "unexpected keyword" in message
    assert untouched


def test_the_checkpoint_keeps_slots_by_hook_identity(tmp_path):
    """The trainer and local parts hold the State without slots, and the slots keyed by identity."""
    _interrupted(tmp_path)
    loaded = checkpoint.load_checkpoint(checkpoint.latest_checkpoint(tmp_path / "model"))
    held = checkpoint.from_parts(loaded.trainer, loaded.local)
    keys = tuple(repr(h) for h in tw.standard_hooks())
    assert loaded.trainer["layout"] == checkpoint.contents.LAYOUT
    assert held.replicated.state.slots.keys() == keys and held.local.state.slots.keys() == keys
    assert held.local.state.state.slots == () and held.local.state.state.progress.global_step == 6


# -- checkpoints written before slots were keyed ---------------------------------------------------
def _positional_save(effect, state, ctx):
    """The save as it was before slots were keyed: the whole State, slots by position, as one JSON."""
    own = codec.dumps(state)
    trainer = {
        "optimizer": ctx.optimizer.state_dict(),
        "scheduler": ctx.scheduler.state_dict(),
        "scaler": None,
        "state": own,
    }
    local = {"state": own, "rng": capture_rng(), "cursor": ctx.feed.state_dict()}
    checkpoint.save_checkpoint(ctx.model_dir, step=effect.step, weights=ctx.weights(), trainer=trainer, local=local)
    return ()


def test_a_checkpoint_with_positional_slots_still_resumes_bit_identically(tmp_path, uninterrupted):
    """A checkpoint from before keyed slots resumes, by position, with the same hooks: same weights and trace."""
    expected_weights, full_trace = uninterrupted
    _interrupted(tmp_path, handlers={SaveCheckpoint: _positional_save})
    assert "layout" not in checkpoint.load_checkpoint(checkpoint.latest_checkpoint(tmp_path / "model")).trainer
    got_weights, trace, start = _resumed(tmp_path, tw.standard_hooks())
    assert start == 6 and tw.same_weights(got_weights, expected_weights)
    assert trace == _after(full_trace, start)


def test_a_checkpoint_with_positional_slots_and_another_hook_count_is_refused(tmp_path):
    """Positional slots need the same number of hooks: a ResumeError naming both counts, changing nothing."""
    _interrupted(tmp_path, handlers={SaveCheckpoint: _positional_save})
    message, untouched = _refused(tmp_path, [pf.save_every(3)])
    assert "written by a run with 4 hook(s), this run has 1" in message and untouched


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(order=st.permutations(range(4)), add_progress=st.booleans(), data=st.data())
def test_resume_after_any_reordering_or_added_stateless_hook_is_bit_identical(
    tmp_path_factory, uninterrupted, order, add_progress, data
):
    """Whatever the new order of the hooks, with or without a stateless hook added anywhere, weights end bit-identical."""
    expected_weights, _ = uninterrupted
    save_dir = tmp_path_factory.mktemp("any_order")
    _interrupted(save_dir)
    hooks = [tw.standard_hooks()[i] for i in order]
    if add_progress:
        hooks.insert(data.draw(st.integers(0, len(hooks)), label="at"), progress)
    got_weights, _, start = _resumed(save_dir, hooks)
    assert start == 6 and tw.same_weights(got_weights, expected_weights)
