"""The examples of the manual run as written: every python block of every page, and what docs/hooks.md and
docs/testing.md define behaves as they say."""

import doctest
import pathlib
import re

import pytest

import pimm_fn as pf
from pimm_fn.core.hook import declared

DOCS = pathlib.Path(__file__).parent.parent / "docs"
DOC = DOCS / "hooks.md"


def _blocks(doc=DOC) -> dict:
    """The doc's python code blocks, run in one namespace, as a reader would paste them."""
    namespace = {"__name__": f"docs_{doc.stem}"}
    for code in re.findall(r"```python\n(.*?)```", doc.read_text(), flags=re.S):
        exec(compile(code, str(doc), "exec"), namespace)  # noqa: S102 - the project's own doc
    return namespace


def test_the_documented_hook_runs_on_its_cadence_and_accumulates_between():
    """LossPeak from docs/hooks.md logs every n steps the largest loss, seen through accumulate."""
    LossPeak = _blocks()["LossPeak"]
    hook = LossPeak(3)
    assert declared(hook).every == 3 and declared(hook).rank_consistent
    trace = pf.plan([hook], iters_per_epoch=6, max_epochs=1)
    assert [(e.step, e.effect.kind) for e in trace] == [(3, "peak"), (6, "peak")]


def test_the_documented_counting_hook_counts_steps():
    """count_steps from docs/hooks.md keeps the number of steps in its slot."""
    count_steps = _blocks()["count_steps"]
    from pimm_fn.core.plan import RecordingExecutor, initial_state, run_schedule

    hooks = pf.chain(count_steps)
    final = run_schedule(
        hooks, initial_state(hooks.hooks, iters_per_epoch=4, max_epochs=2), RecordingExecutor(lambda s, r: None)
    )
    assert final.slots == (8,)


def test_the_documented_update_hook_counts_steps_with_its_slot_handed_apart():
    """CountSteps from docs/hooks.md counts steps through update, and called plainly keeps its slot in state.slot."""
    CountSteps = _blocks()["CountSteps"]
    from pimm_fn.core.plan import RecordingExecutor, initial_state, run_schedule

    hooks = pf.chain(CountSteps())
    final = run_schedule(
        hooks, initial_state(hooks.hooks, iters_per_epoch=4, max_epochs=2), RecordingExecutor(lambda s, r: None)
    )
    assert final.slots == (8,) and declared(CountSteps()).update is not None
    state, effects = CountSteps()(final.with_slot(8), pf.events.AfterStep(9))
    assert state.slot == 9 and effects == ()


def test_the_documented_order_of_effects_is_the_plans():
    """The order docs/hooks.md shows for a step with an evaluation, a new best and a stop is what plan gives."""
    assert _blocks()["at_20"] == ["Log", "Evaluate", "Log", "WriteBest", "Stop", "Log"]


def _count_steps(state, event):
    if isinstance(event, pf.events.AfterStep):
        return state.with_slot((state.slot or 0) + 1), ()
    return state, ()


@pytest.mark.parametrize(
    "my_hook",
    [lambda: _count_steps, lambda: pf.early_stop("mIoU", patience=1)],
    ids=["a hook that counts", "a hook that stops early"],
)
def test_the_documented_property_test_of_your_own_hook_passes_as_written(my_hook):
    """docs/testing.md's test_my_hook passes for a plain hook and for one that stops training early."""
    namespace = _blocks(DOCS / "testing.md")
    namespace["my_hook"] = my_hook
    namespace["test_my_hook"]()


def test_the_documented_property_test_under_failures_passes_as_written():
    """docs/testing.md's test_my_stack_under_failures passes: the standard stacks under any membership."""
    _blocks(DOCS / "testing.md")["test_my_stack_under_failures"]()


def test_the_documented_effect_of_your_own_runs_through_its_handler_in_a_real_run(tmp_path, capsys):
    """SamplesEvery emits SaveSamples on its cadence; plan shows it and a real run's handler says its line on rank 0."""
    import torch

    blocks = _blocks()
    SamplesEvery, SaveSamples, save_samples = blocks["SamplesEvery"], blocks["SaveSamples"], blocks["save_samples"]
    assert [e.effect for e in pf.plan([SamplesEvery(2)], iters_per_epoch=4, max_epochs=1)] == [
        SaveSamples(2),
        SaveSamples(4),
    ]
    model = torch.nn.Linear(2, 1)
    data = [{"x": torch.ones(2)}] * 4
    run = pf.loop(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        data,
        hooks=[SamplesEvery(2)],
        max_epochs=1,
        step_fn=lambda model, optimizer, batch, scheduler=None, scaler=None: {},
        handlers={SaveSamples: save_samples},
        watching=pf.Watching(progress=False),
    )
    run()
    said = [line for line in capsys.readouterr().out.splitlines() if "samples of step" in line]
    assert said == ["[pimm_fn] 16 samples of step 2 from Linear", "[pimm_fn] 16 samples of step 4 from Linear"]


def test_the_documented_call_is_in_the_plan():
    """ask_for_samples' Call names show_samples in its module and carries its argument, at steps 500 and 1000."""
    calls = _blocks()["calls"]
    assert [(c.function, c.step, c.args, c.scope) for c in calls] == [
        ("docs_hooks:show_samples", 500, (16,), pf.Scope.MAIN),
        ("docs_hooks:show_samples", 1000, (16,), pf.Scope.MAIN),
    ]


PAGES = sorted(path for path in DOCS.rglob("*.md") if "reference" not in path.relative_to(DOCS).parts)
# A block fenced ```python runs; ```pycon runs as a doctest; ```python no-run (a cluster, a store, a pimm config:
# kept few) and any other fence are shown only.
FENCE = re.compile(r"^```(python|pycon)\n(.*?)^```", flags=re.S | re.M)


def _run_page(page: pathlib.Path) -> dict:
    """Each example of the page in order, in one namespace, as a reader would paste them."""
    namespace = {"__name__": f"docs_{page.stem.replace('-', '_')}"}
    text = page.read_text(encoding="utf-8")
    for block in FENCE.finditer(text):
        kind, code = block.groups()
        code = "\n" * text.count("\n", 0, block.start(2)) + code  # a traceback names the page's own line
        if kind == "python":
            exec(compile(code, str(page), "exec"), namespace)  # noqa: S102 - the project's own manual
            continue
        said = []
        test = doctest.DocTestParser().get_doctest(code, namespace, page.stem, str(page), 0)
        runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
        runner.run(test, out=said.append, clear_globs=False)
        assert not runner.failures, "".join(said)
    return namespace


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(DOCS)))
def test_every_example_of_the_page_runs_as_written(page, tmp_path, monkeypatch):
    """The page's python blocks run in one namespace in a fresh folder, and its doctests print what it shows."""
    import torch

    monkeypatch.chdir(tmp_path)  # runs/... of the examples land here
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: one thread is fastest, and a busy machine's cores stay free
    try:
        _run_page(page)
    finally:
        torch.set_num_threads(threads)


def test_the_pages_leave_few_examples_unrun():
    """Only a handful of blocks are shown without running (they need a cluster, a store or a pimm config)."""
    unrun = {str(page.relative_to(DOCS)): page.read_text(encoding="utf-8").count("```python no-run") for page in PAGES}
    assert sum(unrun.values()) <= 6, unrun
