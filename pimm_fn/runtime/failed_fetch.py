"""After a fetch raised: the iterator a feed puts in place so that the next fetch rebuilds it at the cursor.

See ``pimm_fn.runtime.feed`` (a fetch that raises loses no batch).
"""

from pimm_fn.runtime.rng import set_torch_rng

__all__ = ["ReopenAtCursor"]


class ReopenAtCursor:
    """The iterator of a feed whose last fetch raised: the next fetch first rebuilds it at the cursor.

    The feed rebuilds it the way the failed iterator was opened, past the
    batches given before (``Feed.reopen_at_cursor``); then ``rng``, the torch
    RNG from before the failed fetch, is put back (``None`` when the loader
    fetches in worker processes, which draw nothing here). If that raises
    too, it stays in place for the fetch after.
    """

    def __init__(self, feed, rng):
        self.feed = feed
        self.rng = rng

    def reopen(self):
        iterator = self.feed.reopen_at_cursor()  # when it raises, this one is still in place
        if self.rng is not None:
            set_torch_rng(self.rng)
        return iterator

    def __iter__(self):
        return self

    def __next__(self):
        iterator = self.reopen()
        try:
            return next(iterator)
        except BaseException:
            self.feed.put_back(self)  # the retry starts from this fetch's cursor and RNG again
            raise
