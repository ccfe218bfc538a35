"""Bad inputs and misuses, each run in a fresh process and classified by what the user sees.

Usage: python tools/misuse.py [--src DIR] [--only NAME ...] [--list] [--jobs N]

Each case below is one thing a user gets wrong (a damaged checkpoint, a wrong argument, a
call out of order) written as a small Python snippet or a ``unifiedamp`` command line, with
the files it needs made in a temporary folder first. Every case runs in a process of its own
(so a segfault or a framework's import clash is a result, not the end of the run) and is
classified:

- ``clear``: an error of an expected type (ValueError, TypeError, RuntimeError, a file error;
  for the CLI exit 1 or 2) whose message is short and is no traceback;
- ``right``: no error, and the case's own check of the result passes (a misuse with a
  right answer, e.g. a CRLF file whose line endings survive a port);
- ``silent``: no error and no right result: the misuse was accepted;
- ``crash``: any other exception (KeyError, EOFError, OverflowError...), a traceback, a
  message too long to read, or a process killed by a signal.

``--src`` runs the cases against another checkout's ``src`` (to compare two commits); the
script prints one line per case and the counts per class. It always exits 0: it is a report.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]

CLEAR = {"ValueError", "TypeError", "RuntimeError", "FileNotFoundError", "IsADirectoryError",
         "NotADirectoryError", "PermissionError", "NoInfChecksError", "ScaleNotCalledError",
         "ImportError", "ModuleNotFoundError", "FrozenInstanceError"}
LONGEST_CLEAR_MESSAGE = 800


class Case(NamedTuple):
    """``setup`` (Python, run in the case's folder) makes its files; ``run`` is Python code
    or, for a string starting with ``cli:``, a ``unifiedamp`` command line; ``right`` (Python
    expression, evaluated in the folder after a run without error) says the result is right."""

    name: str
    setup: str
    run: str
    right: str = ""


TORCH_STATE = ('{"scaler": {"scale": 1024.0, "growth_factor": 2.0, "backoff_factor": 0.5, '
               '"growth_interval": 3, "_growth_tracker": 1}, "w": torch.arange(4096.0)}')
PADDLE_STATE = ('{"scaler": {"scale": np.array([1024.0], np.float32), "incr_count": 1, '
                '"decr_count": 0}}')
PAYLOAD = '''
class Payload:
    def __reduce__(self):
        return (os.system, ("touch code-ran",))
'''
TRAIN_SCRIPT = ("import torch\\r\\nscaler = torch.cuda.amp.GradScaler(init_scale=1024.0)"
                "\\r\\nscaler.step(opt)\\r\\n")


def _damaged(ext: str, how: str, writer: str) -> Case:
    cut = {"empty": "b''", "truncated": "data[: len(data) // 2]", "junk": "b'hello world' * 3"}
    return Case(f"port-state {how} {ext}", f"{writer}\ndata = open('whole{ext}', 'rb').read()\n"
                f"open('x{ext}', 'wb').write({cut[how]})",
                f"cli:port-state x{ext} --to canonical")


_TORCH_WRITER = f"import torch\ntorch.save({TORCH_STATE}, 'whole.pt')"
_CKPT_WRITER = f"import torch\ntorch.save({TORCH_STATE}, 'whole.ckpt')"
_NPZ_WRITER = ("import numpy as np\nnp.savez('whole.npz', scale=np.float32(8.0), "
               "_growth_tracker=np.int64(1))")
_PADDLE_WRITER = ("import pickle, numpy as np\n"
                  f"for e in ('.pdparams', '.pdopt'):\n"
                  f"    pickle.dump({PADDLE_STATE}, open('whole' + e, 'wb'), protocol=4)")

CASES: tuple[Case, ...] = (
    # ------------------------------------------------------------ untrusted checkpoint files
    *(_damaged(ext, how, writer) for ext, writer in
      ((".pt", _TORCH_WRITER), (".ckpt", _CKPT_WRITER), (".npz", _NPZ_WRITER),
       (".pdparams", _PADDLE_WRITER), (".pdopt", _PADDLE_WRITER))
      for how in ("empty", "truncated", "junk")),
    Case("port-state flipped tensor bytes .pt",
         f"import torch, zipfile\ntorch.save({TORCH_STATE}, 'x.pt')\n"
         "z = zipfile.ZipFile('x.pt'); i = [i for i in z.infolist() "
         "if i.filename.endswith('data/0')][0]\nd = bytearray(open('x.pt', 'rb').read())\n"
         "o = i.header_offset + 30 + len(i.filename) + len(i.extra) + 100\nd[o] ^= 0xFF\n"
         "open('x.pt', 'wb').write(bytes(d))",
         "cli:port-state x.pt --to canonical"),
    Case("port-state code payload .pdparams",
         f"import os, pickle, numpy as np\n{PAYLOAD}\n"
         f"pickle.dump({{**{PADDLE_STATE}, 'p': Payload()}}, open('x.pdparams', 'wb'))",
         "cli:port-state x.pdparams --to canonical", "False"),
    Case("port-state code payload .pdopt",
         f"import os, pickle, numpy as np\n{PAYLOAD}\n"
         f"pickle.dump({{**{PADDLE_STATE}, 'p': Payload()}}, open('x.pdopt', 'wb'))",
         "cli:port-state x.pdopt --to canonical", "False"),
    Case("port-state code payload .pt",
         f"import os, torch\n{PAYLOAD}\ntorch.save({{**{TORCH_STATE}, 'p': Payload()}}, 'x.pt')",
         "cli:port-state x.pt --to canonical", "False"),
    Case("port-state state without scale",
         "import json\njson.dump({'scaler': {'_growth_tracker': 1, 'growth_factor': 2.0, "
         "'backoff_factor': 0.5, 'growth_interval': 3}}, open('x.json', 'w'))",
         "cli:port-state x.json --key scaler --to canonical"),
    Case("port-state deeply nested JSON",
         "open('x.json', 'w').write('[' * 100000 + ']' * 100000)",
         "cli:port-state x.json --to canonical"),
    Case("port-state corrupt .keras", "open('x.keras', 'wb').write(b'PK\\x03\\x04junk' * 10)",
         "cli:port-state x.keras --to canonical"),
    Case("port-state in place through a symlink",
         "import json, os\nos.mkdir('store')\njson.dump({'scale': 8.0, '_growth_tracker': 1, "
         "'growth_factor': 2.0, 'backoff_factor': 0.5, 'growth_interval': 3}, "
         "open('store/s.json', 'w'))\nos.symlink('store/s.json', 'link.json')",
         "cli:port-state link.json --to canonical --in-place",
         "os.path.islink('link.json') and 'format' in open('store/s.json').read()"),
    *(Case(f"port-state crafted {name}",
           "import sys\nsys.path.insert(0, sys.argv[1] if len(sys.argv) > 1 else '')\n"
           f"from crafted_checkpoints import *\nopen('x{ext}', 'wb').write({builder})",
           f"cli:port-state x{ext} --to torch --in-place", "False")
      for name, ext, builder in (
          ("void dtype resized", ".pdparams", "void_dtype_resized()"),
          ("OrderedDict BUILD", ".pdparams", "ordered_dict_attribute()"),
          ("shared children 2**40", ".pdparams", "shared_children()"),
          ("zero-stride set", ".pdparams", "zero_stride_set()"),
          ("huge FRAME", ".pdparams", "huge_frame()"),
          ("eval payload", ".pdparams", "eval_payload('code-ran')"),
          ("zip bomb", ".pt", "zip_bomb('.pt')"),
          ("zip bomb", ".npz", "zip_bomb('.npz')"),
          ("bytearray(2**34)", ".pt", "torch_bytearray()"),
          ("set of a zero-stride tensor", ".pt", "torch_zero_stride()"))),
    Case("port-state --in-place with -o", "import json\njson.dump({'scale': 8.0, "
         "'_growth_tracker': 1, 'growth_factor': 2.0, 'backoff_factor': 0.5, "
         "'growth_interval': 3}, open('s.json', 'w'))",
         "cli:port-state s.json --to torch --in-place -o other.json"),
    Case("port-state onto a hard-linked file", "import json, os\njson.dump({'scale': 8.0, "
         "'_growth_tracker': 1, 'growth_factor': 2.0, 'backoff_factor': 0.5, "
         "'growth_interval': 3}, open('s.json', 'w'))\nos.link('s.json', 'o.json')",
         "cli:port-state s.json --to torch --in-place"),
    Case("port-state --config nested 5,000 deep", "import json\njson.dump({'scale': 8.0, "
         "'_growth_tracker': 1, 'growth_factor': 2.0, 'backoff_factor': 0.5, "
         "'growth_interval': 3}, open('s.json', 'w'))",
         "cli:port-state s.json --to canonical --config " + "[" * 5000),
    Case("port-state --config the file overrides", "import json\njson.dump({'scale': 8.0, "
         "'_growth_tracker': 1, 'growth_factor': 2.0, 'backoff_factor': 0.5, "
         "'growth_interval': 3}, open('s.json', 'w'))",
         "cli:port-state s.json --to canonical --config {\"growth_interval\":5}"),
    # ------------------------------------------------------------ scalers, misused
    *(Case(f"paddle step({arg})", "import paddle, unifiedamp as ua",
           f"ua.GradScaler(backend='paddle').step({arg})")
      for arg in ("None", "42", "'sgd'", "[None]")),
    Case("paddle device=3", "import paddle, unifiedamp as ua",
         "ua.GradScaler(backend='paddle', device=3)"),
    *(Case(f"torch device={arg}", "import torch, unifiedamp as ua",
           f"ua.GradScaler(backend='torch', device={arg})") for arg in ("'banana'", "42")),
    Case("torch scaler pickled mid-iteration", "import pickle, torch, unifiedamp as ua",
         "s = ua.GradScaler(backend='torch', device='cpu')\n"
         "w = torch.nn.Parameter(torch.ones(2)); o = torch.optim.SGD([w], lr=0.1)\n"
         "s.scale(w.sum()).backward(); s.unscale_(o)\npickle.loads(pickle.dumps(s))"),
    Case("keras from_config without inner_optimizer",
         "import os\nos.environ['KERAS_BACKEND'] = 'jax'\nimport keras, unifiedamp as ua",
         "o = ua.GradScaler(backend='keras').wrap(keras.optimizers.SGD(0.1))\n"
         "c = o.get_config(); del c['inner_optimizer']\ntype(o).from_config(c)"),
    Case("OverflowReport.from_dict({})", "from unifiedamp.diagnostics import OverflowReport",
         "OverflowReport.from_dict({})"),
    Case("mlx unscale of Python floats", "import unifiedamp as ua",
         "ua.GradScaler(backend='mlx').unscale([1.0, 2.0])"),
    Case("jax scaler read after donation", "import jax, jax.numpy as jnp, unifiedamp as ua",
         "s = ua.GradScaler(backend='jax')\n"
         "jax.jit(lambda s: s.update(True), donate_argnums=0)(s)\ns.get_scale()"),
    Case("jax scaler stacked by pmap", "import jax, jax.numpy as jnp, unifiedamp as ua",
         "s = jax.pmap(lambda s, g: s.update(s.unscale(g, axis_name='d')[1]), in_axes=(None, "
         "0), axis_name='d')(ua.GradScaler(backend='jax'), jnp.ones((1, 3)))\ns.get_scale()"),
    Case("jax setattr on the scaler", "import unifiedamp as ua",
         "s = ua.GradScaler(backend='jax')\ns.loss_scale = 2.0"),
    Case("jax tree_unflatten with other leaves", "import jax, unifiedamp as ua",
         "leaves, t = jax.tree_util.tree_flatten(ua.GradScaler(backend='jax'))\n"
         "jax.tree_util.tree_unflatten(t, ['a'] * len(leaves)).get_scale()"),
    Case("jax state_dict inside jit", "import jax, unifiedamp as ua",
         "jax.jit(lambda s: s.state_dict())(ua.GradScaler(backend='jax'))"),
    Case("cli _worker without a backend", "", "cli:_worker"),
    # ------------------------------------------------------------ state dicts
    Case("state dict version 1.0",
         "import unifiedamp as ua", "s = ua.GradScaler(backend='numpy')\n"
         "s.load_state_dict({**s.state_dict(), 'version': 1.0})"),
    Case("state dict backend 'tensorflow'",
         "import unifiedamp as ua", "s = ua.GradScaler(backend='numpy')\n"
         "s.load_state_dict({**ua.GradScaler(512.0, backend='numpy').state_dict(), "
         "'backend': 'tensorflow'})", "s.get_scale() == 512.0"),
    Case("state dict scale 10**400",
         "import unifiedamp as ua", "s = ua.GradScaler(backend='numpy')\n"
         "s.load_state_dict({**s.state_dict(), 'scale': 10**400})"),
    Case("paddle dict without incr_count",
         "import unifiedamp as ua", "ua.GradScaler(backend='numpy').load_state_dict("
         "{'scale': [2.0], 'decr_count': 0, 'incr_ratio': 2.0})"),
    # ------------------------------------------------------------ scalers
    *(Case(f"{b} history=2**40", "import unifiedamp as ua",
           f"s = ua.GradScaler(backend='{b}', history=2**40)\n" + step)
      for b, step in (
          ("numpy", ""),
          ("torch", "import torch\nw = torch.nn.Parameter(torch.ones(2)); "
                    "o = torch.optim.SGD([w], lr=0.1)\ns.scale(w.sum()).backward(); "
                    "s.step(o); s.update()"),
          ("paddle", ""))),
    Case("torch update(new_scale=tensor(nan))", "import torch, unifiedamp as ua",
         "s = ua.GradScaler(backend='torch', device='cpu')\n"
         "s.update(new_scale=torch.tensor(float('nan')))"),
    Case("torch update(new_scale=tensor(-4.))", "import torch, unifiedamp as ua",
         "s = ua.GradScaler(backend='torch', device='cpu')\n"
         "s.update(new_scale=torch.tensor(-4.0))"),
    *(Case(f"{b} process_group='x'", f"import {b}, unifiedamp as ua",
           f"ua.GradScaler(backend='{b}', process_group='x')") for b in ("torch", "paddle")),
    Case("paddle load_state_dict mid-iteration", "import paddle, unifiedamp as ua",
         "m = paddle.nn.Linear(2, 1); o = paddle.optimizer.SGD(parameters=m.parameters())\n"
         "s = ua.GradScaler(1024.0, backend='paddle')\n"
         "s.scale(m(paddle.to_tensor([[float('inf'), 1.0]])).sum()).backward(); s.step(o)\n"
         "s.load_state_dict(ua.GradScaler(4096.0, backend='numpy').state_dict()); s.update()"),
    Case("two scalers wrap one Keras optimizer",
         "import os\nos.environ['KERAS_BACKEND'] = 'jax'\nimport keras, unifiedamp as ua",
         "o = keras.optimizers.SGD(0.1)\nfirst = ua.GradScaler(backend='keras').wrap(o)\n"
         "second = ua.GradScaler(backend='keras').wrap(o)"),
    # ------------------------------------------------------------ histories and plots
    *(Case(f"plot {what}", f"import json\njson.dump({history}, open('h.json', 'w'))",
           "cli:plot h.json -o out.png")
      for what, history in (
          ("iteration 1e400", "{'iteration': [float('inf')], 'scale': [1.0], "
                              "'skipped': [False]}"),
          ("skipped 'false'", "{'iteration': [1], 'scale': [1.0], 'skipped': ['false']}"),
          ("NaN scale", "{'iteration': [1], 'scale': [float('nan')], 'skipped': [False]}"),
          ("negative scale", "{'iteration': [1], 'scale': [-4.0], 'skipped': [False]}"),
          ("decreasing iterations", "{'iteration': [2, 1], 'scale': [1.0, 1.0], "
                                    "'skipped': [False, False]}"))),
    Case("plot -o a folder", "import json, os\nos.mkdir('adir')\njson.dump({'iteration': [1], "
         "'scale': [1.0], 'skipped': [False]}, open('h.json', 'w'))", "cli:plot h.json -o adir"),
    Case("demo --out into a missing folder", "", "cli:demo --backend numpy --out nof/x.png"),
    Case("demo --history onto a file", "open('h.json', 'w').write('{}')",
         "cli:demo --backend numpy --out none --history h.json"),
    # ------------------------------------------------------------ port (source files)
    Case("port non-UTF-8 input", "open('t.py', 'wb').write(b'\\xff\\xfe\\x00import torch')",
         "cli:port t.py --to unifiedamp"),
    Case("port -o into a missing folder",
         "open('t.py', 'w').write('import torch\\nscaler = torch.amp.GradScaler()\\n')",
         "cli:port t.py --to unifiedamp -o nof/t.py"),
    Case("port -o onto a directory",
         "import os\nos.mkdir('d')\n"
         "open('t.py', 'w').write('import torch\\nscaler = torch.amp.GradScaler()\\n')",
         "cli:port t.py --to unifiedamp -o d"),
    Case("port 5,000 nested parentheses",
         "open('t.py', 'w').write('x = ' + '(' * 5000 + '1' + ')' * 5000 + '\\n')",
         "cli:port t.py --to unifiedamp"),
    Case("port --from-version banana",
         "open('t.py', 'w').write('import torch\\nscaler = torch.amp.GradScaler()\\n')",
         "cli:port t.py --to unifiedamp --from-version banana"),
    Case("port keeps CRLF and a BOM",
         f"open('t.py', 'wb').write(b'\\xef\\xbb\\xbf' + b'{TRAIN_SCRIPT}')",
         "cli:port t.py --to torch --in-place",
         "open('t.py', 'rb').read().startswith(b'\\xef\\xbb\\xbf') and "
         "open('t.py', 'rb').read().count(b'\\r\\n') == open('t.py', 'rb').read().count(b'\\n')"),
)

_PY = '''
import json, os, sys
def _out(**kw):
    print("@@misuse@@" + json.dumps(kw), flush=True)
try:
{run}
except BaseException as exc:
    _out(type=type(exc).__name__, message=str(exc))
    sys.exit(0)
_out(type=None, right=bool(eval({right!r})) if {right!r} else False)
'''


def _classify_error(kind: str, message: str) -> str:
    readable = message and len(message) <= LONGEST_CLEAR_MESSAGE and "Traceback" not in message
    return "clear" if kind in CLEAR and readable else "crash"


def run_case(case: Case, src: Path, timeout: float) -> tuple[str, str]:
    """``(class, detail)`` of one case."""
    env = {**os.environ, "PYTHONPATH": str(src), "TF_CPP_MIN_LOG_LEVEL": "3",
           "PYTHONWARNINGS": "ignore"}
    with tempfile.TemporaryDirectory() as folder:
        setup = subprocess.run([sys.executable, "-c", case.setup, str(ROOT / "tests")],
                               cwd=folder, env=env, capture_output=True, text=True,
                               timeout=timeout)
        if setup.returncode:
            return "setup failed", setup.stderr.strip().splitlines()[-1:][0][:200]
        try:
            if case.run.startswith("cli:"):
                proc = subprocess.run([sys.executable, "-m", "unifiedamp.cli",
                                       *case.run[4:].split()], cwd=folder, env=env,
                                      capture_output=True, text=True, timeout=timeout)
                err = proc.stderr.strip()
                if proc.returncode < 0:
                    return "crash", f"killed by signal {-proc.returncode}"
                if proc.returncode in (1, 2):
                    lines = [ln for ln in err.splitlines() if "Warning" not in ln]
                    text = "\n".join(lines)
                    ok = text and len(text) <= LONGEST_CLEAR_MESSAGE and "Traceback" not in text
                    return ("clear" if ok else "crash"), text[-200:]
                if proc.returncode:
                    return "crash", f"exit {proc.returncode}: {err[-200:]}"
                result = None
            else:
                body = textwrap.indent(case.run, "    ")
                proc = subprocess.run([sys.executable, "-c", case.setup + "\n" +
                                       _PY.format(run=body, right=case.right)],
                                      cwd=folder, env=env,
                                      capture_output=True, text=True, timeout=timeout)
                marks = [ln for ln in proc.stdout.splitlines() if ln.startswith("@@misuse@@")]
                if proc.returncode < 0 or not marks:
                    return "crash", f"exit {proc.returncode}: {proc.stderr.strip()[-200:]}"
                result = json.loads(marks[-1][len("@@misuse@@"):])
                if result["type"] is not None:
                    return (_classify_error(result["type"], result["message"]),
                            f"{result['type']}: {result['message'][:200]}")
        except subprocess.TimeoutExpired:
            return "crash", f"no answer in {timeout:.0f} s"
        if case.run.startswith("cli:") and case.right:
            check = subprocess.run([sys.executable, "-c", f"import os\nprint(bool({case.right}))"],
                                   cwd=folder, env=env, capture_output=True, text=True)
            result = {"right": check.stdout.strip() == "True"}
        ran = os.path.exists(os.path.join(folder, "code-ran"))
        if result and result.get("right") and not ran:
            return "right", ""
        return "silent", "accepted" + (" (the file's code ran)" if ran else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", type=Path, default=ROOT / "src",
                        help="the src folder whose unifiedamp runs the cases")
    parser.add_argument("--only", nargs="+", default=None, help="case names to run")
    parser.add_argument("--list", action="store_true", help="list the cases and exit")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args(argv)
    cases = [c for c in CASES if args.only is None or c.name in args.only]
    if args.list:
        print("\n".join(c.name for c in cases))
        return 0
    with ThreadPoolExecutor(args.jobs) as pool:
        results = list(pool.map(lambda c: run_case(c, args.src.resolve(), args.timeout),
                                cases))
    counts: dict[str, int] = {}
    for case, (klass, detail) in zip(cases, results, strict=True):
        counts[klass] = counts.get(klass, 0) + 1
        print(f"{klass:7} {case.name}: {' '.join(detail.split())[:160]}")
    print(f"\n{len(cases)} cases: " + ", ".join(f"{counts.get(k, 0)} {k}" for k in
                                                ("clear", "right", "silent", "crash",
                                                 "setup failed") if counts.get(k)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
