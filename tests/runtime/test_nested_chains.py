"""Chains nested at any depth behave in a real loop exactly as in plan and simulate."""

import warnings

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pimm_fn as pf
from pimm_fn.core.effects import Log
from pimm_fn.testing import simulate

import _tiny_workload as tw

ITERS, EPOCHS = 5, 2  # the tiny loader's 40 samples in batches of 8


class CountingNet(tw.TinyNet):
    """TinyNet counting its training forwards, so an evaluator can answer by global step."""

    def __init__(self):
        super().__init__()
        self.steps = 0

    def forward(self, batch):
        self.steps += self.training
        return super().forward(batch)


def acc_at(step: int) -> float:
    """The accuracy every run "measures" at ``step``: rises, then plateaus, so early_stop may fire."""
    return [0.1, 0.3, 0.2, 0.5, 0.5, 0.4, 0.45, 0.5, 0.3, 0.2, 0.1][min(step, 10)]


def accuracy(model):
    return {"acc": acc_at(model.steps)}


def built_ins() -> list:
    return [
        pf.evaluate_every(2, accuracy, name="val"),
        pf.best_on("acc"),
        pf.log_every(3),
        pf.save_every(4),
        pf.early_stop("acc", patience=2),
        pf.step_scheduler("epoch"),
        pf.evaluate_every(0, accuracy, name="epoch_val"),
    ]


@st.composite
def nested(draw, hooks):
    """``hooks`` (each once, in a drawn order) grouped into chains nested up to three deep."""
    hooks = draw(st.permutations(hooks))
    if len(hooks) <= 1 or draw(st.integers(0, 3)) == 0:
        return list(hooks)
    cut = draw(st.integers(1, len(hooks) - 1))
    inner = draw(nested(hooks[cut:]))
    return [*hooks[:cut], pf.chain(*inner)]


def _comparable(entries) -> list:
    """(step, event type, hook, effect) with Log values reduced to their kind: losses differ from placeholders."""
    return [
        (
            e.step,
            type(e.event).__name__,
            e.hook,
            (e.effect.kind, e.effect.step) if isinstance(e.effect, Log) else e.effect,
        )
        for e in entries
    ]


def _real_trace(tmp_path, hooks) -> list:
    torch.manual_seed(0)
    model = CountingNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.9)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", pf.ConfigurationWarning)  # the drawn order may put a saver first
        run = pf.loop(
            model,
            optimizer,
            tw.loader(),
            hooks=hooks,
            max_epochs=EPOCHS,
            save_dir=tmp_path,
            scheduler=scheduler,
            watching=pf.Watching(console=False),
        )
        run()
    return run.trace


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_nested_chains_of_every_built_in_run_as_planned_and_simulated(tmp_path_factory, data):
    """The same nested hooks give one trace in a real run, in plan and in a one-rank simulation."""
    picks = data.draw(st.lists(st.integers(0, 6), min_size=1, max_size=7, unique=True), label="hooks")
    hooks = data.draw(nested([built_ins()[i] for i in picks]), label="nesting")
    metrics = {step: {"acc": acc_at(step)} for step in range(ITERS * EPOCHS + 1)}
    real = _comparable(_real_trace(tmp_path_factory.mktemp("nested"), hooks))
    planned = _comparable(pf.plan(hooks, iters_per_epoch=ITERS, max_epochs=EPOCHS, metrics=metrics))
    simulated = simulate(hooks, world_size=1, iters_per_epoch=ITERS, max_epochs=EPOCHS, metrics=metrics)
    assert real == planned == _comparable(simulated.traces[0])


def test_an_evaluator_inside_a_chain_is_found_by_the_loop(tmp_path):
    """chain(evaluate_every(2, acc), best_on('acc')) evaluates and writes model_best in a real run."""
    hooks = [pf.chain(pf.evaluate_every(2, accuracy, name="val"), pf.best_on("acc"))]
    trace = _real_trace(tmp_path, hooks)
    assert [type(e.effect).__name__ for e in trace][:2] == ["Evaluate", "WriteBest"]
    assert (tmp_path / "model" / "model_best.pth").is_file()
