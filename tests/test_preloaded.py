"""The test processes forked preloaded (``tests/_preloaded``) behave as the scripts' own interpreters would."""

import json
import os
import signal
import subprocess
import textwrap

import _preloaded as preloaded
import pytest

TIMEOUT = 60


def _script(tmp_path, body: str):
    path = tmp_path / "script.py"
    path.write_text(textwrap.dedent(body))
    return path


def _run(tmp_path, body: str, *args, **options) -> subprocess.CompletedProcess:
    return preloaded.run([_script(tmp_path, body), *args], timeout=TIMEOUT, **options)


def test_a_script_runs_as_main_with_its_own_arguments_environment_directory_and_folder_on_the_path(tmp_path):
    (tmp_path / "beside.py").write_text("VALUE = 'found beside the script'\n")
    work = tmp_path / "work"
    work.mkdir()
    done = _run(
        tmp_path,
        """
        import json, os, sys
        import beside
        print(json.dumps([__name__, sys.argv[1:], os.environ.get("ASKED"), os.getcwd(), beside.VALUE]))
        """,
        "a",
        2,
        env={**os.environ, "ASKED": "yes"},
        cwd=work,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == ["__main__", ["a", "2"], "yes", str(work), "found beside the script"]
    assert "ASKED" not in os.environ


@pytest.mark.parametrize(
    "body, code, said",
    [
        ("import sys; sys.exit(3)", 3, ""),
        ("import sys; sys.exit('a message')", 1, "a message"),
        ("raise ValueError('broken')", 1, "ValueError: broken"),
        ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", -signal.SIGKILL, ""),
    ],
    ids=["exit-3", "exit-message", "exception", "sigkill"],
)
def test_the_exit_code_is_the_interpreters(tmp_path, body, code, said):
    done = _run(tmp_path, body)
    assert done.returncode == code and said in done.stderr, done


def test_atexit_handlers_run_and_unflushed_output_is_written(tmp_path):
    done = _run(
        tmp_path,
        """
        import atexit, sys
        atexit.register(lambda: print("at exit"))
        sys.stdout.write("no newline, ")
        sys.stderr.write("on stderr")
        """,
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "no newline, at exit\n", "on stderr")


def test_each_process_draws_its_own_random_numbers(tmp_path):
    body = "import random; print(random.random())"
    assert _run(tmp_path, body).stdout != _run(tmp_path, body).stdout


def test_fresh_interpreters_take_the_hash_seed_they_are_given(tmp_path):
    script = _script(tmp_path, "print(hash('rank'))")
    seen = []
    for seed in ("1", "2", "1"):
        out = tmp_path / f"seed{len(seen)}.log"
        process = preloaded.start(
            [script], env={**os.environ, "PYTHONHASHSEED": seed}, stdout=out, fresh_interpreter=True
        )
        assert process.wait(TIMEOUT) == 0, out.read_text()
        seen.append(out.read_text())
    assert seen[0] == seen[2] != seen[1]


def test_a_process_past_its_timeout_is_killed_and_says_what_it_wrote(tmp_path):
    script = _script(tmp_path, "import time; print('started', flush=True); time.sleep(60)")
    with pytest.raises(subprocess.TimeoutExpired) as raised:
        preloaded.run([script], timeout=2)
    assert raised.value.output == "started\n"


def test_the_forked_process_is_not_the_test_process(tmp_path):
    done = _run(tmp_path, "import os; print(os.getpid(), os.getppid())")
    pid, parent = map(int, done.stdout.split())
    assert pid != os.getpid() and parent != os.getpid()  # a child of the fork server, not of this process
