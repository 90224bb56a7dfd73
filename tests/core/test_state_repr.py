"""repr(state): exact (every field, every digit, evaluates back to an equal State), one field a line."""

import pimm_fn as pf
from pimm_fn.core.frozen import FrozenMap
from pimm_fn.core.state import Progress, State
from pimm_fn.hooks.checkpointing import BestState, SaveEveryState


def test_repr_of_a_state_reads_one_field_a_line_and_evaluates_back():
    """Each field on its own line, each slot on its own line, no line over 130 characters; eval gives it back."""
    state = State(
        Progress(iters_per_epoch=5, max_epochs=2, global_step=7),
        metrics={"score": -5.326267719268799},
        best={"score": -5.326267719268799},
        slots=(None, SaveEveryState(last_saved=6), BestState(value=-5.326267719268799, step=4)),
    )
    text = repr(state)
    lines = text.splitlines()
    assert lines[0] == "State(" and lines[-1] == ")" and max(map(len, lines)) <= 130
    assert "    metrics=FrozenMap({'score': -5.326267719268799})," in lines
    assert lines[lines.index("    slots=(") + 1 : lines.index("    slots=(") + 4] == [
        "        None,",
        f"        {SaveEveryState(last_saved=6)!r},",
        "        BestState(value=-5.326267719268799, step=4),",
    ]
    assert (
        eval(
            text,
            {
                "State": State,
                "Progress": Progress,
                "FrozenMap": FrozenMap,
                "SaveEveryState": SaveEveryState,
                "BestState": BestState,
            },
        )
        == state
    )
    assert pf.State is State
