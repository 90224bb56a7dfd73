"""Building the demo's StatefulDataLoader says nothing: torchdata's set_vital deprecation warning is not shown."""

import warnings

from pointcloud import make_loaders


def test_the_stateful_loader_is_built_without_a_warning():
    """make_loaders(stateful=True) emits no warning, set_vital's deprecation included, whatever the filters."""
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        loader, _ = make_loaders(8, 4, batch_size=2, seed=0, stateful=True, num_points=64)
        next(iter(loader))
    assert [str(w.message) for w in said] == []
