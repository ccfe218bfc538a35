"""``unifiedamp port`` on files: atomic writes, the file's own bytes kept, clear errors.

The command runs in this process (``unifiedamp.cli.main``) except where the test needs a
process of its own: a file-size limit, a SIGKILL while writing, a parser that could crash.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("libcst")

from unifiedamp.cli import main  # noqa: E402
from unifiedamp.porting import port_source  # noqa: E402

# The shape of nanoGPT's train.py: the scaler built at module level among other statements.
SCRIPT = textwrap.dedent("""\
    \"\"\"Training script.\"\"\"
    import os
    import torch

    dtype = 'float16'
    # initialize a GradScaler. If enabled=False scaler is a no-op
    scaler = torch.cuda.amp.GradScaler(enabled=(dtype == 'float16'))
    out_dir = os.path.join('out', 'run')
""")


def big_script(size: int = 20_015) -> bytes:
    """SCRIPT padded with comment lines to ``size`` bytes."""
    data = SCRIPT.encode()
    line = b"# " + b"x" * 77 + b"\n"
    while len(data) + len(line) <= size:
        data += line
    return data + b"#" * (size - len(data) - 1) + b"\n"


@pytest.fixture
def port(capsysbinary):
    """``port(*args) -> (exit status, stdout bytes, stderr text)``, in this process."""

    def run(*args):
        try:
            status = main(["port", *map(str, args)])
        except SystemExit as exc:  # argparse's usage errors
            status = exc.code
        out, err = capsysbinary.readouterr()
        return status, out, err.decode()

    return run


def child(code: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True,
                          text=True, timeout=300)


# ================================================================ writes are atomic

UNDER_FSIZE = """
import resource, sys
from unifiedamp.cli import main
resource.setrlimit(resource.RLIMIT_FSIZE, (8192, 8192))
sys.exit(main(["port", sys.argv[1], "--to", "paddle", "--in-place"]))
"""


def test_in_place_under_a_file_size_limit_leaves_the_original_whole_and_no_temp_file(tmp_path):
    path = tmp_path / "train.py"
    original = big_script()
    path.write_bytes(original)
    proc = child(UNDER_FSIZE, str(path))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(f"unifiedamp port: cannot write {path}: File too large")
    assert "Traceback" not in proc.stderr
    assert path.read_bytes() == original
    assert os.listdir(tmp_path) == ["train.py"]


KILLED_WHILE_WRITING = """
import contextlib, os, signal, sys
from unifiedamp import _atomic_write
from unifiedamp.cli import main
atomic_path = _atomic_write.atomic_path

@contextlib.contextmanager
def killed_half_way(path, suffix=""):
    with atomic_path(path, suffix) as tmp:
        with open(tmp, "wb") as f:
            f.write(b"scaler = paddle.amp.Grad")
        os.kill(os.getpid(), signal.SIGKILL)
        yield tmp

_atomic_write.atomic_path = killed_half_way
sys.exit(main(["port", sys.argv[1], "--to", "paddle", "--in-place"]))
"""


def test_a_port_killed_while_writing_leaves_the_original_and_the_next_run_cleans_up(
        tmp_path, port):
    path = tmp_path / "train.py"
    path.write_text(SCRIPT)
    proc = child(KILLED_WHILE_WRITING, str(path))
    assert proc.returncode == -9, proc.stderr
    assert path.read_text() == SCRIPT
    assert len(os.listdir(tmp_path)) == 2  # the killed writer's temp file
    status, _, err = port(path, "--to", "paddle", "--in-place")
    assert status == 0, err
    assert "paddle.amp.GradScaler(" in path.read_text()
    assert os.listdir(tmp_path) == ["train.py"]


def test_in_place_through_a_symlink_rewrites_its_target_and_keeps_the_link(tmp_path, port):
    real = tmp_path / "src" / "train.py"
    real.parent.mkdir()
    real.write_text(SCRIPT)
    link = tmp_path / "train.py"
    link.symlink_to(real)
    status, _, err = port(link, "--to", "paddle", "--in-place")
    assert status == 0, err
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert "paddle.amp.GradScaler(" in real.read_text()
    assert sorted(os.listdir(real.parent)) == ["train.py"]


# ================================================================ the file's own bytes


def test_crlf_line_endings_and_a_utf8_bom_are_kept_byte_for_byte(tmp_path, port):
    source = b"\xef\xbb\xbf" + SCRIPT.replace("\n", "\r\n").encode()
    path = tmp_path / "train.py"
    path.write_bytes(source)
    out = tmp_path / "out.py"
    status, _, err = port(path, "--to", "paddle", "-o", out)
    assert status == 0, err
    written = out.read_bytes()
    assert written.startswith(b"\xef\xbb\xbf\"\"\"Training script.\"\"\"\r\n")
    lines = written[3:].split(b"\r\n")
    assert b"\n" not in written.replace(b"\r\n", b"")  # every line ends as the file's do
    assert lines[:4] == [b'"""Training script."""', b"import os", b"import torch",
                         b"import paddle"]  # the added import, with the file's ending
    before = source[3:].split(b"\r\n")
    assert [line for line in lines if line != b"import paddle"] == [
        b"scaler = paddle.amp.GradScaler(" + lines[7].split(b"(", 1)[1]
        if line.startswith(b"scaler = ") else line for line in before]
    # Standard output and the library keep them too.
    status, stdout, _ = port(path, "--to", "paddle")
    assert stdout == written
    assert port_source(source.decode(), "paddle").code == written.decode()


# ================================================================ clear errors, exit 2


@pytest.mark.parametrize(("content", "where"), [
    pytest.param("import torch\n# caf\xe9: latin-1\n".encode("latin-1"), "2: not UTF-8 text "
                 "(byte 0xe9)", id="latin-1"),
    pytest.param(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00", "1: not UTF-8 text (byte 0x89)",
                 id="binary"),
])
def test_a_file_that_is_not_utf8_python_source_is_refused_naming_it(tmp_path, port, content,
                                                                     where):
    path = tmp_path / "train.py"
    path.write_bytes(content)
    status, out, err = port(path, "--to", "paddle", "--in-place")
    assert (status, out) == (2, b"")
    assert err == (f"unifiedamp port: {path}:{where}: port reads Python source encoded as "
                   "UTF-8; convert it first (iconv -t UTF-8)\n")
    assert path.read_bytes() == content


def test_a_file_with_nul_bytes_is_refused_as_no_python_source(tmp_path, port):
    path = tmp_path / "train.py"
    path.write_bytes(b"import torch\n\x00\x00\x00\n")
    status, _, err = port(path, "--to", "paddle")
    assert status == 2
    assert err == f"unifiedamp port: {path}:2: a NUL byte: not Python source\n"


def test_output_into_a_missing_folder_or_onto_a_directory_is_refused(tmp_path, port):
    path = tmp_path / "train.py"
    path.write_text(SCRIPT)
    status, out, err = port(path, "--to", "paddle", "-o", tmp_path / "no" / "out.py")
    assert (status, out) == (2, b"")
    assert err == (f"unifiedamp port: {tmp_path / 'no' / 'out.py'}: the folder "
                   f"{tmp_path / 'no'} does not exist; create it first (nothing was written)\n")
    status, _, err = port(path, "--to", "paddle", "-o", tmp_path)
    assert status == 2
    assert err == f"unifiedamp port: {tmp_path} is a directory: name a file to write\n"
    assert os.listdir(tmp_path) == ["train.py"]


NESTED = """
import sys
from unifiedamp.cli import main
sys.exit(main(["port", sys.argv[1], "--to", "paddle"]))
"""


@pytest.mark.parametrize(("nested", "message"), [
    ("(" * 5000 + "1" + ")" * 5000, "5000 nested brackets (Python allows at most 200)"),
    ("lambda: " * 5000 + "1", "nested 5000 levels deep (port reads at most 1000)"),
    ("not " * 800 + "1", "nested 800 levels deep: too deep for port to read within Python's "
                         "recursion limit"),
])
def test_deeply_nested_source_is_refused_naming_the_depth_instead_of_crashing(
        tmp_path, nested, message):
    path = tmp_path / "train.py"
    path.write_text(f"import torch\nscaler = torch.amp.GradScaler()\nx = {nested}\n")
    proc = child(NESTED, str(path))
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-500:])
    assert proc.stderr == f"unifiedamp port: {path}:3: {message}\n"


@pytest.mark.parametrize("version", ["banana", "3.x", "", "2..6"])
def test_from_version_must_be_a_version_number(tmp_path, port, version):
    path = tmp_path / "train.py"
    path.write_text(SCRIPT)
    status, out, err = port(path, "--to", "paddle", "--from-version", version)
    assert (status, out) == (2, b"")
    assert err.splitlines()[-1] == (
        f"unifiedamp port: error: argument --from-version: {version!r} is not a version: "
        "write a version number such as 2, 2.6 or 3.3.1")
    with pytest.raises(ValueError, match="is not a version"):
        port_source(SCRIPT, "paddle", from_version=version)
    for good in ("2", "2.6", "3.3.1", "v3.0", "2.16.0rc1", "2.1.0+cu121"):
        assert port(path, "--to", "paddle", "--from-version", good, "--check")[0] == 0


@pytest.mark.skipif(shutil.which("git") is None or shutil.which("patch") is None,
                    reason="needs git and patch(1)")
def test_diff_of_an_absolute_path_applies_with_git_apply_and_patch_p1(tmp_path, port):
    path = tmp_path / "train.py"
    path.write_text(SCRIPT)
    status, diff, _ = port(path, "--to", "paddle", "--diff")
    assert status == 0
    rel = str(path).lstrip("/")
    assert diff.decode().startswith(f"--- a/{rel}\n+++ b/{rel}\n@@ ")  # as git diff writes it
    ported = port_source(SCRIPT, "paddle").code
    check = subprocess.run(["git", "apply", "--check", "-"], input=diff, cwd="/",
                           capture_output=True)
    assert check.returncode == 0, check.stderr
    subprocess.run(["patch", "-s", "-p1"], input=diff, cwd="/", check=True)
    assert path.read_text() == ported


# ================================================================ what port cannot follow

# mmengine's AmpOptimWrapper: the class is imported, then called through a local.
MMENGINE = textwrap.dedent("""\
    from torch.cuda.amp import GradScaler


    class AmpOptimWrapper:
        def __init__(self, loss_scale='dynamic'):
            scaler_type = GradScaler
            self.loss_scaler = scaler_type(**loss_scale)
""")


def test_a_scaler_class_port_cannot_follow_exits_1_naming_the_import(tmp_path, port):
    path = tmp_path / "amp_optimizer_wrapper.py"
    path.write_text(MMENGINE)
    status, out, err = port(path, "--to", "unifiedamp")
    assert status == 1 and out == MMENGINE.encode()
    assert err.splitlines() == [
        f"{path}: no native loss-scaler constructor call found",
        f"{path}:6: problem: torch.cuda.amp.GradScaler (imported at line 1) is used here as a "
        "value, not called: port cannot follow it to the call that builds the scaler, and this "
        "line keeps meaning torch's class; port that code by hand"]
    path.write_text("import torch\nx = torch.ones(3)\n")
    status, _, err = port(path, "--to", "unifiedamp")
    assert status == 0 and err == f"{path}: no native loss-scaler constructor call found\n"


def test_brackets_past_where_the_tokenizer_stopped_still_count():
    # Python 3.12's tokenize stops at 200 nested brackets and libcst's tokenizer does not:
    # what the tokenize module did not read is still measured (here it stops at line 3).
    src = "if a:\n        x = 1\n    y = " + "(" * 5000 + "1" + ")" * 5000 + "\n"
    with pytest.raises(SyntaxError, match=r"^5000 nested brackets") as info:
        port_source(src, "paddle")
    assert info.value.lineno == 3
