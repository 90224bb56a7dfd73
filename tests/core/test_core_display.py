"""Notebook displays of the core's values: compact summaries, while repr stays exact."""

import pickle

from IPython.lib.pretty import pretty

import pimm_fn as pf
from pimm_fn.core import summary as display
from pimm_fn.core.effects import Evaluate, Log, SaveCheckpoint, WriteBest
from pimm_fn.core.events import AfterStep, MetricsPublished
from pimm_fn.core.fold import TraceEntry
from pimm_fn.core.state import Progress, State
from pimm_fn.core.trace import Trace
from pimm_fn.hooks import BestState, SaveEveryState


def history(state, event):
    """A user hook keeping every step in its slot, as a hand-written history would."""
    return state, ()


def accuracy(model):
    """An evaluator, by name in the hooks' identities."""
    return {"acc": 0.5}


def _state(**changes) -> State:
    progress = Progress(5, 2, epoch=1, iter_in_epoch=3, global_step=8, samples_seen=64)
    slots = (None, SaveEveryState(6), BestState(-5.186985492706299, 8), tuple(float(i) for i in range(1000)))
    fields = dict(
        metrics={"score": -5.186985492706299}, best={"score": -5.186985492706299}, slots=slots, position="AfterStep"
    )
    return State(progress, **{**fields, **changes})


def test_state_str_is_a_short_summary_of_progress_metrics_best_and_slots():
    """str(State) shows step/total, epoch, metrics, best and each slot in a few short lines."""
    text = str(_state())
    assert text.splitlines()[:4] == [
        "State",
        "  progress: step 8/10, epoch 1 (iter 3/5), max_epochs=2, 64 samples; after AfterStep",
        "  metrics:  score=-5.187",
        "  best:     score=-5.187",
    ]
    assert "#1 SaveEveryState(last_saved=6)" in text and "#2 BestState(value=-5.187, step=8)" in text
    assert len(text.splitlines()) == 7 and max(map(len, text.splitlines())) <= 120  # a 1000-value slot is cut


def test_a_state_of_several_ranks_says_the_samples_of_every_rank():
    """samples_seen counts one rank's (64): the summary of a 2-rank state says the run's 128, and on how many ranks."""
    text = str(_state(rank=1, world_size=2))
    assert "  progress: step 8/10, epoch 1 (iter 3/5), max_epochs=2, 128 samples on 2 ranks; after AfterStep" in text


def test_state_repr_keeps_every_field_exactly():
    """repr(State) keeps every field, every digit included, one field a line, for debugging and run comparisons."""
    text = repr(_state())
    assert text.startswith("State(\n    progress=Progress(iters_per_epoch=5, ") and "-5.186985492706299" in text
    assert "999.0" in text and "position='AfterStep'" in text


def test_ipython_shows_a_state_as_its_summary_also_inside_a_list():
    """IPython's pretty printer prints the summary, its lines indented when the state sits in a container."""
    state = _state()
    assert pretty(state) == str(state)
    nested = pretty([state]).splitlines()
    assert nested[0] == "[State" and nested[1].startswith("   progress: step 8/10")


def test_state_summary_says_when_a_run_finished_or_stops():
    """The progress row names the lifecycle position: finished, stopping with its reason."""
    assert "; finished" in str(_state(position="AfterTrain"))
    assert "; stopping: plateau" in str(_state(stop="plateau"))
    assert "  rank:     1 of 4" in str(_state(rank=1, world_size=4)).splitlines()


def test_state_and_progress_html_show_a_progress_bar_and_escape_names():
    """_repr_html_ is a small table with a <progress> bar; metric names are escaped."""
    state = _state(metrics={"<b>": 1.0})
    page = state._repr_html_()
    assert '<progress value="8" max="10"></progress>' in page and "&lt;b&gt;=1" in page and "<b>=" not in page
    assert '<progress value="8" max="10">' in state.progress._repr_html_()


def test_progress_str_reads_as_one_line_and_repr_stays_exact():
    """str(Progress) is one readable line; repr is every field."""
    progress = Progress(10, 3, global_step=9, step_limit=25)
    assert str(progress) == "step 9/25, epoch 0 (iter 0/10), max_steps=25" == pretty(progress)
    assert repr(progress).endswith("step_limit=25)")


def test_trace_entry_repr_names_its_event_without_repeating_outputs_or_values():
    """A TraceEntry's repr leaves out the event's outputs and metric values (marked ...), the effect in full."""
    after = TraceEntry(4, AfterStep(4, {"loss": 0.123456789}, 8), Evaluate("val", 4), 0)
    published = TraceEntry(4, MetricsPublished({"acc": 0.5}, "val", 4), WriteBest("acc", 0.5, 4), 2)
    assert repr(after) == (
        "TraceEntry(step=4, event=AfterStep(step=4, ...), effect=Evaluate(evaluator='val', step=4, broadcast=True), "
        "hook=0)"
    )
    assert repr(published) == (
        "TraceEntry(step=4, event=MetricsPublished(source='val', step=4, ...), "
        "effect=WriteBest(metric='acc', value=0.5, step=4), hook=2)"
    )
    assert "0.123" not in repr(after)


def test_trace_compares_equal_to_lists_and_tuples_of_its_entries():
    """A Trace equals a list or tuple of the same entries both ways, hashes as its entries, and pickles."""
    entries = pf.plan([pf.save_every(2)], iters_per_epoch=2, max_epochs=2)
    trace = Trace(entries, hooks=["save_every(2)"])
    assert trace == entries == trace and list(entries) == trace == list(entries)
    assert trace != entries[:1] and Trace([]) == [] and [] == Trace(()) and trace != "not a trace"
    assert hash(trace) == hash(Trace(entries)) and pickle.loads(pickle.dumps(trace)) == trace
    assert isinstance(trace[:1], Trace) and trace[:1] == entries[:1] and trace[-1] == entries[-1]


def test_trace_displays_as_a_table_with_hooks_by_identity():
    """str, IPython and HTML show a trace as one row per effect: step, hook identity, event, compact effect."""
    hooks = [pf.evaluate_every(2, accuracy, name="val"), pf.best_on("acc"), pf.log_every(2)]
    labels = [display.hook_label(h) for h in hooks]
    trace = Trace(pf.plan(hooks, iters_per_epoch=2, max_epochs=1, metrics={2: {"acc": 0.5}}), labels)
    lines = str(trace).splitlines()
    assert lines[:4] == [
        "Trace: 5 effects, step 2",
        "  step  hook                                     event                                        effect",
        "  2     log_every(2)                             AfterStep(step=2, ...)                       "
        "Log(step=2, kind='train', values={'epoch': 0, 'iter': 2, 'of': 2, 'loss': 0})",
        "  2     evaluate_every(2, accuracy, name='val')  AfterStep(step=2, ...)                       "
        "Evaluate(evaluator='val', step=2)",
    ]
    assert pretty(trace) == str(trace) and trace._repr_html_().count("<tr>") == 6
    assert "best_on(&#x27;acc&#x27;)" in trace._repr_html_()


def test_a_long_trace_display_shows_its_ends_and_counts_the_rest():
    """A trace of many entries shows the first and last ten and says how many it left out."""
    trace = Trace(pf.plan([pf.save_every(1)], iters_per_epoch=50, max_epochs=1))
    lines = str(trace).splitlines()
    assert lines[0] == "Trace: 50 effects, steps 1 to 50" and len(lines) == 2 + 21
    assert "30 more entries" in lines[12] and lines[-1].split()[0] == "50"


def test_hooks_display_by_identity_never_by_address():
    """A function hook shows by its qualified name, an unnamed chain by its children, a named one by its name."""
    assert display.hook_label(history) == f"{__name__}.history"
    assert display.hook_label(pf.chain(pf.save_every(2), history)) == f"chain(save_every(2), {__name__}.history)"
    assert display.hook_label(pf.chain(history, name="progress")) == "progress"
    assert "0x" not in display.hook_label(pf.chain(pf.chain(history)))


def test_compact_values_leave_defaults_out_and_shorten_numbers():
    """compact() shows an attrs value's non-default fields, floats to 5 digits, and cuts long values."""
    assert display.compact(SaveCheckpoint(6, final=True)) == "SaveCheckpoint(step=6, final=True)"
    assert display.compact(Log(3, "train", {"loss": 1 / 3})) == "Log(step=3, kind='train', values={'loss': 0.33333})"
    assert display.compact(tuple(range(100)), width=20) == "(0, 1, 2, 3, 4, 5..."
