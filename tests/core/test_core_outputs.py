"""StepOutputs: a step's outputs named at once, read once on the first value asked for, closed with the step."""

import pickle

import pytest

from pimm_fn.core.events import AfterStep
from pimm_fn.core.frozen import FrozenMap
from pimm_fn.core.outputs import StepOutputs, StepOutputsClosed


def _counted(values):
    reads = []

    def reader():
        reads.append(1)
        return dict(values)

    return reads, reader


def test_names_and_membership_read_nothing():
    reads, reader = _counted({"loss": 0.5, "lr": 0.1})
    outputs = StepOutputs(3, ["loss", "lr"], reader)
    assert list(outputs) == ["loss", "lr"] and len(outputs) == 2 and "lr" in outputs and "acc" not in outputs
    assert reads == [] and not outputs.was_read


def test_the_first_value_asked_for_reads_every_value_once():
    reads, reader = _counted({"loss": 0.5, "lr": 0.1})
    outputs = StepOutputs(3, ["loss", "lr"], reader)
    assert outputs["loss"] == 0.5 and outputs["lr"] == 0.1 and dict(outputs) == {"loss": 0.5, "lr": 0.1}
    assert reads == [1]


def test_an_unknown_name_is_a_key_error_without_a_read():
    reads, reader = _counted({"loss": 0.5})
    with pytest.raises(KeyError):
        StepOutputs(3, ["loss"], reader)["acc"]
    assert reads == []


def test_asked_for_the_first_time_after_closing_it_says_how_to_keep_a_value():
    outputs = StepOutputs(7, ["loss"], lambda: {"loss": 0.5})
    outputs.close()
    with pytest.raises(StepOutputsClosed, match=r"step 7 \(loss\) were asked for after the step ended"):
        outputs["loss"]


def test_values_read_before_closing_stay():
    outputs = StepOutputs(7, ["loss"], lambda: {"loss": 0.5})
    assert outputs["loss"] == 0.5
    outputs.close()
    assert outputs["loss"] == 0.5


def test_a_reader_giving_other_than_floats_is_refused():
    with pytest.raises(TypeError, match="must read as floats"):
        StepOutputs(1, ["loss"], lambda: {"loss": 1})["loss"]


def test_after_step_keeps_a_view_as_it_is_and_freezes_any_other_mapping():
    outputs = StepOutputs(2, ["loss"], lambda: {"loss": 0.5})
    assert AfterStep(2, outputs).outputs is outputs and not outputs.was_read
    assert isinstance(AfterStep(2, {"loss": 0.5}).outputs, FrozenMap)


def test_views_of_the_same_step_compare_by_what_was_seen():
    read = StepOutputs(2, ["loss"], lambda: {"loss": 0.5})
    read["loss"]
    unread = StepOutputs(2, ["loss"], None)
    assert read == unread and hash(read) == hash(unread) and read == {"loss": 0.5}
    assert read != StepOutputs(3, ["loss"], None) and read != _read_view(2, 0.25)
    assert unread != {"loss": 0.5}  # closed unread: its values are unknown


def _read_view(step, loss):
    view = StepOutputs(step, ["loss"], lambda: {"loss": loss})
    view["loss"]
    return view


def test_pickled_it_keeps_what_it_holds_and_never_its_reader():
    read = pickle.loads(pickle.dumps(_read_view(4, 0.5)))
    assert read["loss"] == 0.5
    unread = pickle.loads(pickle.dumps(StepOutputs(4, ["loss"], lambda: {"loss": 0.5}.copy())))
    with pytest.raises(StepOutputsClosed):
        unread["loss"]


def test_kept_in_a_slot_it_is_stored_as_its_values_and_an_unread_one_says_why_not():
    from pimm_fn.core.codec import dumps, loads

    assert loads(dumps(_read_view(4, 0.5))) == FrozenMap({"loss": 0.5})
    with pytest.raises(StepOutputsClosed):
        dumps(StepOutputs(4, ["loss"], None))
