"""Children forked from a zygote (unifiedamp._forks, unifiedamp._zygote) are what
``python -c`` makes of a script: output, exit status, environment, arguments, a timeout."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from unifiedamp import _forks

#: Not imported by a bare interpreter nor by the zygote: its presence shows the fork.
PRELOAD = ("fractions",)


def both(code, *argv, **kw):
    """The forked child's result and a plain interpreter's, for the same script."""
    forked = _forks.run_code(code, argv, preload=PRELOAD, **kw)
    plain = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True,
                           text=True, env=kw.get("env"))
    return forked, plain


def test_output_status_and_arguments_are_those_of_python_c():
    code = ("import sys; print('out', sys.argv); print('err', file=sys.stderr); "
            "sys.exit(int(sys.argv[1]))")
    forked, plain = both(code, "3", "x")
    assert (forked.returncode, forked.stdout, forked.stderr) == (
        plain.returncode, plain.stdout, plain.stderr) == (3, "out ['-c', '3', 'x']\n", "err\n")
    assert forked.args == [sys.executable, "-c", code, "3", "x"]


def test_an_uncaught_exception_and_a_signal_end_the_child_as_they_end_an_interpreter():
    forked, plain = both("raise ValueError('no good')")
    assert forked.returncode == plain.returncode == 1
    assert forked.stderr.splitlines()[-1] == plain.stderr.splitlines()[-1] == (
        "ValueError: no good")
    forked, plain = both("import os; os.abort()")
    assert forked.returncode == plain.returncode == -signal.SIGABRT


def test_the_child_has_its_own_environment_cwd_main_and_session_and_the_preload(tmp_path):
    code = ("import os, sys; print(os.environ.get('ONLY_HERE'), os.getcwd(), __name__, "
            "sys.path[0] == '', os.getsid(0) == os.getpid(), 'fractions' in sys.modules, "
            "os.getppid() == int(sys.argv[1]))")
    env = {**os.environ, "ONLY_HERE": "yes"}
    forked = _forks.run_code(code, [str(os.getpid())], preload=PRELOAD, env=env)
    assert forked.stdout.split() == ["yes", os.getcwd(), "__main__", "True", "True", "True",
                                     "False"], forked.stderr
    # the same zygote forks the next child with the same environment
    zygotes = {id(z) for z in _forks._zygotes.values()}
    _forks.run_code("pass", preload=PRELOAD, env=env)
    assert {id(z) for z in _forks._zygotes.values()} == zygotes
    # a preload that fails there: a plain interpreter, whose parent is this process
    plain = _forks.run_code(code, [str(os.getpid())], preload=("no_such_framework_here",))
    assert plain.stdout.split()[-2:] == ["False", "True"], plain.stderr


def test_a_timeout_kills_the_child_and_names_the_command():
    start = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired) as caught:
        _forks.run_code("import time; time.sleep(60)", preload=PRELOAD, timeout=1)
    assert time.monotonic() - start < 20
    assert caught.value.cmd[1:] == ["-c", "import time; time.sleep(60)"]


def test_an_idle_zygote_exits_and_the_next_child_starts_another(monkeypatch):
    monkeypatch.setattr(_forks, "IDLE_SECONDS", 0.5)
    env = {**os.environ, "IDLE_TEST": "1"}  # a zygote of this test's own
    assert _forks.run_code("print(1)", preload=PRELOAD, env=env).stdout == "1\n"
    zygote = _forks.zygote_for(PRELOAD, env)
    assert zygote is not None
    zygote.process.wait(timeout=30)  # exits by itself once idle
    assert _forks.run_code("print(2)", preload=PRELOAD, env=env).stdout == "2\n"
    assert _forks.zygote_for(PRELOAD, env) is not zygote
