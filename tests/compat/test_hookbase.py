"""adapt: pimm class-based hooks run at their events with a read-only trainer view."""

import pickle

import pytest

import pimm_fn as pf
from pimm_fn.compat import HookBase, TrainerView, adapt
from pimm_fn.core import events as ev
from pimm_fn.core.effects import Log, SaveCheckpoint
from pimm_fn.core.fold import chain
from pimm_fn.core.plan import RecordingExecutor, initial_state, run_schedule
from pimm_fn.core.state import Progress, State


class Recorder(HookBase):
    """Records (method, epoch, iter, global_step, comm_info) for every call."""

    def __init__(self):
        self.calls = []

    def _record(self, name):
        t = self.trainer
        self.calls.append((name, t.epoch, t.iter, t.global_step, dict(t.comm_info)))

    def before_train(self):
        self._record("before_train")

    def before_epoch(self):
        self._record("before_epoch")

    def before_step(self):
        self._record("before_step")

    def after_step(self):
        self._record("after_step")

    def after_epoch(self):
        self._record("after_epoch")

    def after_train(self):
        self._record("after_train")

    def modify_config(self, cfg):
        self.calls.append(("modify_config", self.trainer.epoch))


def _run(hooks, *, iters_per_epoch, max_epochs, outputs=None, config=None):
    """The final state and trace of a dry run, with ``outputs(step)`` as each step's outputs."""
    hooks = chain(*hooks)
    executor = RecordingExecutor(lambda step, rank: None)
    state = initial_state(hooks.hooks, iters_per_epoch=iters_per_epoch, max_epochs=max_epochs, config=config)
    return run_schedule(hooks, state, executor, outputs), executor.trace


def test_methods_run_in_pimm_lifecycle_order_with_pimm_numbering():
    """modify_config, before_train, then per epoch before/after each step and after_epoch, then after_train."""
    recorder = Recorder()
    _run([adapt(recorder)], iters_per_epoch=2, max_epochs=2, outputs=lambda step: {"loss": float(step)})
    assert recorder.calls == [
        ("modify_config", 0),
        ("before_train", 0, 0, 0, {}),
        ("before_epoch", 0, 0, 0, {}),
        ("before_step", 0, 0, 0, {}),
        ("after_step", 0, 0, 1, {"loss": 1.0}),
        ("before_step", 0, 1, 1, {}),
        ("after_step", 0, 1, 2, {"loss": 2.0}),
        ("after_epoch", 0, 1, 2, {}),
        ("before_epoch", 1, 0, 2, {}),
        ("before_step", 1, 0, 2, {}),
        ("after_step", 1, 0, 3, {"loss": 3.0}),
        ("before_step", 1, 1, 3, {}),
        ("after_step", 1, 1, 4, {"loss": 4.0}),
        ("after_epoch", 1, 1, 4, {}),
        ("after_train", 1, 1, 4, {}),
    ]
    assert recorder.trainer is None  # the view is only there while a method runs


class SaveOnLowLoss(HookBase):
    """A pimm-style hook that asks for a save and a log line as effects."""

    def after_step(self):
        if self.trainer.comm_info["loss"] < 0.3:
            step = self.trainer.global_step
            return (SaveCheckpoint(step), Log(step, "low", {"epoch": self.trainer.epoch}))

    def after_train(self):
        return [SaveCheckpoint(self.trainer.global_step, final=True)]


def test_returned_effects_come_out_of_the_plan_in_order():
    """Effects a method returns are executed like any hook's, at the event of that method (a record first)."""
    _, trace = _run([adapt(SaveOnLowLoss())], iters_per_epoch=3, max_epochs=2, outputs=lambda step: {"loss": 1 / step})
    assert [(e.step, type(e.event), e.effect) for e in trace] == [
        (4, ev.AfterStep, Log(4, "low", {"epoch": 1})),
        (4, ev.AfterStep, SaveCheckpoint(4)),
        (5, ev.AfterStep, Log(5, "low", {"epoch": 1})),
        (5, ev.AfterStep, SaveCheckpoint(5)),
        (6, ev.AfterStep, Log(6, "low", {"epoch": 1})),
        (6, ev.AfterStep, SaveCheckpoint(6)),
        (6, ev.AfterTrain, SaveCheckpoint(6, final=True)),
    ]


class EpochSaver(HookBase):
    def after_epoch(self):
        if self.trainer.epoch % 2 == 1:
            return (SaveCheckpoint(self.trainer.global_step),)


def test_plan_sees_adapted_effects_beside_native_hooks():
    """pf.plan runs an adapted hook in its list position among native hooks."""
    trace = pf.plan([pf.save_every(4), adapt(EpochSaver())], iters_per_epoch=3, max_epochs=4)
    assert [(e.step, e.effect, e.hook) for e in trace] == [
        (4, SaveCheckpoint(4), 0),
        (6, SaveCheckpoint(6), 1),
        (8, SaveCheckpoint(8), 0),
        (12, SaveCheckpoint(12, deferred=True), 0),  # every save closes its event: two of them run
        (12, SaveCheckpoint(12), 1),  # in hook order, the adapted hook's after save_every's
    ]


class Mutator(HookBase):
    def after_step(self):
        self.trainer.epoch = 5


class ModelReader(HookBase):
    def after_step(self):
        self.trainer.model.zero_grad()


def test_the_trainer_view_is_read_only_with_a_pointer_to_effects():
    """Assigning to the view, or reaching for the model, raises AttributeError saying what to do instead."""
    with pytest.raises(AttributeError, match=r"^TrainerView is read-only: cannot set 'epoch'; .*tuple of effects"):
        pf.plan([adapt(Mutator())], iters_per_epoch=1, max_epochs=1)
    with pytest.raises(AttributeError, match=r"^TrainerView has no 'model': .*model_hook\(\)$"):
        pf.plan([adapt(ModelReader())], iters_per_epoch=1, max_epochs=1)
    view = TrainerView.of(State(Progress(2, 1)), ev.BeforeTrain())
    with pytest.raises(TypeError):
        view.comm_info["loss"] = 1.0
    with pytest.raises(AttributeError, match=r"^TrainerView is read-only: cannot delete 'metrics'"):
        del view.metrics


class ReturnsConfig(HookBase):
    def modify_config(self, cfg):
        return {**cfg, "batch_size": cfg["batch_size"] * 2}


class EditsConfigInPlace(HookBase):
    def modify_config(self, cfg):
        cfg["optimizer"]["lr"] = 0.1


def test_modify_config_replaces_the_state_config():
    """A returned dict, or the copy changed in place, becomes state.config; the old state is untouched."""
    state = State(Progress(2, 1), config={"batch_size": 4, "optimizer": {"lr": 0.01}})
    new, effects = adapt(ReturnsConfig())(state, ev.ModifyConfig())
    assert effects == () and new.config == {"batch_size": 8, "optimizer": {"lr": 0.01}}
    new, _ = adapt(EditsConfigInPlace())(state, ev.ModifyConfig())
    assert new.config["optimizer"] == {"lr": 0.1} and state.config["optimizer"] == {"lr": 0.01}
    assert adapt(HookBase())(state, ev.ModifyConfig()) == (state, ())


def test_modify_config_reaches_the_final_state_of_a_run():
    """In a full dry run the changed config is what later events see."""
    final, _ = _run([adapt(ReturnsConfig())], iters_per_epoch=1, max_epochs=1, config={"batch_size": 2})
    assert final.config == {"batch_size": 4}


class BadReturn(HookBase):
    def before_epoch(self):
        return "save"


class BadConfig(HookBase):
    def modify_config(self, cfg):
        return ["lr", 0.1]


def test_bad_return_values_name_the_method():
    """A method returning something other than None or effects fails, naming class and method."""
    bad_return = r"^BadReturn.before_epoch\(\) must return None or a tuple of pimm_fn effects \(got 'save'\)$"
    with pytest.raises(TypeError, match=bad_return):
        pf.plan([adapt(BadReturn())], iters_per_epoch=1, max_epochs=1)
    bad_config = r"^BadConfig.modify_config\(cfg\) must return None or a dict \(got list: \['lr', 0.1\]\)$"
    with pytest.raises(TypeError, match=bad_config):
        pf.plan([adapt(BadConfig())], iters_per_epoch=1, max_epochs=1)


class OnlyAfterEpoch:
    """Not a HookBase: duck-typed objects with some of the methods adapt too."""

    def after_epoch(self):
        return (SaveCheckpoint(self.trainer.global_step),)

    def __repr__(self):
        return "OnlyAfterEpoch()"


def test_adapt_accepts_duck_typed_hooks_and_refuses_other_objects():
    """Missing methods are no-ops; an object with none of pimm's methods is refused."""
    hook = adapt(OnlyAfterEpoch())
    assert repr(hook) == "adapt(OnlyAfterEpoch())"
    assert [e.step for e in pf.plan([hook], iters_per_epoch=2, max_epochs=2)] == [2, 4]
    with pytest.raises(TypeError, match=r"^adapt\(\) takes an object with pimm hook methods .*needs no adapter$"):
        adapt(pf.save_every(3))


def test_adapted_hook_compares_by_identity_of_its_object_and_pickles():
    """Two adapters of one object are equal; an adapter of a picklable object pickles."""
    obj = OnlyAfterEpoch()
    assert adapt(obj) == adapt(obj) and adapt(obj) != adapt(OnlyAfterEpoch())
    assert repr(pickle.loads(pickle.dumps(adapt(obj)))) == "adapt(OnlyAfterEpoch())"
