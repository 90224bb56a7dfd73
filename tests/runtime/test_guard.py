"""The agreement guard's pure parts (the setup and its description) and its comparison schedule."""

import attrs
import pytest
import torch

import pimm_fn as pf
from pimm_fn.core import events as ev
from pimm_fn.core.plan import initial_state
from pimm_fn.runtime.engine.guard import AgreementGuard
from pimm_fn.runtime.engine.implied import describe_setup, setup_of
from _tiny_workload import TinyNet, loader, negative_mse
from _process_group import one_rank_group  # noqa: F401 - a fixture


def setup(*hooks, iters_per_epoch=6, max_epochs=3):
    return setup_of(hooks, initial_state(hooks, iters_per_epoch=iters_per_epoch, max_epochs=max_epochs))


@attrs.frozen
class Watch:
    """A hook of the user's own (not rank-consistent) on an AfterStep cadence."""

    every: int = 1
    events = (ev.AfterStep,)
    hook_key: str = "watch"

    def __call__(self, state, event):
        return state, ()


def test_equal_configurations_give_equal_setups():
    """Hooks built alike in two places give equal setups, so the ranks' digests agree."""
    make = lambda: (pf.save_every(5, async_save=True), pf.chain(pf.log_every(3), pf.best_on("acc"), name="x"))
    assert setup(*make()) == setup(*make())


def test_setup_names_hooks_by_their_factory_call_and_chains_by_their_leaves():
    """A built-in reads as its factory call; a named chain keeps its name and lists its leaves' identities."""
    found = setup(pf.save_every(5, async_save=True), pf.chain(pf.log_every(3), pf.chain(pf.save_every(7)), name="x"))
    assert [h.key for h in found.hooks] == ["save_every(5, async_save=True)", "x"]
    assert found.hooks[1].leaves == ("log_every(3)", "save_every(7)")
    assert found.hooks[0].declared == (
        "save_every(5, async_save=True): events=AfterStep, AfterEpoch, AfterTrain, every=5, rank_consistent=True",
    )


def test_memory_addresses_do_not_make_setups_differ():
    """A repr holding an object's address (which differs between processes) compares without it."""

    @attrs.frozen
    class Opaque:
        fn: object

        def __call__(self, state, event):
            return state, ()

    one, two = Opaque(lambda: 1), Opaque(lambda: 1)
    assert repr(one) != repr(two)
    assert setup(one) == setup(two)


def test_description_names_each_differing_hook_by_position_and_identity_with_each_ranks_value():
    """Only the differing positions are listed, each with every rank's identity, and the fix is given."""
    text = describe_setup(
        [
            setup(pf.save_every(2), pf.log_every(5), pf.save_every(5, async_save=True)),
            setup(pf.save_every(3), pf.log_every(5), pf.save_every(5)),
        ]
    )
    lines = text.splitlines()
    assert lines[1:3] == [
        "  hook #0: rank 0: save_every(2); rank 1: save_every(3)",
        "  hook #2: rank 0: save_every(5, async_save=True); rank 1: save_every(5)",
    ]
    assert "Every rank must build the same hook list, with the same arguments, in the same order" in lines[3]
    assert len(lines) == 4  # the schedules agree: nothing about batches


def test_description_groups_ranks_with_the_same_value():
    """On many ranks, ranks with the same value share one entry, consecutive ranks as a range."""
    a, b = setup(pf.save_every(2)), setup(pf.save_every(3))
    assert "hook #0: ranks 0-1, 3-5: save_every(2); rank 2: save_every(3)" in describe_setup([a, a, b, a, a, a])


def test_description_shows_a_missing_hook():
    """A rank with fewer hooks shows (no hook) where the others have one."""
    text = describe_setup([setup(pf.save_every(4)), setup(pf.save_every(4), pf.log_every(7))])
    assert "  hook #1: rank 0: (no hook); rank 1: log_every(7)" in text.splitlines()


def test_description_shows_leaves_when_a_named_chain_differs_inside():
    """Two chains with the same name but different leaves are told apart by their leaves."""
    text = describe_setup([setup(pf.chain(pf.save_every(6), name="x")), setup(pf.chain(pf.save_every(7), name="x"))])
    assert "hook #0: rank 0: x (leaves: save_every(6)); rank 1: x (leaves: save_every(7))" in text


def test_description_shows_declarations_when_only_they_differ():
    """A hook keeping one identity but declaring another cadence is shown with its declarations."""
    text = describe_setup([setup(Watch(every=4)), setup(Watch(every=5))])
    assert (
        "hook #0: rank 0: watch [watch: events=AfterStep, every=4, rank_consistent=False]; "
        "rank 1: watch [watch: events=AfterStep, every=5, rank_consistent=False]" in text
    )


def test_description_names_differing_schedule_values_and_their_fix():
    """A different epoch length is named with each rank's value, and the advice is about batches, not hooks."""
    text = describe_setup([setup(pf.save_every(2), iters_per_epoch=6), setup(pf.save_every(2), iters_per_epoch=7)])
    assert "  iters_per_epoch: rank 0: 6; rank 1: 7" in text.splitlines()
    assert "DistributedSampler" in text and "same hook list" not in text


def guarded_run(hooks, max_epochs=4):
    torch.manual_seed(0)
    model = TinyNet()
    run = pf.loop(
        model,
        torch.optim.SGD(model.parameters(), lr=0.01),
        loader(),
        hooks=hooks,
        max_epochs=max_epochs,
        watching=pf.Watching(console=False),
        parallel=pf.Parallel(check_agreement=True),
    )
    run()
    return run._interpreter.guard


@pytest.mark.parametrize("every, compared", [(1, 20), (4, 5), (100, 0)])
def test_a_watched_hook_is_compared_only_on_its_cadence_steps(one_rank_group, every, compared):
    """20 steps (5 per epoch): a watched hook with every=n costs one comparison per n steps, built-ins none."""
    guard = guarded_run([pf.evaluate_every(3, negative_mse), pf.log_every(2), Watch(every)])
    assert guard.watched == {2}
    assert guard.comparisons == compared


def test_built_in_hooks_cost_no_comparison_after_the_setup(one_rank_group):
    """With rank-consistent hooks only, the guard compares the setup and nothing else."""
    guard = guarded_run([pf.evaluate_every(3, negative_mse), pf.log_every(2), pf.evaluate_every(0, negative_mse)])
    assert guard.watched == frozenset() and guard.comparisons == 0


def test_guard_is_consulted_for_exactly_the_events_a_watched_hook_is_called_for(one_rank_group):
    """The guarded events of AfterStep follow the cadence; other event types follow the watched hooks' events."""
    guard = AgreementGuard(pf.chain(Watch(4), pf.save_every(2)))
    assert [s for s in range(1, 13) if guard.guards(ev.AfterStep(s, {}))] == [4, 8, 12]
    assert not guard.guards(ev.AfterEpoch(0)) and not guard.guards(ev.BeforeStep(4))


def test_a_guarded_run_of_built_ins_processes_only_what_hooks_or_the_setup_need(one_rank_group, tmp_path):
    """With rank-consistent hooks the guard needs only the starting events: no BeforeStep is processed, no loss read."""
    torch.manual_seed(0)
    model = TinyNet()
    run = pf.loop(
        model,
        torch.optim.SGD(model.parameters(), lr=0.01),
        loader(),
        save_dir=tmp_path,
        hooks=[pf.evaluate_every(0, negative_mse), pf.save_every(2)],
        max_epochs=1,
        watching=pf.Watching(console=False),
    )
    assert run._interpreter.guard is not None
    assert run._processed[ev.ModifyConfig] and run._processed[ev.BeforeTrain]
    assert not run._processed[ev.BeforeStep]
    assert AgreementGuard(pf.chain(Watch(4))).watches(ev.AfterStep)
    run()
    assert run.state.finished
