"""Writing the target's calls for :func:`~unifiedamp.porting.port_source`: each native
constructor call as the target's constructor, every value explicit, and each method call on
a ported scaler (a "verb") as the target's method where the mapping is exact.

The semantics are :func:`~unifiedamp.porting.config_from_call` and
:func:`~unifiedamp.porting.native_call`; what the target cannot express becomes a problem on
the call's :class:`~unifiedamp.porting.CallSite`, each saying what to do instead.
"""

from __future__ import annotations

import json
from typing import Any

from unifiedamp.porting import _config
from unifiedamp.porting._config import NATIVE_SCALERS
from unifiedamp.porting._source_read import CallSite, _Context, _NotLiteral
from unifiedamp.spec import ScalerConfig
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
            value = _Expr(ctx.code(arg.value))
        if arg.keyword is None:
            args.append(value)
        else:
            kwargs[arg.keyword.value] = value
    try:
        # The private helpers bind as config_from_call does, to know which parameter each
        # non-literal argument is.
        row = _config._spec(NATIVE_SCALERS[name],
                         _config._version(name, NATIVE_SCALERS[name], ctx.version)[0])
        bound = _config._bind(name, row, tuple(args), kwargs)
        exprs, values = _placeholders(row, bound)
        config, notes = _config.config_from_call(name, (), values, version=ctx.version)
    except (TypeError, ValueError) as exc:
        site.problems.append(f"{exc}: left as it is")
        return site, None
    site.notes += notes
    site.config = {k: exprs[k].code if k in exprs else repr(v)
                   for k, v in config.to_dict().items()}
    callee, kwargs_text, extra = _target_call(ctx, site, node, row, bound, config, exprs)
    text = f"{callee}({', '.join(kwargs_text)}){extra}"
    new = ctx.cst.parse_expression(text)
    # Keep the call's own parentheses and whitespace around it.
    new = new.with_changes(lpar=node.lpar, rpar=node.rpar)
    site.after = ctx.code(new)
    return site, new


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
    inner = bound.get("inner_optimizer")  # Keras's: the optimizer the scaler wraps
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
            carried.add("inner_optimizer")
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
        carried.add("inner_optimizer")
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
    kinds = {"torch": "imperative", "paddle": "imperative", "keras": "keras", "jmp": "jmp"}
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
