"""The Python examples of README.md and docs/: which session runs each, and how.

Each ```` ```python ```` block of README.md and ``docs/**/*.md`` (those indented in a tab or a
list too) runs as written in exactly one test session, chosen by the frameworks it uses: the
modules it imports (anywhere in the block) and the ``backend="..."`` it names.

- none -> ``core``; torch (Lightning, accelerate, transformers) -> ``torch``; paddle ->
  ``paddle``; jax, flax, optax, orbax, jmp -> ``jax``; mlx -> ``mlx``;
- keras or tensorflow -> ``keras`` (jax or torch beside Keras are Keras's backends): run in
  the keras session whose ``keras.backend.backend()`` is the one the block needs, TensorFlow
  unless the block sets ``KERAS_BACKEND`` itself; skipped, saying where it runs, in the
  other two;
- several frameworks -> ``cross``;
- Praxis or PaxML (every block of docs/backends/praxis.md, and a block that imports them) ->
  ``praxis``, their own environment (tools/praxis_env.sh): the block's id names them, and
  ``.ci/run`` selects those tests with ``-k "praxis or paxml"``.

A block runs in the session's process (:func:`run`): ``exec`` in a fresh ``__main__``
namespace, in a folder of its own (examples write files), with the process-wide settings a
block may change (Keras's dtype policy, torch's default dtype, Paddle's AMP dtype,
accelerate's shared state, warning filters) restored after it, and Paddle's generated
parameter names counted from the start, as in a new process. A block that sets environment
variables before importing a framework, or starts a process group or processes, runs in a new
interpreter instead (the ``run_python`` fixture); so would one needing paddle and TensorFlow
together, which cannot share a process.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import importlib.util
import linecache
import pathlib
import re
import sys
import textwrap
import warnings

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

#: The sessions that run blocks (``keras`` once per Keras backend), and Keras's backends.
SESSIONS = ("core", "torch", "paddle", "jax", "mlx", "keras", "cross", "praxis")
KERAS_BACKENDS = ("tensorflow", "jax", "torch")

#: A module a block imports (its first name) -> the session of its framework.
_SESSION_OF_MODULE = {
    "torch": "torch", "torchvision": "torch", "lightning": "torch", "pytorch_lightning": "torch",
    "accelerate": "torch", "transformers": "torch", "deepspeed": "torch",
    "paddle": "paddle",
    "jax": "jax", "jaxlib": "jax", "flax": "jax", "optax": "jax", "orbax": "jax", "jmp": "jax",
    "mlx": "mlx",
    "keras": "keras", "tensorflow": "keras", "tf_keras": "keras",
}
#: ``backend="name"`` -> the session of that backend (numpy: none).
_SESSION_OF_BACKEND = {"torch": "torch", "paddle": "paddle", "jax": "jax", "flax": "jax",
                       "mlx": "mlx", "keras": "keras", "tensorflow": "keras"}
#: unifiedamp's framework modules: ``unifiedamp.backends.torch``, ``.callbacks.lightning``...
_UNIFIEDAMP_MODULE = re.compile(
    r"^unifiedamp\.(?:backends|callbacks|conformance\.adapters|conformance\.engines)\.(\w+)")
_UNIFIEDAMP_FRAMEWORK = {"torch": "torch", "lightning": "torch", "accelerate": "torch",
                         "paddle": "paddle", "jax": "jax", "mlx": "mlx", "keras": "keras",
                         "tensorflow": "keras"}

#: Pages whose examples run in an environment of their own, where these modules import.
OWN_ENVIRONMENT = {"docs/backends/praxis.md": ("praxis", "paxml")}
#: A block of another page that imports one of these (or unifiedamp's module of that name)
#: runs there too; its id ends with the modules' names, which ``-k`` selects.
_OWN_IMPORT = re.compile(r"^\s*(?:from|import)\s+(?:unifiedamp\.backends\.jax\.)?(praxis|paxml)\b",
                         re.M)

#: What makes a block need a new interpreter, and why.
_FRESH = [
    (re.compile(r"os\.environ\s*(?:\[|\.update|\.setdefault)|os\.putenv"),
     "sets environment variables before importing a framework"),
    (re.compile(r"\binit_process_group\b|\binit_parallel_env\b"),
     "starts a process group (process-wide, one per process)"),
    (re.compile(r"^\s*(?:import|from)\s+multiprocessing\b", re.M), "starts processes"),
]
_KERAS_BACKEND_SET = re.compile(r"""os\.environ\[["']KERAS_BACKEND["']\]\s*=\s*["'](\w+)["']""")


def code_blocks(text: str, language: str = "python") -> list[str]:
    """The ``language`` fenced blocks of a page, those indented in a tab or list included."""
    fence = re.compile(rf"^( *)```{language}\n(.*?)^\1```", re.S | re.M)
    return [textwrap.dedent(match[2]) for match in fence.finditer(text)]


@dataclasses.dataclass(frozen=True)
class Block:
    id: str  # page#index, with -praxis/-paxml where it imports them
    page: str
    index: int
    code: str
    session: str
    keras_backend: str | None  # the Keras backend it runs on (session "keras" only)
    fresh: str | None  # why it needs a new interpreter; None: it runs in process
    needs: tuple[str, ...] = ()  # modules of its own environment (Praxis, PaxML)

    def __str__(self) -> str:
        return self.id


def _imported(code: str) -> tuple[set[str], set[str]]:
    """Every module the block imports, anywhere (a branch or a function included), and every
    ``backend="..."`` its calls pass (comments and strings do not count)."""
    names: set[str] = set()
    backends: set[str] = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
        elif (isinstance(node, ast.keyword) and node.arg == "backend"
              and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)):
            backends.add(node.value.value)
    return names, backends


def frameworks(code: str) -> set[str]:
    """The sessions of the frameworks a block imports or names with ``backend=``."""
    modules, backends = _imported(code)
    found = {_SESSION_OF_BACKEND.get(name) for name in backends}
    for module in modules:
        ours = _UNIFIEDAMP_MODULE.match(module)
        if ours:
            found.add(_UNIFIEDAMP_FRAMEWORK.get(ours[1]))
        else:
            found.add(_SESSION_OF_MODULE.get(module.split(".")[0]))
    found.discard(None)
    if "keras" in found:  # jax or torch beside Keras: Keras's backends
        found -= {"jax", "torch"}
    return found  # type: ignore[return-value]


def block_of(page: str, index: int, code: str) -> Block:
    """The block ``index`` of ``page``: its id, session, Keras backend and way of running."""
    block_id, needs = f"{page}#{index}", OWN_ENVIRONMENT.get(page, ())
    if not needs and (imported := sorted(set(_OWN_IMPORT.findall(code)))):
        needs, block_id = tuple(imported), f"{block_id}-{'-'.join(imported)}"
    found = frameworks(code)
    if needs:
        session = "praxis"
    elif not found:
        session = "core"
    elif len(found) == 1:
        session = next(iter(found))
    else:
        session = "cross"
    keras_backend = None
    if session == "keras":
        chosen = _KERAS_BACKEND_SET.search(code)
        keras_backend = chosen[1] if chosen else "tensorflow"
    fresh = next((why for pattern, why in _FRESH if pattern.search(code)), None)
    if fresh is None and {"paddle", "keras"} <= found:
        fresh = "paddle and TensorFlow cannot share a process"
    return Block(block_id, page, index, code, session, keras_backend, fresh, needs)


def blocks() -> list[Block]:
    """Every Python block of README.md and docs/, in page order."""
    out = []
    for page in PAGES:
        name = page.relative_to(ROOT).as_posix()
        out += [block_of(name, i, code) for i, code in enumerate(code_blocks(page.read_text()))]
    return out


def runs_in(session: str, keras_backend: str | None = None) -> list[Block]:
    """The blocks one session runs (for ``keras``: on that Keras backend)."""
    return [b for b in blocks() if b.session == session
            and (session != "keras" or b.keras_backend == keras_backend)]


def params(session: str) -> list:
    """The session's blocks as ``pytest.param``s, by id (``keras``: all of them; each test
    skips those of another Keras backend with :func:`skip_unless_this_backend`)."""
    return [pytest.param(b, id=b.id) for b in blocks() if b.session == session]


def skip_unless_this_backend(block: Block) -> None:
    """In the keras session: skips a block that needs another Keras backend, naming it."""
    import keras

    if keras.backend.backend() != block.keras_backend:
        pytest.skip(f"{block.id} runs in the keras session on KERAS_BACKEND="
                    f"{block.keras_backend} (this one: {keras.backend.backend()})")


@contextlib.contextmanager
def _process_settings():
    """Restores what a block may change for the whole process: the warning filters and
    ``warnings.showwarning``, torch's default dtype, Keras's dtype policy, Paddle's AMP dtype,
    accelerate's shared state; and gives the block what a new process has where examples rely
    on it: Paddle's generated parameter names from the start, accelerate's state unset. A
    framework the block imports for the first time is set back to its initial value."""
    saved = {}
    if "torch" in sys.modules:
        saved["torch"] = sys.modules["torch"].get_default_dtype()
    if "keras" in sys.modules:
        saved["keras"] = sys.modules["keras"].config.dtype_policy()
    if "paddle" in sys.modules:
        from paddle.amp.auto_cast import amp_global_state

        saved["paddle"] = amp_global_state().amp_dtype
    _reset_accelerate()
    try:
        with contextlib.ExitStack() as stack:
            stack.enter_context(warnings.catch_warnings())
            if "paddle" in sys.modules:  # generated names (linear_0.w_0...) start over
                stack.enter_context(sys.modules["paddle"].utils.unique_name.guard())
            yield
    finally:
        if "torch" in sys.modules:
            torch = sys.modules["torch"]
            torch.set_default_dtype(saved.get("torch", torch.float32))
        if "keras" in sys.modules:
            sys.modules["keras"].config.set_dtype_policy(saved.get("keras", "float32"))
        if "paddle" in sys.modules:
            from paddle.amp.auto_cast import amp_global_state

            amp_global_state().amp_dtype = saved.get("paddle", "float32")
        _reset_accelerate()


def _reset_accelerate() -> None:
    """accelerate keeps one Accelerator's settings for the process (``AcceleratorState``,
    ``GradientState``): each block starts as a new process would."""
    if "accelerate.state" in sys.modules:
        state = sys.modules["accelerate.state"]
        state.AcceleratorState._reset_state(reset_partial_state=True)
        state.GradientState._reset_state()


def run(block: Block, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch,
        run_python) -> None:
    """Runs one block as written: in this process unless ``block.fresh`` says why it needs a
    new interpreter; in ``tmp_path`` either way (examples write files where they run)."""
    missing = [m for m in block.needs if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"{block.id} runs where {', '.join(missing)} import: tools/praxis_env.sh")
    if block.fresh:
        proc = run_python(block.code, cwd=tmp_path)
        assert proc.returncode == 0, f"{block.id} ({block.fresh}):\n{proc.stderr[-3000:]}"
        return
    monkeypatch.chdir(tmp_path)
    filename = f"<{block.id}>"  # a traceback shows the block's lines
    linecache.cache[filename] = (len(block.code), None, block.code.splitlines(True), filename)
    with _process_settings():
        exec(compile(block.code, filename, "exec"), {"__name__": "__main__"})
