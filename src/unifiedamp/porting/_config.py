"""Native scaler constructors <-> the canonical config: two readers of the natives' table.

What each native scaler's constructor takes is one entry of the spec's table,
:data:`unifiedamp.spec.NATIVE_SCALERS` (parameters in positional order, defaults per
framework version, the values the class hard-codes, the values it refuses, its quirks);
two functions read it in opposite directions:

- :func:`config_from_call`: the :class:`~unifiedamp.spec.ScalerConfig` a native
  constructor call builds (positional and keyword arguments, that framework
  version's defaults filled in), with notes on every default filled in and every
  argument that has no canonical meaning;
- :func:`native_call`: the keyword arguments of a native constructor that
  reproduce a config, every default written out, and one line per behaviour the
  native class cannot express.

No framework is imported here. Versions are read from the installed distributions'
metadata (``importlib.metadata``), which imports nothing either.

Length: one module, because both readers rest on the same reading of a row: which version's
defaults apply (``framework=version``, tf.keras's tf-keras 2 or Keras 3), how arguments bind,
and the Keras and TensorFlow rules no table entry can hold (a static scale's requirements,
TensorFlow 2.1-2.3's ``loss_scale``); split, each half would import the other's privates.
"""

from __future__ import annotations

import math
import re

from unifiedamp.spec import CANONICAL, ScalerConfig, f32
from unifiedamp.spec._natives import NATIVE_SCALERS as _NATIVES
from unifiedamp.spec._natives import QUALNAMES as _NATIVE_QUALNAMES
from unifiedamp.spec._natives import REQUIRED as _REQUIRED

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

__all__ = ["NATIVE_SCALERS", "config_from_call", "native_call"]

#: The native scalers' table (:data:`unifiedamp.spec.NATIVE_SCALERS`), and unifiedamp's own
#: constructor as one more source and target of a port.
NATIVE_SCALERS: dict[str, dict[str, Any]] = {
    **_NATIVES,
    "unifiedamp.GradScaler": {
        "framework": "unifiedamp", "backend": None, "package": None, "state": "canonical",
        "aliases": ("unifiedamp", "ua.GradScaler"),
        "params": CANONICAL[:5], "keyword_only": CANONICAL[5:],
        "names": {name: name for name in CANONICAL},
        "versions": {"1": {"releases": "any", "defaults": ScalerConfig().to_dict(),
                           "fixed": {}}},
        "fix": "", "quirks": (),
    },
}
QUALNAMES = {**_NATIVE_QUALNAMES, "unifiedamp": "unifiedamp.GradScaler",
             "ua.GradScaler": "unifiedamp.GradScaler"}

_DYNAMIC_ONLY = ("growth_factor", "backoff_factor", "growth_interval", "hysteresis",
                 "min_scale", "max_scale")


def _row(qualname: str) -> tuple[str, dict[str, Any]]:
    name = QUALNAMES.get(qualname, qualname)
    if name not in NATIVE_SCALERS:
        raise ValueError(f"unknown scaler {qualname!r}: one of {', '.join(NATIVE_SCALERS)} "
                         f"(or a short name: torch, paddle, keras, jmp, unifiedamp)")
    return name, NATIVE_SCALERS[name]


def _installed(package: str) -> str | None:
    """The installed version of ``package``, without importing it (None: not installed)."""
    import importlib.metadata as metadata

    if package == "tf.keras":
        # tensorflow >= 2.16 ships Keras 3 as tf.keras, unless TF_USE_LEGACY_KERAS selects
        # the tf-keras 2 package.
        import os

        tf = _installed("tensorflow")
        if tf is None:
            return None
        minor = tf.split(".")[1] if tf.count(".") else "0"
        legacy = os.environ.get("TF_USE_LEGACY_KERAS", "").lower() in ("1", "true", "yes")
        modern = _major(tf, 2) > 2 or (minor.isdigit() and int(minor) >= 16)
        return "3" if modern and not legacy else "2"
    names = {"paddlepaddle": ("paddlepaddle", "paddlepaddle-gpu"),
             "tensorflow": ("tensorflow", "tensorflow-cpu")}.get(package, (package,))
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def _major(version: Any, default: int) -> int:
    text = str(version).strip().lstrip("v")
    head = text.split(".")[0]
    return int(head) if head.isdigit() else default


# 2, 2.6, 3.3.1, v3.0, 2.16.0rc1, 2.1.0+cu121, 2.7.0.post1: a release, then what PEP 440 and
# local builds append.
_VERSION = re.compile(r"v?\d+(\.\d+)*((a|b|rc|\.?post|\.?dev)\d*)*(\+[A-Za-z0-9.]+)?")


#: The framework names ``framework=version`` takes, and what each means.
FRAMEWORK_NAMES = {"tensorflow": "tensorflow", "tf": "tensorflow", "keras": "keras",
                   "tf-keras": "keras", "tf_keras": "keras", "torch": "torch",
                   "paddle": "paddle", "paddlepaddle": "paddle", "jmp": "jmp"}


class AmbiguousVersion(ValueError):
    """A bare version that means different defaults depending on the framework it names
    (``2.16`` for ``tf.keras``: TensorFlow 2.16 is Keras 3, tf-keras 2.16 is Keras 2)."""


def _check_version(version: Any) -> None:
    """Raises ValueError unless ``version`` is None, an int, a version number string or
    ``framework=version`` (``tensorflow=2.15``, ``keras=2``, ``paddle=2.6``, ``torch=2.3``).

    Example:
        >>> _check_version("3.3.1"), _check_version(2), _check_version(None)
        (None, None, None)
        >>> _check_version("tensorflow=2.15")
        >>> _check_version("banana")
        Traceback (most recent call last):
        ...
        ValueError: 'banana' is not a version: write a version number such as 2, 2.6 or 3.3.1
    """
    if version is None or (isinstance(version, int) and not isinstance(version, bool)
                            and version >= 0):
        return
    if isinstance(version, str) and "=" in version:
        framework, _, number = version.partition("=")
        if framework.strip().lower() not in FRAMEWORK_NAMES:
            raise ValueError(f"{version!r}: {framework.strip()!r} is not a framework port knows: "
                             "write tensorflow=2.15, keras=2, paddle=2.6, torch=2.3 or jmp=0.0.4")
        if not _VERSION.fullmatch(number.strip()):
            raise ValueError(f"{version!r}: {number.strip()!r} is not a version: write a version "
                             "number such as tensorflow=2.15 or paddle=2.6")
        return
    if not isinstance(version, str) or not _VERSION.fullmatch(version.strip()):
        raise ValueError(f"{version!r} is not a version: write a version number such as 2, "
                         "2.6 or 3.3.1")


def _keras_of_tensorflow(version: str) -> str:
    """The Keras major version tf.keras is in a TensorFlow release: 2 up to 2.15, 3 from 2.16."""
    parts = version.strip().lstrip("v").split(".")
    minor = parts[1] if len(parts) > 1 else ""
    minor = "".join(c for c in minor if c.isdigit()) if minor else ""
    if _major(version, 2) > 2 or (minor and int(minor) >= 16):
        return "3"
    return "2"


def _for_row(name: str, row: dict[str, Any], version: Any) -> Any:
    """The version ``version`` (bare or ``framework=version``) means for this row: a version
    its key can be read from, or None where it names another framework.

    Example:
        >>> row = NATIVE_SCALERS["tf.keras.mixed_precision.LossScaleOptimizer"]
        >>> name = "tf.keras.mixed_precision.LossScaleOptimizer"
        >>> _for_row(name, row, "tensorflow=2.15"), _for_row(name, row, "tensorflow=2.21")
        ('2', '3')
        >>> _for_row(name, row, "paddle=2.6") is None, _for_row(name, row, "2.15")
        (True, '2')
        >>> try:
        ...     _for_row(name, row, "2.21")
        ... except AmbiguousVersion as exc:
        ...     print(str(exc)[:48])
        version 2.21 is ambiguous for tf.keras: tf.keras
    """
    tf_keras = row["package"] == "tf.keras"
    if isinstance(version, str) and "=" in version:
        framework, _, number = version.partition("=")
        framework, number = FRAMEWORK_NAMES[framework.strip().lower()], number.strip()
        if tf_keras and framework == "tensorflow":
            return _keras_of_tensorflow(number)
        if tf_keras and framework == "keras":
            return str(_major(number, -1))
        if framework == row["framework"] or (framework == "tensorflow"
                                             and row["package"] == "tensorflow"):
            return number
        return None
    if version is None or not tf_keras:
        return version
    # A bare version for tf.keras: TensorFlow's or Keras's? Where both readings give the same
    # Keras, it does not matter.
    text = str(version).strip()
    as_tensorflow = _keras_of_tensorflow(text) if _major(text, -1) == 2 else None
    as_keras = str(_major(text, -1))
    if as_tensorflow in (None, as_keras) and "." in text or as_keras == "3":
        return as_keras
    raise AmbiguousVersion(
        f"version {text} is ambiguous for tf.keras: tf.keras is tf-keras 2 up to TensorFlow "
        f"2.15 and Keras 3 from 2.16, and {text} may be TensorFlow's or Keras's version; say "
        f"which: --from-version tensorflow={text} or keras={text}")


def _version(name: str, row: dict[str, Any], version: Any) -> tuple[str, list[str]]:
    """The row's version key for ``version`` (or the installed one), and a note if guessed."""
    _check_version(version)
    keys = sorted(row["versions"], key=int)
    if len(keys) == 1:
        return keys[0], []
    version = _for_row(name, row, version)
    if version is None:
        installed = _installed(row["package"])
        if installed is None:
            package = "tensorflow" if row["package"] == "tf.keras" else row["package"]
            return keys[-1], [f"{package} is not installed: used the defaults of "
                              f"{name} {keys[-1]}.x; pass version= for another"]
        version = installed
        guessed = [f"used the defaults of {name} {_major(version, -1)}.x (the installed "
                   f"version); pass version= for another"]
    else:
        guessed = []
    key = str(_major(version, -1))
    if key not in row["versions"]:
        raise ValueError(f"{name} has no version {version!r} in NATIVE_SCALERS: one of "
                         f"{', '.join(k + '.x' for k in keys)}")
    return key, guessed


def _spec(row: dict[str, Any], key: str) -> dict[str, Any]:
    """The row with its version's entries (params, defaults, fixed, limits) merged in."""
    return {**row, **row["versions"][key]}


def _scalar(value: Any) -> Any:
    # jmp and paddle users write arrays (jnp.float32(2.0 ** 15), np.ones([])).
    shape = getattr(value, "shape", None)
    if shape is not None and tuple(shape) in ((), (1,)) and hasattr(value, "item"):
        return value.item()
    return value


def _bind(name: str, row: dict[str, Any], args: tuple[Any, ...],
          kwargs: dict[str, Any]) -> dict[str, Any]:
    params = row["params"]
    allowed = (*params, *row.get("keyword_only", ()))
    if len(args) > len(params):
        raise TypeError(f"{name}() takes at most {len(params)} positional arguments "
                        f"({', '.join(params)}), got {len(args)}")
    bound = dict(zip(params, args, strict=False))
    for key, value in kwargs.items():
        if key not in allowed:
            import difflib

            close = difflib.get_close_matches(key, allowed, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else f"; it takes {', '.join(allowed)}"
            raise TypeError(f"{name}() got an unexpected keyword argument {key!r}{hint}")
        if key in bound:
            raise TypeError(f"{name}() got multiple values for argument {key!r}")
        bound[key] = value
    return bound


def config_from_call(qualname: str, args: tuple[Any, ...] = (),
                     kwargs: dict[str, Any] | None = None,
                     version: Any = None) -> tuple[ScalerConfig, list[str]]:
    """The canonical config a native scaler constructor call builds, and notes on it.

    Arguments bind as the native constructor binds them (positional order included:
    ``ShardedGradScaler`` takes ``backoff_factor`` before ``growth_factor``), and the
    defaults are that framework version's (paddle 2.x: 32768 / 1000 / 2; paddle 3.x:
    65536 / 2000 / 1). jmp's ``factor=f`` is ``growth_factor=f`` and ``backoff_factor=1/f``.

    Args:
        qualname: A key of :data:`NATIVE_SCALERS` (``"torch.amp.GradScaler"``,
            ``"paddle.amp.GradScaler"``, ``"jmp.DynamicLossScale"``...) or a short name.
        args: The call's positional arguments.
        kwargs: The call's keyword arguments.
        version: The framework version the call was written for (``"2.6"``, ``3``);
            default: the installed one (read from package metadata, not imported).

    Returns:
        ``(config, notes)``: one note per default filled in, per argument with no
        canonical meaning, and per value mapped with a caveat.

    Raises:
        TypeError: The native constructor would refuse the call's arguments (unknown
            name, too many positional arguments, a required one missing).
        ValueError: Unknown qualname or version, or a value no config can hold.

    Example:
        >>> cfg, notes = config_from_call("paddle.amp.GradScaler", (), {}, version="2.6")
        >>> cfg.init_scale, cfg.growth_interval, cfg.hysteresis
        (32768.0, 1000, 2)
        >>> cfg, _ = config_from_call("torch.distributed.fsdp.ShardedGradScaler",
        ...                           ("cpu", 1024.0, 0.25, 3.0))
        >>> cfg.backoff_factor, cfg.growth_factor
        (0.25, 3.0)
        >>> cfg, notes = config_from_call("jmp.DynamicLossScale", (2.0 ** 15,), {"factor": 4})
        >>> cfg.growth_factor, cfg.backoff_factor, cfg.min_scale
        (4.0, 0.25, 1.0)
        >>> for note in notes:
        ...     print(note)
        default: period=2000 (growth_interval=2000)
        default: min_loss_scale=1.0 (min_scale=1.0)
    """
    name, row = _row(qualname)
    early: list[str] = []
    if version is None and _static_keras2(row, kwargs or {}):
        version = "keras=2"
        early.append(STATIC_KERAS2)
    key, notes = _version(name, row, version)
    notes = early + notes
    row = _spec(row, key)
    bound = _bind(name, row, tuple(args), dict(kwargs or {}))
    _check_keras_static(name, row, bound)
    values: dict[str, Any] = {}
    for param in (*row["params"], *row.get("keyword_only", ())):
        given = param in bound
        value = _scalar(bound[param]) if given else row["defaults"].get(param)
        if param in row.get("derived", {}):
            derived, note = _tf_loss_scale(value)
            values.update(derived)
            notes.append(note)
            continue
        if value is _REQUIRED:
            if param in row["names"]:
                raise TypeError(f"{name}() missing required argument: {param!r}")
            notes.append(f"{param}: not given ({row['ignored'][param]})")
            continue
        canonical = row["names"].get(param)
        if param == "factor":  # jmp: one factor for both directions
            values["growth_factor"], values["backoff_factor"] = float(value), 1.0 / value
            mapped = f"growth_factor={float(value)!r}, backoff_factor={1.0 / value!r}"
            if not given:
                notes.append(f"default: factor={value!r} ({mapped})")
            elif not math.log2(value).is_integer():
                notes.append(f"factor={value!r}: jmp divides by it on backoff where the spec "
                             f"multiplies by f32(1/{value!r}): the last bit can differ")
            continue
        if canonical is None:
            if given or param in ("device",):
                notes.append(f"{param}={value!r}: no canonical meaning ({row['ignored'][param]})")
            continue
        if canonical == "min_scale" and value == 0:
            value = None  # jmp's min_loss_scale=0 is no floor, the spec's None
        limit = row.get("limits", {}).get(param)
        if limit is not None and not _holds(value, *limit):
            notes.append(f"{param}={value!r}: {name} itself refuses it (it needs "
                         f"{param} {limit[0]} {limit[1]!r})")
        values[canonical] = value
        if not given and param in row["params"]:
            notes.append(f"default: {param}={value!r} ({canonical}={value!r})")
    for canonical, value in row["fixed"].items():
        values.setdefault(canonical, value)
        if value != getattr(ScalerConfig, canonical):
            notes.append(f"{canonical}={value!r}: fixed by {name}")
    if not values.get("dynamic", True):
        notes.append("dynamic=False: static loss scaling; the scale stays at init_scale")
    config = ScalerConfig(**values)
    return config, notes


#: The note of a tf.keras call read with tf-keras 2's defaults for its dynamic=False.
STATIC_KERAS2 = ("dynamic=False: Keras 3 refuses it, so this call was written for tf-keras 2 "
                 "(tensorflow <= 2.15): its defaults")


def _static_keras2(row: dict[str, Any], kwargs: Mapping[str, Any]) -> bool:
    """Whether a tf.keras call passes ``dynamic=False``, which Keras 3 refuses: it was written
    for tf-keras 2 (:data:`STATIC_KERAS2`)."""
    return row["package"] == "tf.keras" and kwargs.get("dynamic") is False


def _check_keras_static(name: str, row: dict[str, Any], bound: dict[str, Any]) -> None:
    """Raises ValueError where the Keras class itself refuses the call's ``dynamic=``."""
    if row["framework"] != "keras" or bound.get("dynamic", True) is not False:
        return
    if "dynamic" not in row["names"]:  # Keras 3
        hint = ("a call written for tf-keras 2 (tensorflow <= 2.15) takes it: pass "
                "--from-version tensorflow=2.15 (version='keras=2')"
                if row["package"] == "tf.keras" else
                "for a static scale under Keras 3 use unifiedamp's wrapper: "
                "ua.GradScaler(init_scale=..., dynamic=False, backend='keras').wrap(opt)")
        raise ValueError(f"{name}(dynamic=False): Keras 3 has no static LossScaleOptimizer and "
                         f"refuses it (ValueError); {hint}")
    if bound.get("initial_scale") is None:
        raise ValueError(f"{name}(dynamic=False) without initial_scale: tf-keras 2 refuses it "
                         "(a static scale needs its value); write initial_scale=")
    if bound.get("dynamic_growth_steps") is not None:
        raise ValueError(f"{name}(dynamic=False, dynamic_growth_steps=...): tf-keras 2 refuses "
                         "it (a static scale never grows); drop dynamic_growth_steps")


#: TensorFlow 2.1-2.3's DynamicLossScale defaults (its loss_scale="dynamic").
TF_DYNAMIC_LOSS_SCALE = {"initial_loss_scale": 2.0 ** 15, "increment_period": 2000,
                         "multiplier": 2.0}


def _tf_loss_scale(value: Any) -> tuple[dict[str, Any], str]:
    """The canonical values TensorFlow 2.1-2.3's ``loss_scale`` argument sets, and a note.

    ``value`` is ``"dynamic"``, a number (a static scale), or the arguments of a
    ``DynamicLossScale`` (a mapping with any of ``initial_loss_scale``, ``increment_period``,
    ``multiplier``).

    Example:
        >>> _tf_loss_scale(128)[0]
        {'init_scale': 128.0, 'dynamic': False}
        >>> _tf_loss_scale("dynamic")[0]["init_scale"]
        32768.0
    """
    if isinstance(value, str):
        if value != "dynamic":
            raise ValueError(f"loss_scale={value!r}: TensorFlow takes 'dynamic', a number or a "
                             "LossScale object")
        value = {}
    if isinstance(value, dict):
        unknown = set(value) - set(TF_DYNAMIC_LOSS_SCALE)
        if unknown:
            raise ValueError(f"DynamicLossScale got {', '.join(sorted(unknown))}: it takes "
                             f"{', '.join(TF_DYNAMIC_LOSS_SCALE)}")
        args = {**TF_DYNAMIC_LOSS_SCALE, **value}
        multiplier = float(args["multiplier"])
        derived = {"init_scale": float(args["initial_loss_scale"]), "dynamic": True,
                   "growth_interval": int(args["increment_period"]),
                   "growth_factor": multiplier, "backoff_factor": 1.0 / multiplier}
        return derived, ("loss_scale: TensorFlow 2.1-2.3's DynamicLossScale("
                         + ", ".join(f"{k}={args[k]!r}" for k in TF_DYNAMIC_LOSS_SCALE)
                         + "): grows by multiplier, backs off by 1/multiplier to a floor of 1")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"loss_scale={value!r}: TensorFlow takes 'dynamic', a number or a "
                         "LossScale object")
    return ({"init_scale": float(value), "dynamic": False},
            f"loss_scale={value!r}: a number is TensorFlow's FixedLossScale, a static scale")


def _holds(value: Any, op: str, bound: Any) -> bool:
    return {">": value > bound, "<": value < bound, "==": value == bound}[op]


def native_call(config: ScalerConfig, target: str,
                version: Any = None) -> tuple[dict[str, Any], list[str]]:
    """The keyword arguments of a native scaler constructor that reproduce ``config``.

    Every parameter with a canonical meaning is written out, defaults included (a torch
    config ported to paddle gets ``decr_every_n_nan_or_inf=1``; a Keras one ported to
    torch gets ``init_scale=32768.0``). Arguments with no canonical meaning are left to
    the caller: torch's ``device`` (``torch.amp.GradScaler("cuda", **kwargs)``), Keras's
    inner optimizer (``LossScaleOptimizer(inner, **kwargs)``). torch gets its factors
    rounded to float32, which makes its kernel compute the spec's bits.

    Args:
        config: The canonical config.
        target: ``"torch"``, ``"paddle"``, ``"keras"``, ``"jmp"``, ``"unifiedamp"``, or
            any key of :data:`NATIVE_SCALERS`.
        version: For targets whose behaviour differs by version (``tf.keras``).

    Returns:
        ``(kwargs, problems)``: one line per behaviour of ``config`` the target cannot
        express, each saying what to use instead. Empty when the target reproduces it.

    Example:
        >>> from unifiedamp.spec import ScalerConfig
        >>> kwargs, problems = native_call(ScalerConfig(), "paddle")
        >>> kwargs["decr_every_n_nan_or_inf"], kwargs["init_loss_scaling"], problems
        (1, 65536.0, [])
        >>> kwargs, problems = native_call(ScalerConfig(growth_factor=3.0), "keras")
        >>> kwargs
        {'initial_scale': 65536.0, 'dynamic_growth_steps': 2000}
        >>> for part in problems[0].split(": ", 1):
        ...     print(part)
        keras.optimizers.LossScaleOptimizer cannot express growth_factor=3.0 (it hard-codes 2.0)
        needs unifiedamp's wrapper: ua.GradScaler(..., backend='keras').wrap(opt)
    """
    if not isinstance(config, ScalerConfig):
        raise TypeError(f"config must be a ScalerConfig, got {type(config).__name__}")
    name, row = _row(target)
    key, _ = _version(name, row, version)
    row = _spec(row, key)
    fix = row["fix"]
    kwargs: dict[str, Any] = {}
    problems: list[str] = []
    # A parameter the config never acts on needs no faithful counterpart.
    inert = set() if config.enabled else set(CANONICAL) - {"enabled"}
    if not config.dynamic:
        inert |= set(_DYNAMIC_ONLY)
    for param in (*row["params"], *row.get("keyword_only", ())):
        if param == "factor":
            kwargs["factor"] = config.growth_factor
            problems += _jmp_factor(config, fix)
            continue
        canonical = row["names"].get(param)
        if canonical is None:
            continue
        value = getattr(config, canonical)
        if row["framework"] == "torch" and canonical in ("growth_factor", "backoff_factor"):
            value = f32(value)
        if row["framework"] == "jmp" and canonical == "min_scale" and value is None:
            value = 1.0  # jmp has no "no floor" that survives jit (see _jmp_floor)
            if "min_scale" not in inert:
                problems.append(_jmp_floor(name, fix))
        elif row["framework"] == "jmp" and canonical == "min_scale" and value != 1.0 \
                and "min_scale" not in inert:
            problems.append(f"{name} drops min_loss_scale={value!r} at every jit/pytree "
                            "boundary (tree_flatten does not carry it): inside jax.jit the "
                            f"floor is 1.0 again; {fix}")
        kwargs[param] = value
        limit = row.get("limits", {}).get(param)
        if limit is not None and canonical not in inert and not _holds(value, *limit):
            problems.append(f"{name} cannot express {canonical}={getattr(config, canonical)!r} "
                            f"(it requires {param} {limit[0]} {limit[1]!r}); {fix}")
    for canonical, fixed in row["fixed"].items():
        value = getattr(config, canonical)
        if value == fixed or canonical in inert:
            continue
        problems.append(f"{name} cannot express {canonical}={value!r} (it hard-codes "
                        f"{fixed!r}): {_instead(name, canonical, value, fix)}")
    return kwargs, problems


def _instead(name: str, canonical: str, value: Any, fix: str) -> str:
    # Where another native class of the same framework does it, say that first.
    if name == "jmp.DynamicLossScale" and canonical == "dynamic":
        return "jmp.StaticLossScale is static: native_call(config, 'jmp.StaticLossScale')"
    if name == "jmp.StaticLossScale" and canonical == "dynamic":
        return "jmp.DynamicLossScale is dynamic: native_call(config, 'jmp')"
    if canonical == "dynamic" and value is False and name.startswith("torch"):
        return ("torch's GradScaler has no static mode (its scale always grows and backs off); "
                "unifiedamp's torch backend has one: ua.GradScaler(init_scale=..., "
                "dynamic=False, backend='torch')")
    if canonical == "dynamic" and value is False and name.startswith(("keras", "tf.keras")):
        return ("Keras 3 has no static LossScaleOptimizer (dynamic=False raises ValueError); "
                "unifiedamp's keras wrapper has one: ua.GradScaler(init_scale=..., "
                "dynamic=False, backend='keras').wrap(opt)")
    if canonical == "enabled" and name.startswith(("keras", "tf.keras")):
        return "a disabled scaler is the inner optimizer itself (no LossScaleOptimizer)"
    if canonical == "enabled" and name.startswith("jmp"):
        return "a disabled scaler is jmp.NoOpLossScale()"
    return fix


def _jmp_factor(config: ScalerConfig, fix: str) -> list[str]:
    growth, backoff = config.growth_factor, config.backoff_factor
    if not config.enabled or not config.dynamic:
        return []
    if f32(backoff) != f32(1.0 / growth):
        return [f"jmp.DynamicLossScale cannot express growth_factor={growth!r} with "
                f"backoff_factor={backoff!r}: its one factor f grows by f and backs off by 1/f; "
                f"{fix}"]
    if not math.log2(growth).is_integer():
        return [f"jmp.DynamicLossScale backs off by dividing by factor={growth!r}, the spec "
                f"multiplies by f32(1/{growth!r}): the last bit of the scale can differ; {fix}"]
    return []


def _jmp_floor(name: str, fix: str) -> str:
    return (f"{name} cannot express min_scale=None: its min_loss_scale defaults to 1.0 and has "
            "no 'none' (0.0 would do outside jit, but tree_flatten drops it and jit brings 1.0 "
            f"back), so the port gets a floor of 1 (kwargs say min_loss_scale=1.0); {fix}")
