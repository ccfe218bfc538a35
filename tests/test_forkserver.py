"""The fork servers that run the tests' scripts (tests/_forkserver.py) give what ``python -c``
gives: the same return code, stdout and stderr, in the script's cwd and environment."""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

import _forkserver
import pytest
from _forkserver import HEAVY, ForkServerError, ForkServers, preload_of

NUMPY = "import numpy\n"
#: A framework of the tests' own, preloaded like a heavy one: it prints at import, from
#: Python and below it, and logs the order the frameworks were imported in.
FAKE_FRAMEWORK = """
import os, sys
print("fakefw: imported")
print("fakefw: a warning", file=sys.stderr)
sys.stdout.flush()
os.write(2, b"fakefw: from C\\n")
ORDER = [m for m in ("numpy", "fakefw") if m in sys.modules]
"""


def plain(code: str, *args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          **kwargs)


def result(proc: subprocess.CompletedProcess) -> tuple:
    return proc.args, proc.returncode, proc.stdout, proc.stderr


@pytest.fixture(scope="module", params=["own", "shared"])
def servers(request, tmp_path_factory):
    # A server of this process's own, and a session of a shared one (as run_python's).
    shared = tmp_path_factory.mktemp("shared") if request.param == "shared" else None
    servers = ForkServers(shared=shared)
    assert servers.shared or not shared
    servers.run(NUMPY)  # started before the timed tests
    yield servers
    servers.close()


@pytest.fixture
def own_servers():
    servers = ForkServers()
    yield servers
    servers.close()


SCRIPTS = {
    "prints": NUMPY + "import sys\nprint('out')\nprint('err', file=sys.stderr)",
    "raises": NUMPY + textwrap.dedent("""
        def check():
            try:
                1 / 0
            except ZeroDivisionError as error:
                raise ValueError("the value") from error
        check()
    """),
    "exits-3": NUMPY + "import sys\nprint('before')\nsys.exit(3)",
    "exits-with-a-message": NUMPY + "import sys\nsys.exit('stopped here')",
    "atexit": NUMPY + "import atexit\natexit.register(print, 'atexit ran')\nprint('main')",
    "thread-outlives-main": NUMPY + textwrap.dedent("""
        import threading, time
        def late():
            time.sleep(0.3)
            print("thread done")
        threading.Thread(target=late).start()
        print("main done")
    """),
    "own-excepthook": NUMPY + "import sys\nsys.excepthook = lambda *e: print('hook', e[0])\n"
                              "raise OSError(2, 'gone')",
    "keyboard-interrupt-code": NUMPY + "import sys\nsys.stderr = None\nraise KeyboardInterrupt",
    "syntax-error": NUMPY + "def f(:\n",
    "main-module": NUMPY + "import sys\nprint(__name__, sys.argv, sorted(globals()), __doc__, "
                           "__spec__, __package__, __loader__, '__file__' in globals())",
    "docstring": "'''Module doc.'''\n" + NUMPY + "print(__doc__)",
    "streams": NUMPY + "import os, sys\nprint(repr(sys.stdin.read()), sys.stdout.isatty(), "
                       "sys.stdout.line_buffering, sys.stderr.line_buffering, sys.stdout.encoding,"
                       " os.isatty(0))",
    "large-output": NUMPY + "import sys\nsys.stdout.write('x' * 300_000)\n"
                            "sys.stderr.write('y\\r\\n' * 100_000)",
    "segfault": NUMPY + "import ctypes\nctypes.string_at(0)",
    "name-never-imported": "import numpy as np\nprint(numpy)",
}


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_a_forked_script_gives_what_python_c_gives(name, servers):
    code = SCRIPTS[name]
    forked = servers.forked
    fork = servers.run(code)
    if name != "syntax-error":  # which does not compile: plain, where it fails as it should
        assert servers.forked == forked + 1, "not run in a fork"
    assert result(fork) == result(plain(code, stdin=subprocess.DEVNULL))


def test_a_script_gets_its_arguments_as_python_c_gives_them(servers):
    code = NUMPY + "import sys\nprint(sys.argv, sys.orig_argv[3:])"
    args = ("a", "b c", "-c")
    fork = servers.run(code, args=args)
    assert result(fork) == result(plain(code, *args, stdin=subprocess.DEVNULL))
    assert fork.stdout == f"{['-c', *args]} {list(args)}\n"


def test_what_the_scripts_above_give():
    # The comparison above holds for these, not only for scripts that succeed.
    assert plain(SCRIPTS["exits-3"]).returncode == 3
    raised = plain(SCRIPTS["raises"])
    assert raised.returncode == 1 and "ZeroDivisionError" in raised.stderr
    assert raised.stderr.splitlines()[-1] == "ValueError: the value"
    assert plain(SCRIPTS["segfault"]).returncode == -signal.SIGSEGV
    assert plain(SCRIPTS["keyboard-interrupt-code"]).returncode == -signal.SIGINT
    assert "NameError: name 'numpy' is not defined" in plain(SCRIPTS["name-never-imported"]).stderr
    assert plain(SCRIPTS["atexit"]).stdout == "main\natexit ran\n"


def test_a_name_the_server_imported_is_not_defined_in_the_script(servers):
    servers.run("import numpy as np\n")
    proc = servers.run("import numpy\nprint(np.zeros(1))")
    assert proc.returncode == 1
    assert proc.stderr.splitlines()[-1] == "NameError: name 'np' is not defined"


def test_the_child_gets_its_cwd_and_exactly_its_environment(servers, tmp_path):
    code = NUMPY + "import json, os\nprint(json.dumps([os.getcwd(), dict(os.environ)]))"
    proc = servers.run(code, env={"UNIFIEDAMP_FORK_PROBE": "yes"}, cwd=tmp_path)
    cwd, env = json.loads(proc.stdout)
    assert cwd == str(tmp_path)
    assert env == {**os.environ, "UNIFIEDAMP_FORK_PROBE": "yes"}


def test_the_imports_run_with_the_scripts_environment(own_servers):
    # The hash seed is read when the interpreter starts: the server started with it.
    code = NUMPY + "import sys\nprint(hash('unifiedamp'), sys.flags.hash_randomization)"
    for seed in ("1", "2"):
        fork = own_servers.run(code, env={"PYTHONHASHSEED": seed})
        assert result(fork) == result(plain(code, env={**os.environ, "PYTHONHASHSEED": seed}))
    assert len(own_servers.alive()) == 2


def test_numpy_draws_other_numbers_in_each_child(servers):
    # Seeded when numpy.random is imported (torch and tensorflow import it): by the server.
    code = "import numpy.random\nprint(numpy.random.rand())"
    assert len({servers.run(code).stdout for _ in range(3)}) == 3


def test_what_the_imports_print_comes_first_in_each_script(tmp_path):
    (tmp_path / "fakefw.py").write_text(FAKE_FRAMEWORK)
    servers = ForkServers(heavy=HEAVY | {"fakefw"})
    env = {"PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    code = "import numpy\nimport fakefw\nprint('script', fakefw.ORDER)"
    try:
        for _ in range(2):
            fork = servers.run(code, env=env)
            assert servers.forked and list(servers.alive().values()) == [
                (("numpy", None), ("fakefw", None))]
            assert result(fork) == result(plain(code, env={**os.environ, **env}))
        assert fork.stdout == "fakefw: imported\nscript ['numpy', 'fakefw']\n"
        assert fork.stderr == "fakefw: a warning\nfakefw: from C\n"
    finally:
        servers.close()


#: A framework that says at import what the environment held then.
READS_ENVIRONMENT = "import os\nAT_IMPORT = os.environ.get('FAKEFW_MODE')\n"


def test_variables_set_before_the_imports_are_the_servers_when_it_imports(tmp_path):
    (tmp_path / "fakefw.py").write_text(READS_ENVIRONMENT)
    servers = ForkServers(heavy=HEAVY | {"fakefw"})
    env = {"PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    script = ("import os\n\nos.environ['FAKEFW_MODE'] = {!r}  # before fakefw\nimport fakefw\n"
              "print(fakefw.AT_IMPORT, os.environ['FAKEFW_MODE'])")
    try:
        for mode in ("a", "b", "a"):
            code = script.format(mode)
            fork = servers.run(code, env=env)
            assert result(fork) == result(plain(code, env={**os.environ, **env}))
            assert fork.stdout == f"{mode} {mode}\n", fork.stderr
        assert servers.forked == 3 and len(servers.alive()) == 2  # one server per value
        # A variable the interpreter reads at its start ends the leading statements.
        code = "import os\nos.environ['PYTHONHASHSEED'] = '0'\nimport fakefw\n"
        assert preload_of(code, HEAVY | {"fakefw"}) == ()
        assert servers.run(code, env=env).returncode == 0 and servers.forked == 3
    finally:
        servers.close()


COUNTED = "import os\nwith open(os.environ['FAKEFW_LOG'], 'a') as log:\n    log.write('x')\n"


def test_the_processes_sharing_a_folder_share_its_servers(tmp_path, monkeypatch):
    # fakefw counts its imports: one server imports it for both; the next server, once
    # the first has exited (idle, with no session), imports it again.
    monkeypatch.setattr(_forkserver, "SHARED_IDLE_SECONDS", 1.0)
    (tmp_path / "fakefw.py").write_text(COUNTED)
    count = tmp_path / "imports"
    env = {"PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "FAKEFW_LOG": str(count), "PYTEST_XDIST_WORKER": "gw0"}
    code = "import fakefw\nimport os\nprint(os.environ['PYTEST_XDIST_WORKER'])"
    shared = tempfile.mkdtemp(prefix="fs-")  # short: a socket's path is at most 107 bytes
    one, two = (ForkServers(heavy=HEAVY | {"fakefw"}, shared=shared) for _ in range(2))
    assert one.shared == shared
    try:
        assert one.run(code, env=env).stdout == "gw0\n"
        assert two.run(code, env={**env, "PYTEST_XDIST_WORKER": "gw1"}).stdout == "gw1\n"
        assert one.forked == two.forked == 1 and count.read_text() == "x"
        (socket,) = pathlib.Path(shared).glob("*.sock")
    finally:
        one.close()
        two.close()
    for _ in range(100):  # both sessions closed: the server exits after a second
        if not socket.exists():
            break
        time.sleep(0.1)
    assert not socket.exists()
    three = ForkServers(heavy=HEAVY | {"fakefw"}, shared=shared)
    try:
        assert three.run(code, env=env).stdout == "gw0\n" and count.read_text() == "xx"
    finally:
        three.close()
        shutil.rmtree(shared)


def test_a_process_forks_from_the_server_another_started_for_the_start_of_its_imports(
        tmp_path):
    # fakefw imports fakesub, not fakeother: "import fakefw, fakesub" is forked from the
    # server the first process started for "import fakefw"; "import fakefw, fakeother"
    # is not (fakeother would be imported in the child), and gets a server of its own.
    (tmp_path / "fakefw.py").write_text(COUNTED + "import fakesub\n")
    for name in ("fakesub", "fakeother"):
        (tmp_path / f"{name}.py").write_text("")
    count = tmp_path / "imports"
    env = {"PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "FAKEFW_LOG": str(count)}
    heavy = HEAVY | {"fakefw", "fakesub", "fakeother"}
    shared = tempfile.mkdtemp(prefix="fs-")  # short: a socket's path is at most 107 bytes
    one, two = (ForkServers(heavy=heavy, shared=shared) for _ in range(2))
    try:
        assert one.run("import fakefw\n", env=env).returncode == 0
        code = "import fakefw\nimport {}\nimport sys\nprint('fakeother' in sys.modules)"
        proc = two.run(code.format("fakesub"), env=env)
        assert proc.stdout == "False\n" and two.forked == 1, proc.stderr
        assert count.read_text() == "x" and len(list(pathlib.Path(shared).glob("*.sock"))) == 1
        proc = two.run(code.format("fakeother"), env=env)
        assert proc.stdout == "True\n" and count.read_text() == "xx", proc.stderr
        assert len(list(pathlib.Path(shared).glob("*.sock"))) == 2
    finally:
        one.close()
        two.close()
        shutil.rmtree(shared)


def test_a_script_that_does_not_start_with_imports_runs_in_a_plain_interpreter(own_servers):
    code = "x = 1\nimport numpy, os\nprint(os.getppid())"
    assert preload_of(code) == ()
    assert int(own_servers.run(code).stdout) == os.getpid()
    assert own_servers.alive() == {} and own_servers.forked == 0
    # Its imports first, it is forked from the server.
    code = "import numpy, os\nprint(os.getppid())"
    assert int(own_servers.run(code).stdout) in own_servers.alive()


def test_the_preload_ends_where_another_package_is_imported():
    assert preload_of("import torch\nimport unifiedamp\nimport keras") == (("torch", None),)
    assert preload_of("import os, tempfile\nfrom torch import nn\n") == (("torch", ("nn",)),)
    assert preload_of("import unifiedamp, torch") == ()
    assert preload_of("import numpy\ndef f(:\n") == ()  # does not compile


def test_a_script_is_not_forked_from_a_server_that_imported_more(own_servers):
    pytest.importorskip("jax")
    assert "jax" in own_servers.run("import numpy\nimport jax\nimport sys\n"
                                    "print(list(sys.modules))").stdout
    proc = own_servers.run("import numpy\nimport sys\nprint('jax' in sys.modules)")
    assert proc.stdout == "False\n"
    # The first script's numpy import is jax's in its server (jax imports numpy).
    assert sorted(own_servers.alive().values()) == [(("jax", None),), (("numpy", None),)]


def test_a_script_importing_numpy_first_is_forked_from_the_frameworks_server(own_servers):
    pytest.importorskip("jax")
    code = "import numpy as np\nimport jax\nimport sys\nprint(sorted(m for m in sys.modules " \
           "if m in ('jax', 'numpy')), np.__name__)"
    assert result(own_servers.run(code)) == result(plain(code))
    assert list(own_servers.alive().values()) == [(("jax", None),)]
    assert own_servers.run("import jax\nprint('again')").stdout == "again\n"
    assert own_servers.forked == 2 and len(own_servers.alive()) == 1


def test_a_server_stops_importing_where_the_rest_is_imported_already(own_servers):
    pytest.importorskip("jax")
    # jax imports numpy: the server for "import jax; import numpy" is a server for jax.
    code = "import jax\nimport numpy\nimport sys\nprint([m for m in sys.modules if m in " \
           "('jax', 'numpy')])"
    assert result(own_servers.run(code)) == result(plain(code))
    assert list(own_servers.alive().values()) == [(("jax", None),)]
    own_servers.run("import jax\n")
    assert own_servers.forked == 2 and len(own_servers.alive()) == 1


def test_a_timeout_kills_the_child_and_names_the_script(servers):
    code = NUMPY + "import os, time\nprint(os.getpid(), flush=True)\ntime.sleep(60)"
    with pytest.raises(subprocess.TimeoutExpired) as timed_out:
        servers.run(code, timeout=3)
    assert timed_out.value.cmd == [sys.executable, "-c", code] and timed_out.value.timeout == 3
    with pytest.raises(ProcessLookupError):  # killed, and reaped by the server
        os.kill(int(timed_out.value.stdout), 0)
    assert servers.run(NUMPY + "print('next')").stdout == "next\n"


def test_a_server_that_dies_is_reported_then_started_again(own_servers):
    code = NUMPY + "import os, signal, time\nos.kill(os.getppid(), signal.SIGKILL)\ntime.sleep(1)"
    with pytest.raises(ForkServerError, match="exited while its child .* ran the script"):
        own_servers.run(code)
    assert own_servers.alive() == {}
    assert own_servers.run(NUMPY + "print('again')").stdout == "again\n"
    # Killed between two scripts: started again without a word.
    (pid,) = own_servers.alive()
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)  # dead for sure when the next script comes
    assert own_servers.run(NUMPY + "print('and again')").stdout == "and again\n"
    assert list(own_servers.alive()) != [pid]


def test_a_preload_that_fails_runs_the_script_plain(own_servers):
    code = "import numpy.no_such_module\nprint('unreached')"
    assert result(own_servers.run(code)) == result(plain(code))
    assert own_servers.forked == 0 and own_servers.alive() == {}
    assert "No module named 'numpy.no_such_module'" in "".join(own_servers.unforkable.values())


def test_run_python_forks_unless_asked_for_a_fresh_interpreter(run_python):
    code = NUMPY + "import os\nprint(os.getppid())"
    assert int(run_python(code).stdout) != os.getpid()
    assert int(run_python(code, fresh=True).stdout) == os.getpid()


frameworks = pytest.mark.skipif(
    not all(importlib.util.find_spec(m) for m in ("paddle", "tensorflow")),
    reason="paddle and tensorflow are not both installed")


@frameworks
def test_paddle_then_tensorflow_are_preloaded_in_that_order(own_servers):
    code = ("import paddle\nimport tensorflow\nimport sys\nnames = list(sys.modules)\n"
            "print(names.index('paddle') < names.index('tensorflow'))")
    proc = own_servers.run(code)
    assert proc.returncode == 0 and proc.stdout.splitlines()[-1] == "True", proc.stderr[-2000:]
    assert list(own_servers.alive().values()) == [(("paddle", None), ("tensorflow", None))]


def test_a_server_that_crashes_while_importing_runs_the_script_plain(tmp_path):
    # A framework whose import segfaults (as paddle's does after tensorflow's): in the
    # server, then in the plain run, which shows the crash as it happens.
    (tmp_path / "fakefw.py").write_text("import ctypes\nctypes.string_at(0)\n")
    servers = ForkServers(heavy=HEAVY | {"fakefw"})
    env = {"PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    code = "import numpy\nimport fakefw\nprint('unreached')"
    try:
        proc = servers.run(code, env=env)
        assert result(proc) == result(plain(code, env={**os.environ, **env}))
        assert proc.returncode == -signal.SIGSEGV and not proc.stdout
        assert servers.forked == 0 and servers.alive() == {}
        assert re.search(r"exited with -\d+ while importing", "".join(servers.unforkable.values()))
    finally:
        servers.close()
