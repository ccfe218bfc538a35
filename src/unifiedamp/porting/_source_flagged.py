"""The calls :func:`~unifiedamp.porting.port_source` flags without rewriting: Paddle's
static-graph AMP (``paddle.static.amp.decorate``), which has no scaler object, and the
wrappers that replace a private method of a Paddle scaler (``shard_scaler``,
``distributed_scaler``...), which a ported scaler never calls.
"""

from __future__ import annotations

from typing import Any

from unifiedamp.porting._source_read import CallSite, _Context, _NotLiteral
from unifiedamp.porting._source_write import _fmt

#: Paddle's static-graph AMP: the optimizer ``decorate`` returns scales the loss inside the
#: static Program, where no scaler object exists to rewrite.
_STATIC_AMP = frozenset({"paddle.static.amp.decorate", "paddle.static.amp.decorator.decorate",
                         "paddle.fluid.contrib.mixed_precision.decorate",
                         "paddle.fluid.contrib.mixed_precision.decorator.decorate"})
# Its loss-scaling keywords: paddle.amp.GradScaler takes each under the same name.
_STATIC_SCALING = ("init_loss_scaling", "incr_ratio", "decr_ratio", "incr_every_n_steps",
                   "decr_every_n_nan_or_inf", "use_dynamic_loss_scaling")

#: Calls that replace a private method of the paddle scaler passed to them: the call ->
#: (how the scaler is passed: a position and a keyword, the method, what the patch does).
_PATCHING = {
    "paddle.distributed.shard_scaler": (0, "scaler", "_unscale",
                                        "reshards found_inf across the process meshes of "
                                        "auto-parallel (DistTensor) gradients"),
    "paddle.distributed.fleet.distributed_scaler": (0, "scaler", "_unscale",
                                                    "all-reduces found_inf across the "
                                                    "hybrid-parallel groups"),
    "paddle.distributed.sharding.group_sharded_parallel": (3, "scaler", "_unscale",
                                                           "all-reduces found_inf across "
                                                           "the sharding group"),
    "paddle.distributed.fleet.meta_parallel.sharding.group_sharded_utils.GroupShardedScaler":
        (0, "scaler", "_unscale", "all-reduces found_inf across the sharding group"),
}
_PATCHING["paddle.distributed.auto_parallel.api.shard_scaler"] = \
    _PATCHING["paddle.distributed.shard_scaler"]
_PATCHING["paddle.distributed.fleet.scaler.distributed_scaler"] = \
    _PATCHING["paddle.distributed.fleet.distributed_scaler"]


def _static_amp(ctx: _Context, node: Any) -> CallSite | None:
    """A problem for a call of Paddle's static-graph ``decorate``, its loss-scaling
    arguments read where literal (None: not that call)."""
    name = next(iter(sorted(ctx.imported(node.func) & _STATIC_AMP)), None)
    if name is None:
        return None
    given = []
    for arg in node.args:
        if arg.keyword is not None and arg.keyword.value in _STATIC_SCALING:
            try:
                value = _fmt(ctx.literal(arg.value))
            except (_NotLiteral, ArithmeticError, TypeError, ValueError):
                value = f"{ctx.code(arg.value)} (not a literal)"
            given.append(f"{arg.keyword.value}={value}")
    scaling = (f"its loss scaling: {', '.join(given)}" if given else
               "its loss scaling: decorate's defaults (2**15, x2 every 1000 steps, x0.8 after 2 "
               "overflows in the float16-only form; 2**16, 2000, 0.5, 1 in the general one)")
    text = ctx.code(node)
    return CallSite(0, "constructor", name, ctx.to, text, text, problems=[
        f"{name}(...) is Paddle's static-graph AMP: the optimizer it returns scales the loss "
        f"inside the static Program, and port rewrites dynamic-graph scalers only ({scaling}); "
        "left as it is. To port it, train in dynamic-graph mode (no paddle.enable_static()) "
        "with paddle.amp.auto_cast and paddle.amp.GradScaler(...) taking these same keywords "
        "(write every value: decorate's defaults differ from GradScaler's), or unifiedamp's "
        "paddle backend, ua.GradScaler(..., backend='paddle'), then port again"])


def _patching_wrappers(ctx: _Context, node: Any, positions: Any,
                       scalers: dict[str, tuple[str, bool]]) -> CallSite | None:
    """A problem for a call that patches a private method of a scaler this port rewrote
    into a class other than Paddle's own (None: not such a call)."""
    name = next(iter(sorted(ctx.imported(node.func) & set(_PATCHING))), None)
    if name is None or ctx.to == "paddle":  # paddle.amp.GradScaler stays: the patch works
        return None
    position, keyword, method, what = _PATCHING[name]
    positional = [arg for arg in node.args if arg.keyword is None and not arg.star]
    passed = [arg.value for arg in node.args if arg.keyword is not None
              and arg.keyword.value == keyword]
    if len(positional) > position:
        passed.append(positional[position].value)
    variable = next((ctx.code(v) for v in passed if ctx.code(v) in scalers
                     and scalers[ctx.code(v)][1]), None)
    if variable is None:
        return None
    text = ctx.code(node)
    if ctx.to == "unifiedamp":
        fix = (f"unifiedamp's paddle scaler never calls {method} (its step() calls unscale_(), "
               "which all-reduces found_inf (MAX) over process_group, by default every rank, "
               "so every rank skips the same steps): drop this call and pass the scaler on "
               "as it is, with process_group= where only a group must agree; where the "
               "patch is needed (auto-parallel gradients on several process meshes), keep "
               "paddle.amp.GradScaler (port --to paddle)")
    else:
        fix = (f"it takes a paddle.amp.GradScaler, and {variable} is now a "
               f"{ctx.to} scaler: port this distributed setup by hand")
    return CallSite(positions[node].start.line, "reference", name, ctx.to, text, text,
                    problems=[f"{name}({variable}) replaces the scaler's private {method} with "
                              f"one that {what}; {fix}"])
