"""What a run, the CLI and plan do on a save_dir this process cannot write (run by test_read_only_save_dir.py).

``python _read_only_check.py SAVE_DIR EPOCHS`` prints one JSON document: the
finished run opened with resume='auto' (its step, history length), what a
run that would train raised, and the CLI's exit codes.
"""

import contextlib
import io
import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import _tiny_workload as tw  # noqa: E402

import pimm_fn as pf  # noqa: E402
from pimm_fn import cli  # noqa: E402


def main(save_dir: str, epochs: int) -> dict:
    found = {}
    try:
        _, run = tw.build(save_dir, resume="auto", max_epochs=epochs)
        found["opened"] = {
            "step": run.state.progress.global_step,
            "finished": run.finished,
            "history": len(run.history.records()),
            "evals": len(run.history.records("eval")),
        }
        run.run()  # nothing to do: writes nothing
    except Exception as exc:  # noqa: BLE001 - the test reads what was raised
        found["opened"] = f"{type(exc).__name__}: {exc}"
    try:
        tw.build(save_dir, resume="auto", max_epochs=epochs + 1)
        found["train"] = None
    except Exception as exc:  # noqa: BLE001
        found["train"] = [type(exc).__name__, str(exc)]
    codes = {}
    for command in (["ls", save_dir], ["inspect", f"{save_dir}/model/last"], ["verify", f"{save_dir}/model"]):
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as err:
            codes[command[0]] = [cli.main(command), err.getvalue()[-300:]]
    found["cli"] = codes
    found["plan"] = len(pf.plan(tw.standard_hooks(), iters_per_epoch=5, max_epochs=epochs))
    return found


if __name__ == "__main__":
    print("RESULT " + json.dumps(main(sys.argv[1], int(sys.argv[2]))), flush=True)
