"""Writing the target's calls for :func:`~unifiedamp.porting.port_source`: each native
constructor call as the target's constructor, every value explicit, and each method call on
a ported scaler (a "verb") as the target's method where the mapping is exact.

The semantics are :func:`~unifiedamp.porting.config_from_call` and
:func:`~unifiedamp.porting.native_call`; what the target cannot express becomes a problem on
the call's :class:`~unifiedamp.porting.CallSite`, each saying what to do instead.

Flax's ``value_and_grad`` loop is rewritten by ``_source_flax``, and the calls port flags
without rewriting (Paddle's static-graph AMP, wrappers that patch a scaler) are in
``_source_flagged``.

Length: one module, because every part of a written constructor call reads the same bound
arguments and placeholders of the source call (its version, its tf.keras evidence, its
non-literal arguments), and the verbs' mapping names the same targets.
"""

from __future__ import annotations

import json
from typing import Any

from unifiedamp.porting import _config
from unifiedamp.porting._config import NATIVE_SCALERS
from unifiedamp.porting._source_read import CallSite, _bindings, _Context, _NotLiteral, _walk
from unifiedamp.spec import ScalerConfig
from unifiedamp.spec._float32 import FLOAT32_MAX
from unifiedamp.spec._natives import REQUIRED

# torch's verb -> paddle's (None: paddle has none). Both sides are exact where named: same
# arguments, same effect. state_dict formats differ: a note (unifiedamp port-state converts).
_TORCH_TO_PADDLE = {
    "scale": "scale", "unscale_": "unscale_", "step": "step", "update": "update",
    "is_enabled": "is_enable", "state_dict": "state_dict", "load_state_dict": "load_state_dict",
    "get_scale": None, "get_growth_factor": "get_incr_ratio", "set_growth_factor": "set_incr_ratio",
    "get_backoff_factor": "get_decr_ratio", "set_backoff_factor": "set_decr_ratio",
    "get_growth_interval": "get_incr_every_n_steps",
    "set_growth_interval": "set_incr_every_n_steps",
}
_PADDLE_TO_TORCH = {v: k for k, v in _TORCH_TO_PADDLE.items() if v}
# paddle verbs torch has no counterpart for; unifiedamp's paddle backend keeps them (under
# the second name).
_PADDLE_ONLY = {"minimize": "minimize", "is_use_dynamic_loss_scaling":
                "is_use_dynamic_loss_scaling", "get_init_loss_scaling": "get_init_loss_scaling",
                "set_init_loss_scaling": "set_init_loss_scaling",
                "get_decr_every_n_nan_or_inf": "get_hysteresis",
                "set_decr_every_n_nan_or_inf": "set_hysteresis"}
_JMP_VERBS = ("scale", "unscale", "adjust")
_USAGE = {
    "keras": "Keras scales inside the optimizer: there is no scale/unscale_/step/update; "
             "the wrapped optimizer's apply() does it all",
    "jmp": "jmp's loss scale is an immutable value: loss_scale.scale(loss), "
           "loss_scale.unscale(grads), jmp.all_finite(grads), loss_scale = "
           "loss_scale.adjust(finite)",
    "torch": "torch's loop: scaler.scale(loss).backward(); scaler.step(opt); scaler.update()",
    "paddle": "paddle's loop: scaler.scale(loss).backward(); scaler.step(opt); "
              "scaler.update() (or scaler.minimize(opt, scaled))",
}


class _Expr:
    """An argument that is not a literal: kept as its source text."""

    def __init__(self, code: str) -> None:
        self.code = code

    def __repr__(self) -> str:  # config_from_call's notes show it as written
        return self.code


# ------------------------------------------------------------------ constructors


def _port_call(ctx: _Context, node: Any, name: str) -> tuple[CallSite, Any]:
    """The plan for one constructor call, and the call node to put in its place (or None)."""
    site = CallSite(0, "constructor", name, name, ctx.code(node), ctx.code(node))
    args, kwargs = [], {}
    for arg in node.args:
        if arg.star:
            site.problems.append(f"{ctx.code(arg)}: arguments unpacked at run time cannot be "
                                 "read from the source; write them out")
            return site, None
        try:
            value = ctx.literal(arg.value)
        except (_NotLiteral, ArithmeticError, TypeError, ValueError):
            value = _tf_loss_scale_object(ctx, arg.value)
        if arg.keyword is None:
            args.append(value)
        else:
            kwargs[arg.keyword.value] = value
    try:
        # tf.keras: tf-keras 2 or Keras 3, from --from-version, the file, or a checked guess.
        version = _source_version(ctx, site, name, args, kwargs)
        # The private helpers bind as config_from_call does, to know which parameter each
        # non-literal argument is.
        row = _config._spec(NATIVE_SCALERS[name],
                         _config._version(name, NATIVE_SCALERS[name], version)[0])
        bound = _config._bind(name, row, tuple(args), kwargs)
        _derived_literal(row, bound)
        exprs, values = _placeholders(row, bound)
        config, notes = _config.config_from_call(name, (), values, version=version)
    except _config.AmbiguousVersion:
        raise  # the whole run needs a clearer --from-version (the command's exit 2)
    except (TypeError, ValueError) as exc:
        site.problems.append(f"{exc}: left as it is")
        return site, None
    site.notes += notes
    if NATIVE_SCALERS[name]["framework"] == "flax":
        config = _flax_config(site, bound, config, exprs)
    site.config = {k: exprs[k].code if k in exprs else repr(v)
                   for k, v in config.to_dict().items()}
    callee, kwargs_text, extra = _target_call(ctx, site, node, row, bound, config, exprs)
    text = f"{callee}({', '.join(kwargs_text)}){extra}"
    new = ctx.cst.parse_expression(text)
    # Keep the call's own parentheses and whitespace around it.
    new = new.with_changes(lpar=node.lpar, rpar=node.rpar)
    site.after = ctx.code(new)
    return site, new


#: TensorFlow 2.1-2.3's loss-scale objects (the loss_scale= of its experimental
#: LossScaleOptimizer), by the modules that exported them.
_TF_LOSS_SCALES = {f"{module}.{cls}": cls for module in (
    "tensorflow.mixed_precision.experimental", "tensorflow.train.experimental",
    "tensorflow.compat.v1.mixed_precision", "tensorflow.compat.v1.train.experimental")
    for cls in ("DynamicLossScale", "FixedLossScale")}


def _tf_loss_scale_object(ctx: _Context, node: Any) -> Any:
    """A non-literal argument: a ``DynamicLossScale(...)`` / ``FixedLossScale(...)`` of
    literals as the value config_from_call reads (its arguments, or the number), else kept
    as its source text."""
    cst = ctx.cst
    cls = next((_TF_LOSS_SCALES[q] for q in ctx.imported(getattr(node, "func", node))
                if q in _TF_LOSS_SCALES), None) if isinstance(node, cst.Call) else None
    if cls is None:
        return _Expr(ctx.code(node))
    params = (("initial_loss_scale", "increment_period", "multiplier")
              if cls == "DynamicLossScale" else ("loss_scale_value",))
    given: dict[str, Any] = {}
    try:
        for index, arg in enumerate(node.args):
            key = arg.keyword.value if arg.keyword else params[index]
            given[key] = ctx.literal(arg.value)
    except (_NotLiteral, ArithmeticError, TypeError, ValueError, IndexError):
        return _Expr(ctx.code(node))
    if cls == "FixedLossScale":
        return given.get("loss_scale_value", _Expr(ctx.code(node)))
    return given


def _derived_literal(row: dict[str, Any], bound: dict[str, Any]) -> None:
    """Raises ValueError where a parameter that sets several canonical ones (TensorFlow
    2.1-2.3's loss_scale) is not a literal: "dynamic" and a number differ in kind."""
    for param in row.get("derived", {}):
        if isinstance(bound.get(param), _Expr):
            raise ValueError(f"{param}={bound[param].code} is not a literal: it may be "
                             "'dynamic' or a number (a static scale), or a LossScale object "
                             "built from variables; port cannot tell which: write the value "
                             "(or DynamicLossScale(...) with literal arguments)")


#: What in a file says which Keras its tf.keras is (module prefix -> (Keras major, why)).
_KERAS_EVIDENCE = {
    "tf_keras": ("2", "imports tf_keras (tf-keras 2)"),
    "tensorflow.keras.mixed_precision.experimental": (
        "2", "uses tf.keras.mixed_precision.experimental (TensorFlow 2.1-2.3)"),
    "tensorflow.compat.v1": ("2", "uses tf.compat.v1 (TensorFlow 1-style code)"),
    "keras.ops": ("3", "uses keras.ops (Keras 3 only)"),
    "tensorflow.keras.ops": ("3", "uses tf.keras.ops (Keras 3 only)"),
    "keras.src": ("3", "imports from keras.src (Keras 3 only)"),
}


def _keras_evidence(ctx: _Context) -> tuple[str, str] | None:
    """``(Keras major, why)`` where the file says which Keras tf.keras is, or None (nothing
    says, or two things disagree); the file is read once, for its first Keras call."""
    if "keras" not in ctx.once:
        ctx.once["keras"] = _read_keras_evidence(ctx)
    return ctx.once["keras"]


def _read_keras_evidence(ctx: _Context) -> tuple[str, str] | None:
    cst = ctx.cst
    found: dict[str, str] = {}
    for node in _walk(cst, ctx.module):
        names: set[str] = set()
        if isinstance(node, (cst.Import, cst.ImportFrom)):
            names = {q for _, q in _bindings(ctx, node)}
            if isinstance(node, cst.ImportFrom) and node.module is not None:
                names.add(ctx.code(node.module))
        elif isinstance(node, (cst.Name, cst.Attribute)):
            names = ctx.imported(node)
        elif isinstance(node, cst.SimpleString) and "TF_USE_LEGACY_KERAS" in node.value:
            found.setdefault("2", "sets TF_USE_LEGACY_KERAS (tf.keras is tf-keras 2)")
        for name in names:
            for prefix, (major, why) in _KERAS_EVIDENCE.items():
                if name == prefix or name.startswith(prefix + "."):
                    found.setdefault(major, why)
    return next(iter(found.items())) if len(found) == 1 else None


def _source_version(ctx: _Context, site: CallSite, name: str, args: list[Any],
                    kwargs: dict[str, Any]) -> Any:
    """The version to read a call's defaults with. For tf.keras (tf-keras 2 up to
    tensorflow 2.15, Keras 3 from 2.16): --from-version where it names it, else ``dynamic=False``
    (Keras 3 refuses it: config_from_call reads it as tf-keras 2), else what the file says
    (:func:`_keras_evidence`), else the installed TensorFlow's, with a note where both Kerases
    give the call the same config and a problem where they do not."""
    row = NATIVE_SCALERS[name]
    if row["package"] != "tf.keras":
        return ctx.version
    pinned = _config._for_row(name, row, ctx.version)  # AmbiguousVersion: the caller's
    if pinned is not None:
        return f"keras={pinned}"
    if _config._static_keras2(row, kwargs):
        site.notes.append(_config.STATIC_KERAS2)
        return "keras=2"
    evidence = _keras_evidence(ctx)
    if evidence is not None:
        major, why = evidence
        site.notes.append(f"tf.keras read as {'tf-keras 2' if major == '2' else 'Keras 3'}: "
                          f"this file {why}; --from-version tensorflow=<version> says otherwise")
        return f"keras={major}"
    configs = {}
    for major in ("2", "3"):
        try:
            spec = _config._spec(row, major)
            exprs, values = _placeholders(spec, _config._bind(name, spec, tuple(args), kwargs))
            config = _config.config_from_call(name, (), values, version=f"keras={major}")[0]
            configs[major] = (config.to_dict(), {k: e.code for k, e in exprs.items()})
        except (TypeError, ValueError) as exc:
            configs[major] = ({"error": str(exc)}, {})
    assumed = _config._installed("tf.keras") or "3"
    what = ("nothing in this file says whether tf.keras is tf-keras 2 (tensorflow <= 2.15) or "
            "Keras 3 (tensorflow >= 2.16)")
    if configs["2"] == configs["3"]:
        site.notes.append(f"{what}: the defaults are a guess, Keras {assumed}'s (the installed "
                          "TensorFlow's); both give this call the same config")
    else:
        (two, _), (three, _) = configs["2"], configs["3"]
        if "error" in two or "error" in three:  # one of them refuses the call's arguments
            differ = "; ".join(
                f"{label} {'refuses it: ' + c['error'] if 'error' in c else 'takes it'}"
                for label, c in (("tf-keras 2", two), ("Keras 3", three)))
        else:
            differ = ", ".join(f"{k}={two[k]!r} (tf-keras 2) or {three[k]!r} (Keras 3)"
                               for k in two if two[k] != three[k])
        site.problems.append(f"{what}, and their defaults differ for this call ({differ}): "
                             f"wrote Keras {assumed}'s (the installed TensorFlow's); pass "
                             "--from-version tensorflow=<the version it was written for> (or "
                             "keras=2 / keras=3)")
    return f"keras={assumed}"


def _placeholders(row: dict[str, Any], bound: dict[str, Any]) -> tuple[dict[str, _Expr],
                                                                          dict[str, Any]]:
    """Non-literal canonical arguments by canonical name, and the values to read a config
    from: each non-literal stands in as the default (the config then holds it as written)."""
    exprs, values = {}, {}
    defaults = ScalerConfig().to_dict()
    for param, value in bound.items():
        canonical = "factor" if param == "factor" else row["names"].get(param)
        if isinstance(value, _Expr) and canonical is not None:
            exprs[canonical] = value
            default = row["defaults"].get(param)
            value = default if default != REQUIRED else defaults[canonical]
        values[param] = value
    return exprs, values


def _fmt(value: Any) -> str:
    if isinstance(value, _Expr):
        return value.code
    if isinstance(value, str):
        return json.dumps(value)  # "cuda", as torch's documentation writes it
    return repr(value)


def _target_call(ctx: _Context, site: CallSite, node: Any, row: dict[str, Any],
                 bound: dict[str, Any], config: ScalerConfig,
                 exprs: dict[str, _Expr]) -> tuple[str, list[str], str]:
    """The callee, its arguments as text, and what follows the call (``.wrap(...)``)."""
    framework, to, name = row["framework"], ctx.to, site.source
    # Keras's: the optimizer the scaler wraps (TensorFlow 2.1-2.3 named it optimizer).
    inner_param = "optimizer" if framework == "keras" and "optimizer" in bound \
        else "inner_optimizer"
    inner = bound.get(inner_param)
    if framework == "keras" and to in ("unifiedamp", "keras"):
        keras2 = _keras2_optimizer(ctx, name)
        site.problems += keras2
        written_for_keras2 = (row.get("releases", "").startswith(("tf-keras 2", "tensorflow 2."))
                              and name != "tf_keras.mixed_precision.LossScaleOptimizer")
        if written_for_keras2 and not keras2:
            site.notes.append(
                "written for tf-keras 2, whose optimizers Keras 3's classes refuse: the written "
                "call runs where tf.keras is Keras 3 (TensorFlow >= 2.16 without "
                "TF_USE_LEGACY_KERAS), or with the optimizer built from keras.optimizers")
    leading: list[str] = []  # positional arguments with no canonical meaning
    extras: dict[str, Any] = {}  # keyword arguments with no canonical meaning
    carried: set[str] = set()  # the source's arguments with no canonical meaning, kept
    extra = ""
    if to == "unifiedamp" or (to == "keras" and inner is None):
        # Keras's class needs the optimizer it wraps: without one, unifiedamp's keras
        # backend holds the scaler until wrap(optimizer).
        qualname = "unifiedamp.GradScaler"
        callee = f"{ctx.prefix('unifiedamp')}.GradScaler"
        kwargs, problems = _config.native_call(config, "unifiedamp")
        site.problems += problems
        if framework == "torch" and to == "unifiedamp":  # the torch backend takes both
            extras.update({p: bound[p] for p in ("device", "process_group") if p in bound})
            site.notes += _cuda_note(name, bound)
        extras["backend"] = row["backend"] if to == "unifiedamp" else "keras"
        if inner is not None:
            extra = f".wrap({_fmt(inner)})"
            carried.add(inner_param)
            site.notes.append("a Keras LossScaleOptimizer is an optimizer: "
                              f"ua.GradScaler(..., backend='keras').wrap({_fmt(inner)}) is the "
                              "optimizer that replaces it")
        if to == "keras":
            native, problems = _config.native_call(config, "keras")
            site.problems.append(
                f"keras.optimizers.LossScaleOptimizer wraps an optimizer, and a {framework} "
                "scaler has none: wrote ua.GradScaler(..., backend='keras'); call "
                "scaler.wrap(optimizer) and train with the optimizer it returns (Keras's own "
                "class: keras.optimizers.LossScaleOptimizer(optimizer, "
                + ", ".join(f"{k}={_fmt(v)}" for k, v in native.items()) + "))")
            site.problems += problems
    else:
        qualname = {"torch": "torch.amp.GradScaler", "paddle": "paddle.amp.GradScaler",
                    "keras": "keras.optimizers.LossScaleOptimizer",
                    "jmp": "jmp.DynamicLossScale"}[to]
        if to == "torch" and name.endswith("ShardedGradScaler"):
            qualname = name  # FSDP's scaler stays FSDP's: it agrees on found_inf across ranks
            if "process_group" in bound:
                extras["process_group"] = bound["process_group"]
        if to == "jmp" and not config.dynamic:
            qualname = "jmp.StaticLossScale"
        kwargs, problems = _config.native_call(config, qualname)
        site.problems += problems
        if qualname == name:
            callee = ctx.code(node.func)  # the same class: as the file spells it
        else:
            module, _, rest = qualname.partition(".")
            callee = f"{ctx.prefix(module)}.{rest}"
        if to == "torch":
            # The device is kept as written; without one, torch's own default "cuda".
            leading.append(_fmt(bound.get("device", "cuda")))
            if name == "torch.cuda.amp.GradScaler":
                site.notes.append('device "cuda": torch.cuda.amp.GradScaler is CUDA\'s')
            elif "device" not in bound:
                site.notes.append('device "cuda": torch.amp.GradScaler\'s default; torch '
                                  'disables the scaler where CUDA is not available: write "cpu" '
                                  "or another device there")
        if to == "keras":
            leading.append(_fmt(inner))
        _usage_problem(site, framework, to)
    carried |= set(extras)
    if to == "torch":
        carried.add("device")
    if to == "keras" and inner is not None:
        carried.add(inner_param)
    # A parameter with no canonical meaning that the target class of the same framework
    # takes too (jmp's counter, Keras's name) keeps its value.
    target_row = NATIVE_SCALERS[qualname]
    if target_row["framework"] == framework:
        target_row = _config._spec(target_row, sorted(target_row["versions"], key=int)[-1])
        shared = (*target_row["params"], *target_row.get("keyword_only", ()))
        for param, value in bound.items():
            if row["names"].get(param) is None and param not in carried and param in shared:
                extras[param] = value
                carried.add(param)
    for param, value in bound.items():
        if row["names"].get(param) is None and param != "factor" and param not in carried:
            site.notes.append(f"dropped {param}={_fmt(value)}: {qualname} has no such "
                              "parameter")
    kwargs = _keep_expressions(site, qualname, kwargs, exprs)
    site.target = qualname
    text = leading + [f"{k}={_fmt(v)}" for k, v in {**kwargs, **extras}.items()]
    return callee, text, extra


def _keras2_optimizer(ctx: _Context, name: str) -> list[str]:
    """A problem where the optimizer a Keras scaler wraps is a Keras 2 one (tf_keras, or
    tf.keras under TF_USE_LEGACY_KERAS): Keras 3's classes, unifiedamp's wrapper included,
    refuse it."""
    evidence = _keras_evidence(ctx) if NATIVE_SCALERS[name]["package"] == "tf.keras" else None
    if name != "tf_keras.mixed_precision.LossScaleOptimizer" and not (
            evidence and "TF_USE_LEGACY_KERAS" in evidence[1]):
        return []
    what = ("unifiedamp's keras wrapper, ua.GradScaler(..., backend='keras').wrap(),"
            if ctx.to == "unifiedamp" else "keras.optimizers.LossScaleOptimizer")
    return [f"{name} wraps a tf-keras 2 (Keras 2) optimizer, and {what} takes a Keras 3 "
            "optimizer only (a Keras 2 one raises TypeError at run time): build the optimizer "
            "from keras.optimizers (Keras 3; keras.optimizers.SGD for tf_keras.optimizers.SGD) "
            "and train with Keras 3, or keep tf_keras's own LossScaleOptimizer"]


def _cuda_note(name: str, bound: dict[str, Any]) -> list[str]:
    """torch disables its scaler where CUDA is not available; unifiedamp's does not."""
    device = bound.get("device")
    enabled = bound.get("enabled", True)
    if enabled is False:
        return []  # off everywhere, before and after
    text = _fmt(enabled)
    if not (text.isidentifier() or _grouped(text)):
        text = f"({text})"
    keep = ("enabled=torch.cuda.is_available()" if enabled is True
            else f"enabled={text} and torch.cuda.is_available()")
    if name == "torch.cuda.amp.GradScaler" or device is None:
        what = name if name == "torch.cuda.amp.GradScaler" else f'{name}\'s default device "cuda"'
        return [f"{what} disables the scaler where CUDA is not available (a CPU-only run "
                "trains unscaled); ua.GradScaler without device= scales on the parameters' "
                f"device, the CPU included: write {keep} to keep the original behaviour"]
    if isinstance(device, str) and device.startswith("cuda"):
        return [f'device="{device}": where CUDA is not available torch disables its scaler, '
                f"unifiedamp's raises (naming the fix): write {keep} to keep the original "
                "behaviour"]
    return []


def _grouped(text: str) -> bool:
    """Whether ``text`` is one parenthesised group, ``(a == b)`` (not ``(a) or (b)``)."""
    depth = 0
    for index, char in enumerate(text):
        depth += (char == "(") - (char == ")")
        if depth == 0 and index < len(text) - 1:
            return False
    return text.startswith("(")


def _usage_problem(site: CallSite, framework: str, to: str) -> None:
    # An imperative scaler, a Keras optimizer and a jmp value are used differently: the
    # constructor alone does not port the training loop.
    kinds = {"torch": "imperative", "paddle": "imperative", "keras": "keras", "jmp": "jmp",
             "flax": "flax"}  # Flax's DynamicScale: its own value_and_grad loop
    if kinds[framework] != kinds[to]:
        site.problems.append(f"a {framework} scaler is used differently from a {to} one: "
                             f"port the training loop too ({_USAGE[to]})")


def _keep_expressions(site: CallSite, qualname: str, kwargs: dict[str, Any],
                      exprs: dict[str, _Expr]) -> dict[str, Any]:
    """Puts each non-literal argument back where the target has a parameter of the same
    meaning; reports the others (their value is unknown, so the port cannot be checked)."""
    names = NATIVE_SCALERS[qualname]
    row = _config._spec(names, sorted(names["versions"], key=int)[-1])
    by_canonical = {canonical: param for param, canonical in row["names"].items()}
    out = dict(kwargs)
    for canonical, expr in exprs.items():
        param = by_canonical.get(canonical)
        if canonical == "factor" and "factor" in out:
            param = "factor"
        if param is None or param not in out or (canonical in ("growth_factor",
                                                               "backoff_factor")
                                                 and "factor" in out):
            site.problems.append(f"{canonical if canonical != 'factor' else 'factor'}="
                                 f"{expr.code} is not a literal, and {qualname} has no "
                                 "parameter of the same meaning: write the value")
            continue
        out[param] = expr
    return out


# ------------------------------------------------------------------ verbs


def _verb_of(cst: Any, module: Any, node: Any,
             scalers: dict[str, tuple[str, bool]]) -> tuple[str, str] | None:
    """``(variable, method)`` when ``node`` is a method call on a ported scaler variable."""
    if not isinstance(node, cst.Call) or not isinstance(node.func, cst.Attribute):
        return None
    variable = module.code_for_node(node.func.value)
    if variable not in scalers:
        return None
    return variable, node.func.attr.value


def _verb_name(framework: str, method: str, to: str) -> str | None:
    """A torch or paddle scaler method's name in the target (None: no counterpart)."""
    if framework == "paddle" and method in _PADDLE_ONLY:
        return {"paddle": method, "unifiedamp": _PADDLE_ONLY[method]}.get(to)
    canonical = method if framework == "torch" else _PADDLE_TO_TORCH[method]
    if to in ("torch", "unifiedamp"):  # unifiedamp's torch and paddle backends: torch's verbs
        return canonical
    if to == "paddle":
        return _TORCH_TO_PADDLE[canonical]
    return None  # Keras and jmp have no scaler verbs


def _port_verb(ctx: _Context, node: Any, source: str,
               method: str) -> tuple[CallSite | None, str | None]:
    """The plan for one method call on a scaler (None: not a scaler verb), and the
    method's new name (None: it has none)."""
    framework = NATIVE_SCALERS[source]["framework"]
    to = ctx.to
    text = ctx.code(node)
    site = CallSite(0, "verb", f"{source}.{method}", to, text, text)
    if framework == "keras":
        return None, None  # an optimizer's methods: the replacing optimizer has them too
    if framework == "flax":
        return None, None  # its value_and_grad loop and fields: _port_flax_loop
    if framework == "jmp":
        if method not in _JMP_VERBS or to == "jmp":
            return None, None
        if to != "unifiedamp":
            site.problems.append(f"jmp's {method}() has no {to} counterpart: {_USAGE[to]}")
            return site, None
        if method == "unscale":
            site.problems.append("unscale(grads) returns (grads, finite) in unifiedamp "
                                 "(jmp: grads): unpack it")
            return site, None
        new: str | None = {"scale": "scale", "adjust": "update"}[method]
        if new != method:
            site.notes.append(f"jmp's {method}(finite) is unifiedamp's {new}(finite): both "
                              "return the new scaler")
        return site, new
    verbs = _TORCH_TO_PADDLE if framework == "torch" else {**_PADDLE_TO_TORCH, **_PADDLE_ONLY}
    if method not in verbs or framework == to:
        return None, None  # not a scaler verb, or the same framework's verbs
    new = _verb_name(framework, method, to)
    if new is None:
        usage = _USAGE[to] if to in ("keras", "jmp") else f"{_USAGE[to]}; or keep unifiedamp's " \
            f"{framework} backend (--to unifiedamp), which has it"
        site.problems.append(f"{method}() has no {to} counterpart: {usage}")
        return site, None
    if method == "update" and node.args and to == "paddle":
        site.problems.append("update(new_scale): paddle's update() takes no argument; "
                             "set the scale another way")
        return site, None
    if method in ("state_dict", "load_state_dict") and to != "unifiedamp":
        site.notes.append(f"{method}(): a {to} state dict's format differs from {framework}'s: "
                          "convert checkpoints with `unifiedamp port-state`")
    site.notes.append(f"{method}() is {new}() in {to}" if new != method
                      else f"{method}(): the same in {to}")
    return site, new


# ------------------------------------------------------------------ Flax's DynamicScale


def _flax_config(site: CallSite, bound: dict[str, Any], config: ScalerConfig,
                 exprs: dict[str, _Expr]) -> ScalerConfig:
    """The config whose spec trajectory is DynamicScale's: Flax grows when ``fin_steps ==
    growth_interval``, on the (growth_interval + 1)-th finite step in a row, so the spec's
    interval is one more; a growth past float32's maximum is clamped to it, the spec's
    ``max_scale``."""
    interval = exprs.get("growth_interval")
    if interval is not None:
        code = interval.code
        exprs["growth_interval"] = _Expr(f"{code} + 1" if code.replace(".", "").isidentifier()
                                         else f"({code}) + 1")
        written = exprs["growth_interval"].code
    else:
        written = str(config.growth_interval + 1)
    # config_from_call's note names Flax's number: say which one the call writes.
    site.notes = [f"{n[:-1]}; written as growth_interval={written}, below)"
                  if n.startswith("default: growth_interval=") else n for n in site.notes]
    fin_steps = bound.get("fin_steps", 0)
    if isinstance(fin_steps, _Expr) or fin_steps != 0:
        site.problems.append(
            f"fin_steps={_fmt(fin_steps)} is state (finite steps since the last growth), not "
            "config: the written scaler starts at growth_tracker=0; restore the state from a "
            "checkpoint instead (scaler.restore(...), unifiedamp port-state)")
    site.notes.append(
        "Flax's DynamicScale grows when fin_steps == growth_interval, on the "
        f"(growth_interval + 1)-th finite step in a row: one step later than unifiedamp's rule "
        f"with the same number, so growth_interval={written} here keeps Flax's trajectory, "
        "and max_scale=float32's maximum keeps its clamp of a growth past it (outside "
        "jax.jit Flax's first update is computed in float64: one float32 ulp apart for a "
        "factor that is not a power of two)")
    return config.replace(growth_interval=config.growth_interval + 1, max_scale=FLOAT32_MAX)
