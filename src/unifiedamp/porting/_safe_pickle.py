"""Reading torch and Paddle checkpoints without running the file's code.

A pickle names the functions that rebuild its objects, and a full unpickle calls them: any
code the file names runs. Without ``trusted=True`` a torch file is loaded with
``torch.load(weights_only=True)`` and a Paddle file with an unpickler that builds only
containers, numbers, strings and NumPy arrays (what ``paddle.save`` writes for a state
dict); anything else raises :class:`_Refused`, which
:func:`~unifiedamp.porting.load_file` reports naming the trust flag.
"""

from __future__ import annotations

import os
import re
from collections import OrderedDict
from typing import Any


class _Refused(Exception):
    """A file holds objects that only an unrestricted (code-running) load builds."""


def _refusal(path: Any, what: str) -> ValueError:
    return ValueError(
        f"{path} holds {what}, which only a full unpickle builds, and a full unpickle runs "
        "code the file names: it is not done unless you trust where the file comes from "
        "(trusted=True; CLI: --trust); nothing was read")


def _load_torch(path: Any, trusted: bool) -> Any:
    import pickle

    import torch

    if trusted:
        return torch.load(path, map_location="cpu", weights_only=False)
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        # Only an object outside weights_only's allow-list is a reason to trust; a
        # damaged pickle fails the same way in a full unpickle.
        match = re.search(r"GLOBAL ([\w.]+)|[Uu]nsupported (?:global|class):? ([\w.]+)",
                          str(exc))
        if match:
            raise _Refused(f"an object of {match.group(1) or match.group(2)}") from None
        raise


# What paddle.save writes for a state dict (protocol 2-4 pickles): containers, NumPy
# arrays and scalars, tensors as ``tuple((name, array))``, DenseTensors as
# ``eval('data', {'data': array})`` (paddle/framework/io.py, _pickle_save).
_PADDLE_GLOBALS = {
    ("collections", "OrderedDict"), ("numpy", "ndarray"), ("numpy", "dtype"),
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
    ("builtins", "tuple"), ("builtins", "list"), ("builtins", "set"),
    ("builtins", "frozenset"), ("builtins", "complex"),
    ("_codecs", "encode"),  # bytes in protocol 2
}


def _dense_tensor_data(expression: Any, namespace: Any) -> Any:
    # Stands in for eval in paddle's DenseTensor records; anything else is refused.
    import numpy as np

    if (expression == "data" and isinstance(namespace, dict) and list(namespace) == ["data"]
            and isinstance(namespace["data"], np.ndarray)):
        return namespace["data"]
    raise _Refused("an eval() call that is not paddle's DenseTensor record")


def _load_paddle(path: Any, trusted: bool) -> Any:
    import pickle

    if trusted:
        import paddle

        # return_numpy: arrays, not paddle Tensors (tensors would need a device).
        return paddle.load(os.fspath(path), return_numpy=True)
    import _compat_pickle
    import importlib

    class WeightsUnpickler(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> Any:
            # Protocol 2 names Python 2's modules (__builtin__, copy_reg): Python 3's first,
            # as pickle's own find_class does, then the allow-list.
            if (module, name) in _compat_pickle.NAME_MAPPING:
                module, name = _compat_pickle.NAME_MAPPING[(module, name)]
            module = _compat_pickle.IMPORT_MAPPING.get(module, module)
            if (module, name) in _PADDLE_GLOBALS:
                return getattr(importlib.import_module(module), name)
            if (module, name) == ("builtins", "eval"):
                return _dense_tensor_data
            raise _Refused(f"a reference to {module}.{name}")

    with open(path, "rb") as f:
        obj = WeightsUnpickler(f, encoding="latin1").load()
    return _paddle_numpy(obj)


def _paddle_numpy(obj: Any) -> Any:
    """What ``paddle.load(path, return_numpy=True)`` makes of an unpickled object."""
    import numpy as np

    if isinstance(obj, dict):
        parts = obj.pop("UnpackBigParamInfor@@", {})  # arrays over 4 GB, split in slices
        for key, info in parts.items():
            obj[key] = np.concatenate([obj.pop(s) for s in info["slices"]]).reshape(
                info["OriginShape"])
        if "StructuredToParameterName@@" in obj:
            del obj["StructuredToParameterName@@"]
            return obj

    def tensor_record(x: Any) -> bool:
        return (type(x) is tuple and len(x) == 2 and isinstance(x[0], str)
                and isinstance(x[1], np.ndarray))

    def walk(x: Any) -> Any:
        if tensor_record(x):
            return x[1]
        if type(x) in (dict, OrderedDict):
            for k in list(x):
                x[k] = walk(x[k])
            return x
        if type(x) in (list, tuple, set):
            return type(x)(walk(v) for v in x)
        return x

    return walk(obj)
