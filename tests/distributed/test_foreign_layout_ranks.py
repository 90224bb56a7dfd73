"""On two gloo ranks a run resumes another layout through the reader its handlers carry, and refuses a fresh start
over it, alike on every rank; rank 0 alone is asked, and never where pimm_fn's own checkpoint is found
(``_foreign_workers:foreign``, one launch)."""

import pytest

from _launch import results, run_ranks

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("foreign")
    run_ranks(
        "_foreign_workers:foreign", 2, out, timeout=150, grace=20, save_dir=str(out / "runs"), tag="foreign"
    ).check()
    return results(out, "foreign", 2)


def test_every_rank_resumes_and_refuses_alike(ranks):
    """'auto' and a path resume the toy layout's checkpoint (step 6) on both ranks; a fresh run over it is refused
    with the same message on both; over pimm_fn's own checkpoint or nothing, both ranks agree too."""
    first, second = ranks
    for case in ("auto over toy", "path to toy", "fresh over toy", "auto over ours", "auto over nothing"):
        assert first[case] == second[case], case
    steps = [first[case] for case in ("auto over toy", "path to toy", "auto over ours", "auto over nothing")]
    assert steps == [6, 6, 6, 0]
    assert "already holds toy checkpoints (model)" in first["fresh over toy"]


def test_rank_zero_alone_is_asked_and_only_where_nothing_of_ours_is(ranks):
    """The reader looks on rank 0 only: for the toy save_dir three times, for the empty one once, never for ours."""
    assert ranks[0]["looks"] == ["model"] * 4 and ranks[1]["looks"] == []
