"""Healing a replica from a live peer (``pimm_fn.runtime.replicas.heal``), in two real processes joined by gloo.

Rank 0 trains 7 steps of a run with Adam, a scheduler, an EMA, a saver, an
evaluator and a best, and sends its state; rank 1, built from another seed,
receives it into a fresh run. Both then train 9 steps more. Then rank 0
sends five states rank 1 must refuse: a skeleton cut in half, an unknown
format version, a model twice as wide, and an optimizer moment declared
larger than rank 1 holds (256 GB to a run whose Adam holds nothing yet; 4 MB
to one that holds it). Before all that, ranks 2 and 3 each start a
heal of rank 1 and end on the way (after the header; after three tensors).
In this process: a run interrupted mid-step neither sends nor receives.
"""

import pathlib
import sys

import numpy as np
import pytest
import torch

import pimm_fn as pf
from pimm_fn.runtime.replicas.heal import Healed, HealError, receive_state, send_state

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "distributed"))

from _launch import results, run_ranks  # noqa: E402
from _tiny_workload import FailsOnce, loader  # noqa: E402

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    """What each replica dumped, in rank order."""
    out = tmp_path_factory.mktemp("heal")
    worker = HERE / "_heal_workers.py"
    run_ranks("heal_pair", 4, out, script=worker, save_dir=str(out / "runs"), tag="heal", timeout=90).check()
    return results(out, "heal", 2)


def _differences(a, b, path="") -> list[str]:
    """Where two trees differ; tensors and arrays compared bit for bit, with their dtypes."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        same = isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype
        return [] if same and a.shape == b.shape and torch.equal(a, b) else [path]
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return [] if np.array_equal(a, b) and np.asarray(a).dtype == np.asarray(b).dtype else [path]
    if isinstance(a, dict) and isinstance(b, dict):
        if list(a) != list(b):
            return [f"{path} keys {list(a)} != {list(b)}"]
        return [d for k in a for d in _differences(a[k], b[k], f"{path}.{k}")]
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if type(a) is not type(b) or len(a) != len(b):
            return [path]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _differences(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: {a!r:.80} != {b!r:.80}"]


def test_the_healed_replica_holds_its_source_s_state_bit_for_bit(ranks):
    """Weights, optimizer, scheduler, EMA, the whole State (slots, progress, best, metrics), cursor and RNG."""
    source, healed = ranks
    assert _differences(source["at"], healed["at"]) == []
    state = healed["at"]["state"]
    assert state.progress.global_step == 7 and state.progress.iter_in_epoch == 7
    assert state.best and state.metrics and any(slot is not None for slot in state.slots)


def test_both_train_on_and_stay_bit_identical(ranks):
    """9 more steps (past the epoch's end, a save and evaluations) from the same data position and RNG."""
    source, healed = ranks
    assert healed["after"]["state"].progress.global_step == 16
    assert _differences(source["after"], healed["after"]) == []
    assert _differences(source["at"]["weights"], source["after"]["weights"]) != []  # they did train


def test_both_sides_say_what_was_sent_and_how_long_it_took(ranks):
    """The same document, tensors and bytes on both sides; the tensors are the weights and far more."""
    sent, received = ranks[0]["healed"], ranks[1]["healed"]
    assert isinstance(sent, Healed) and (sent.step, sent.peer, received.peer) == (7, 1, 0)
    what = lambda h: (h.step, h.json_bytes, h.tensors, h.tensor_bytes)  # noqa: E731
    assert what(sent) == what(received)
    weights = sum(t.numel() * t.element_size() for t in ranks[0]["at"]["weights"].values())
    assert sent.tensor_bytes > 3 * weights  # the weights, Adam's two moments, the EMA, the RNG states
    assert sent.json_bytes > 0 and 0 < sent.seconds < 30
    assert str(sent).startswith("step 7: ") and " tensors (" in str(sent)


def test_no_byte_of_the_peer_s_is_unpickled(ranks):
    """pickle's and torch's loaders are never called while the state is received."""
    assert ranks[1]["unpickled"] == []


def test_a_skeleton_cut_in_half_is_refused_on_both_sides(ranks):
    """The receiver says the state does not decode and what to do; the sender raises with that reason."""
    source, receiver = ranks[0]["damaged"], ranks[1]["damaged"]
    assert receiver is not None and "its state does not decode" in receiver and "resume='auto'" in receiver
    assert source is not None and source.startswith("rank 1 refused the state of step 16") and receiver in source


def test_an_unknown_format_version_is_refused(ranks):
    source, receiver = ranks[0]["version"], ranks[1]["version"]
    assert receiver is not None and "heal format 99" in receiver and "same version of pimm_fn" in receiver
    assert source is not None and receiver in source


def test_a_model_of_other_shapes_is_refused_naming_them(ranks):
    """Each weight of another shape named, with both shapes, and the fix."""
    source, receiver = ranks[0]["wide"], ranks[1]["wide"]
    assert receiver is not None and "its run does not fit this one" in receiver
    assert "body.0.weight: [32, 8] sent, [16, 8] here" in receiver and "the same model" in receiver
    assert source is not None and receiver in source


def test_a_refused_heal_changes_nothing(ranks):
    assert _differences(ranks[1]["before"], ranks[1]["unchanged"]) == []
    assert _differences(ranks[1]["trained before"], ranks[1]["trained unchanged"]) == []


def test_a_huge_declared_tensor_is_refused_before_anything_is_allocated(ranks):
    """256 GB declared to a run whose Adam holds no state yet: refused by its room (its own state and Adam's), the
    largest tensor named; a buffer that size would not even be allocated."""
    source, receiver = ranks[0]["huge"], ranks[1]["huge"]
    assert receiver is not None and "it declares 24 tensors of 256.0 GB" in receiver
    assert "the largest float32 [68719476736], 256.0 GB" in receiver and "Refused before allocating any" in receiver
    assert "4 parameters without optimizer state" in receiver and "extra state without tensors: ['ema']" in receiver
    assert source is not None and source.startswith("rank 1 refused the state of step 16 after the document")


def test_an_optimizer_state_larger_than_the_one_held_is_refused(ranks):
    """A run whose Adam holds its moments takes what it holds and 1 MB more: a 4 MB moment is refused."""
    source, receiver = ranks[0]["swollen"], ranks[1]["swollen"]
    assert receiver is not None and "(the largest float32 [1024, 1024], 4.0 MB)" in receiver
    assert "0 parameters without optimizer state (0 B); extra state without tensors: none" in receiver
    assert source is not None and receiver in source


def test_a_heal_cut_on_the_way_changes_nothing_and_a_later_one_heals(ranks):
    """The sender ended after its header, and after three of its tensors: a HealCut saying where, the run as it
    was; the heal from rank 0 after them holds its state bit for bit (the tests above)."""
    after_header, mid_tensors = ranks[1]["cuts"]
    assert after_header is not None and after_header.startswith(
        "the heal from rank 2 was cut while receiving the document"
    )
    assert mid_tensors is not None and mid_tensors.startswith(
        "the heal from rank 3 was cut while receiving tensor 4 of 7"
    )
    assert "nothing of its state was loaded here: heal again" in mid_tensors
    assert _differences(ranks[1]["before cuts"], ranks[1]["after cuts"]) == []
    assert _differences(ranks[0]["at"], ranks[1]["at"]) == []


class Unused:
    """A process group no message may go through."""

    def send(self, tensors, dst, tag):
        raise AssertionError("a message was sent")

    recv = send


@pytest.mark.parametrize("heal", [send_state, receive_state])
def test_a_run_interrupted_mid_step_neither_sends_nor_receives(heal):
    """Its state is half a step's: refused before any message, with the fix."""
    model = FailsOnce(at=3)
    run = pf.loop(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        loader(),
        max_epochs=1,
        watching=pf.Watching(console=False, progress=False),
    )
    with pytest.raises(RuntimeError, match="a failing forward"):
        run.run()
    with pytest.raises(
        HealError, match=r"while step 3 is interrupted \(the train step\): complete it with run.step\(\) first"
    ):
        heal(run, 1, Unused())
