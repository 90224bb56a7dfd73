"""Make ``examples/`` importable so tests can ``import pointcloud``."""

import pathlib
import sys

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"
if str(EXAMPLES) not in sys.path:
    sys.path.insert(0, str(EXAMPLES))
