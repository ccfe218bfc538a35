"""The private torch names the torch backend relies on, all listed in
``unifiedamp/backends/torch/_compat.py``: torch's ``GradScaler`` methods, ops and attributes
are what ``_compat`` expects, the process-group slot it reads follows
``torch.distributed.is_initialized()``, and no other module of the backend uses a private
torch name."""

from __future__ import annotations

import ast
import importlib.metadata
import inspect
import pathlib

import pytest

torch = pytest.importorskip("torch")

from unifiedamp.backends.torch import _compat  # noqa: E402

# What the backend overrides or calls beyond torch.amp.GradScaler's public API, listed in
# unifiedamp.backends.torch._compat: parameter names of each method, how torch's own step()
# calls the two it overrides, the ops' schemas. A torch that changes any of them is outside
# the supported range.
PRIVATE_METHODS = _compat.PRIVATE_METHODS
STEP_CALLS = _compat.STEP_CALLS
OPS = _compat.OPS
STATE_ATTRIBUTES = _compat.STATE_ATTRIBUTES


def private_api_changes(scaler_cls):
    """How ``scaler_cls`` (torch.amp.GradScaler or a stand-in) differs from what we rely on."""
    changes = []
    for name, params in PRIVATE_METHODS.items():
        got = list(inspect.signature(getattr(scaler_cls, name)).parameters)
        if got != params:
            changes.append(f"{name}{tuple(got)}, expected {tuple(params)}")
    source = inspect.getsource(scaler_cls.step)
    changes += [f"step() no longer calls {call!r}" for call in STEP_CALLS if call not in source]
    for op, schemas in OPS.items():
        got = [str(s) for s in torch._C._jit_get_schemas_for_operator(f"aten::{op}")]
        if got != schemas:
            changes.append(f"torch.{op} has the schemas {got}, expected {schemas}")
    keys = set(_compat.empty_optimizer_state())
    if keys != _compat.OPTIMIZER_STATE_KEYS:
        changes.append(f"_refresh_per_optimizer_state() has the keys {sorted(keys)}")
    scaler = scaler_cls(device="cpu")
    scaler._lazy_init_scale_growth_tracker(torch.device("cpu"))
    changes += [f"no attribute {a}" for a in STATE_ATTRIBUTES if not hasattr(scaler, a)]
    return changes


def test_torchs_private_surface_is_what_the_backend_was_written_for():
    supported = [r for r in importlib.metadata.requires("unifiedamp")
                 if r.startswith("torch") and 'extra == "torch"' in r]
    changes = private_api_changes(torch.amp.GradScaler)
    assert not changes, (
        f"torch {torch.__version__} changed the private torch.amp.GradScaler API that "
        f"unifiedamp's torch backend overrides or calls: {'; '.join(changes)}. The backend "
        f"supports {supported[0].split(';')[0]} (tested: 2.13.0 on CPU, 2.11 on CUDA); "
        "adapt unifiedamp/backends/torch/_compat.py or use a torch in that range")


def test_the_private_surface_check_sees_a_changed_step():
    # Shaped like a public pytorch revision (commit 0202916 of torch/amp/grad_scaler.py)
    # whose step() unpacks (retval, found_inf) from _maybe_opt_step.
    class NewerGradScaler(torch.amp.GradScaler):
        def step(self, optimizer, *args, return_found_inf=False, **kwargs):
            optimizer_state = {}
            retval, found_inf = self._maybe_opt_step(optimizer, optimizer_state, *args, **kwargs)
            return (retval, found_inf) if return_found_inf else retval

    changes = private_api_changes(NewerGradScaler)
    assert changes == [f"step() no longer calls {STEP_CALLS[0]!r}",
                       f"step() no longer calls {STEP_CALLS[1]!r}"]


PROCESS_GROUP_CHECK = """
import torch.distributed as dist
from unifiedamp.backends.torch._compat import distributed_initialized
seen = [(distributed_initialized(), dist.is_initialized())]
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
seen.append((distributed_initialized(), dist.is_initialized()))
dist.destroy_process_group()
seen.append((distributed_initialized(), dist.is_initialized()))
print(seen)
"""


def test_distributed_initialized_follows_torchs_process_group(run_python):
    # It reads torch.distributed's slot for the default group: a torch that moves it would
    # make the scaler skip the all-reduce of found_inf on every rank. A process of its own:
    # it starts with no group, and a group left open here (a failed check) would make every
    # later test of this worker all-reduce.
    if not torch.distributed.is_available():
        pytest.skip("this torch is built without torch.distributed")
    result = run_python(PROCESS_GROUP_CHECK, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "[(False, False), (True, True), (False, False)]", (
        f"torch {torch.__version__}: unifiedamp.backends.torch._compat.distributed_initialized "
        f"no longer follows torch.distributed.is_initialized(): {result.stdout.strip()}")


def _is_private(dotted):
    """Whether a dotted name has a part that starts with ``_`` (dunders such as
    ``__version__`` are public)."""
    return any(part.startswith("_") and not part.endswith("__") for part in dotted.split("."))


def _dotted(node):
    """``a.b.c`` for a chain of attributes on a name, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join([node.id, *reversed(parts)]) if isinstance(node, ast.Name) else None


def _torch_private_members():
    """The private methods and attributes of a torch.amp.GradScaler whose scale exists."""
    scaler = torch.amp.GradScaler("cpu")
    scaler._lazy_init_scale_growth_tracker(torch.device("cpu"))
    return {name for name in [*dir(torch.amp.GradScaler), *vars(scaler)] if _is_private(name)}


TORCH_PRIVATE_MEMBERS = _torch_private_members()


def private_torch_uses(source):
    """Each use in ``source`` of a private torch name: an import of one (``import torch._C``,
    ``from torch.utils._pytree import ...``, ``from torch.amp.grad_scaler import _x``), an
    attribute read through a name bound to torch or one of its modules (``torch._foreach_norm``,
    ``dist._x``), or a private member of ``torch.amp.GradScaler`` that is defined, called or
    read (``def _unscale_grads_``, ``self._scale``) and not declared in ``_compat``'s lists."""
    tree = ast.parse(source)
    uses, torch_names = [], set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "torch":
                    torch_names.add(alias.asname or "torch")
                    if _is_private(alias.name):
                        uses.append(f"line {node.lineno}: import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and not node.level and \
                (node.module or "").split(".")[0] == "torch":
            for alias in node.names:
                torch_names.add(alias.asname or alias.name)
                if _is_private(f"{node.module}.{alias.name}"):
                    uses.append(f"line {node.lineno}: from {node.module} import {alias.name}")
    declared = set(_compat.PRIVATE_METHODS) | set(_compat.STATE_ATTRIBUTES)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            dotted = _dotted(node)
            if dotted and dotted.split(".")[0] in torch_names and _is_private(node.attr) \
                    and not _is_private(_dotted(node.value)):  # the first private part only
                uses.append(f"line {node.lineno}: {dotted}")
            elif node.attr in TORCH_PRIVATE_MEMBERS and node.attr not in declared:
                uses.append(f"line {node.lineno}: .{node.attr}, torch.amp.GradScaler's")
        elif isinstance(node, ast.FunctionDef) and node.name in TORCH_PRIVATE_MEMBERS \
                and node.name not in declared:
            uses.append(f"line {node.lineno}: def {node.name}, torch.amp.GradScaler's")
    return sorted(uses, key=lambda use: int(use.split(":")[0].split()[1]))


def test_only_compat_uses_torchs_private_names():
    package = pathlib.Path(_compat.__file__).parent
    modules = sorted(path for path in package.glob("*.py") if path.name != "_compat.py")
    assert {path.name for path in modules} >= {"__init__.py", "_scaler.py", "_diagnostics.py",
                                               "_rule.py"}
    uses = {path.name: private_torch_uses(path.read_text()) for path in modules}
    assert not any(uses.values()), (
        f"private torch names outside unifiedamp/backends/torch/_compat.py: {uses}; reach "
        "them through _compat (and list torch.amp.GradScaler's members in its lists)")


def test_the_private_name_scan_sees_a_planted_use():
    planted = (
        "import torch\n"
        "import torch._dynamo\n"
        "import torch.distributed as dist\n"
        "from torch.utils._python_dispatch import TorchDispatchMode\n"
        "from torch.amp.grad_scaler import OptState, _refresh_per_optimizer_state\n"
        "norms = torch._foreach_norm([torch.ones(2)], 2.0)\n"
        "schemas = torch._C._jit_get_schemas_for_operator\n"
        "rank = dist._rank_not_in_group(None)\n"
        "public = torch.__version__, torch.amp.GradScaler, dist.group.WORLD\n"
        "class Scaler(torch.amp.GradScaler):\n"
        "    def _check_scale_growth_tracker(self, *args):\n"
        "        return self._scale, super()._check_inf_per_device(args[0])\n"
        "    def _get_hysteresis_tracker(self):\n"
        "        return self._get_scale_async()\n"
    )
    assert private_torch_uses(planted) == [
        "line 2: import torch._dynamo",
        "line 4: from torch.utils._python_dispatch import TorchDispatchMode",
        "line 5: from torch.amp.grad_scaler import _refresh_per_optimizer_state",
        "line 6: torch._foreach_norm",
        "line 7: torch._C",
        "line 8: dist._rank_not_in_group",
        "line 11: def _check_scale_growth_tracker, torch.amp.GradScaler's",
        "line 14: ._get_scale_async, torch.amp.GradScaler's",
    ]
