"""``python -m pimm_fn``: the checkpoint and plan commands of :mod:`pimm_fn.cli`."""

import sys

from pimm_fn.cli import main

if __name__ == "__main__":
    sys.exit(main())
