"""Flax's ``DynamicScale`` loop for :func:`~unifiedamp.porting.port_source`: its
``value_and_grad`` wrapper and ``is_fin`` flag in the JAX backend's idiom (the constructor is
written by ``_source_write``, with the interval that keeps Flax's trajectory).
"""

from __future__ import annotations

from typing import Any

from unifiedamp.porting._source_read import CallSite, _Context, _NotLiteral, _walk
from unifiedamp.porting._source_write import _USAGE
from unifiedamp.spec._state_dict import FLAX_SCALER as _FLAX

#: DynamicScale's state fields read in a loop -> the JAX scaler's attribute of the same value.
_FLAX_STATE = {"scale": "loss_scale", "fin_steps": "growth_tracker"}


def _arg(node: Any, position: int, keyword: str) -> Any:
    """The value of a call's argument by position or keyword (None: not given)."""
    for index, arg in enumerate(node.args):
        if (arg.keyword is not None and arg.keyword.value == keyword) or (
                arg.keyword is None and not arg.star and index == position):
            return arg.value
    return None


def _port_flax_loop(ctx: _Context, positions: Any, scalers: dict[str, tuple[str, bool]],
                    sites: list[CallSite]) -> tuple[list[CallSite], dict[Any, Any]]:
    """DynamicScale's loop in the JAX backend's idiom: the sites, and the nodes to replace.

    ``grad_fn = ds.value_and_grad(loss_fn, has_aux=..., axis_name=...)`` and its call
    ``ds, is_fin, aux, grads = grad_fn(params)`` (or the two in one statement) become
    ``jax.value_and_grad`` of the scaled loss, then ``unscale`` (after Flax's ``pmean``
    where it averages across replicas) and ``ds = ds.update(is_fin)``; Flax's
    ``jnp.where(is_fin, new, old)`` selects keep working with that ``is_fin``. ``ds.scale``
    and ``ds.fin_steps`` become ``loss_scale`` and ``growth_tracker``. The scaler is found
    by its variable, or by an attribute of the same name (``state.dynamic_scale``, a
    ``TrainState`` field). What does not fit is a problem on its line.
    """
    cst, module = ctx.cst, ctx.module
    held = {v for v, (source, rewritten) in scalers.items() if source == _FLAX and rewritten}
    if not held:
        return [], {}
    tails = {v.rsplit(".", 1)[-1] for v in held}
    top: dict[Any, int] = {}  # node -> the index of its top-level statement
    for index, stmt in enumerate(module.body):
        for node in _walk(cst, stmt):
            top[node] = index
    calls = [n for n in _walk(cst, module) if isinstance(n, cst.Call)]
    funcs = {n.func for n in calls}
    lines: dict[Any, Any] = {}  # Assign -> its SimpleStatementLine
    for node in _walk(cst, module):
        if isinstance(node, cst.SimpleStatementLine) and len(node.body) == 1 \
                and isinstance(node.body[0], cst.Assign):
            lines[node.body[0]] = node

    def held_by(node: Any) -> bool:
        return ctx.code(node) in held or (isinstance(node, cst.Attribute)
                                          and node.attr.value in tails)

    out: list[CallSite] = []
    replacements: dict[Any, Any] = {}
    found = False
    for node in _walk(cst, module):
        if not isinstance(node, cst.Attribute) or not held_by(node.value):
            continue
        receiver, attr = ctx.code(node.value), node.attr.value
        line = positions[node].start.line
        if node not in funcs:
            if attr in _FLAX_STATE and ctx.to == "unifiedamp":
                new = node.with_changes(attr=cst.Name(_FLAX_STATE[attr]))
                replacements[node] = new
                out.append(CallSite(line, "verb", f"{_FLAX}.{attr}", ctx.to, ctx.code(node),
                                    ctx.code(new), notes=[
                                        f"DynamicScale's .{attr} is the JAX scaler's "
                                        f".{_FLAX_STATE[attr]} (the same value)"]))
            continue
        if attr != "value_and_grad":
            text = ctx.code(node)
            out.append(CallSite(line, "verb", f"{_FLAX}.{attr}", ctx.to, text, text, problems=[
                f"{text}(...) is DynamicScale's {attr}(): port it by hand (the JAX scaler "
                "sets its config with with_config(...) and its state with restore(...))"]))
            continue
        found = True
        call = next(c for c in calls if c.func is node)
        site = CallSite(line, "verb", f"{_FLAX}.value_and_grad", ctx.to, ctx.code(call),
                        ctx.code(call))
        out.append(site)
        if ctx.to != "unifiedamp":
            site.problems.append(f"Flax's value_and_grad loop has no {ctx.to} counterpart: "
                                 f"{_USAGE[ctx.to]}")
            continue
        ctx.at = top[call]
        rewrite = _flax_rewrite(ctx, call, receiver, lines, calls)
        if isinstance(rewrite, str):
            site.problems.append(rewrite)
            continue
        news, fn_call, stmt, text = rewrite
        if fn_call is not None:
            replacements[call] = fn_call
            site.after = ctx.code(fn_call)
        replacements[stmt] = cst.FlattenSentinel(news)
        site.notes.append(
            f"DynamicScale's value_and_grad loop, in the JAX backend's idiom: {text} (the "
            "jnp.where(is_fin, new, old) selects keep working with the flag unscale returns; "
            "step_if_finite is the faster form). The same scale trajectory and skipped steps; "
            "the parameters can differ in their last bits, where XLA fuses unscale's "
            "multiplication into the optimizer's update otherwise than Flax's division (and "
            "Flax casts gradients to float32 first)")
    if not found:
        for site in sites:
            if site.source == _FLAX and site.kind == "constructor" and ctx.to == "unifiedamp":
                site.problems.append(
                    "no value_and_grad call on this scaler in this file: unifiedamp's JAX "
                    "scaler has none; port the training step that calls it too (scale the "
                    "loss, jax.value_and_grad, unscale, scaler = scaler.update(finite))")
    return out, replacements


def _flax_rewrite(ctx: _Context, call: Any, receiver: str, lines: dict[Any, Any],
                  calls: list[Any]) -> tuple[list[Any], Any, Any, str] | str:
    """The statements that replace a ``value_and_grad`` call's use, the call to put in the
    place of the ``value_and_grad`` call (None: it is part of that statement), that
    statement, and the new code as one line; or a problem saying why not."""
    cst = ctx.cst
    fun, argnums = _arg(call, 0, "fun"), _arg(call, 1, "argnums")
    has_aux, axis = _arg(call, 2, "has_aux"), _arg(call, 3, "axis_name")
    try:
        aux = False if has_aux is None else ctx.literal(has_aux)
    except (_NotLiteral, ArithmeticError, TypeError, ValueError):
        aux = None
    if fun is None or not isinstance(aux, bool) or any(a.star for a in call.args):
        return (f"{ctx.code(call)}: port rewrites value_and_grad(fun, argnums, has_aux=True or "
                "False, axis_name) with literal has_aux only; port it by hand")
    # Where the result is unpacked: `ds, is_fin, aux, grads = grad_fn(...)`, or the call
    # made in that statement (`... = ds.value_and_grad(f)(params)`).
    named = ctx.assigned.get(call, [])
    uses = [c for c in calls if c.func is call or (len(named) == 1 and ctx.code(c.func)
                                                   == named[0])]
    assigns = [a for a in lines if any(a.value is c for c in uses)
               and len(a.targets) == 1 and isinstance(a.targets[0].target, (cst.Tuple,
                                                                              cst.List))
               and len(a.targets[0].target.elements) == 4]
    if len(assigns) != 1:
        return (f"{ctx.code(call)}: port rewrites it where its function is called once, its "
                "result unpacked into four names (ds, is_fin, aux, grads = grad_fn(params)); "
                f"found {len(assigns)} such calls; port it by hand")
    assign = assigns[0]
    ds, fin, aux_out, grads = (ctx.code(e.value) for e in assign.targets[0].target.elements)
    jax = ctx.prefix("jax")
    loss = "out[0]" if aux else "out"
    extra = f", argnums={ctx.code(argnums)}" if argnums is not None else ""
    fn = (f"{jax}.value_and_grad(lambda *args: (lambda out: ({receiver}.scale({loss}), out))"
          f"({ctx.code(fun)}(*args)){extra}, has_aux=True)")
    if assign.value.func is call:
        args = (ctx.code(a.with_changes(comma=cst.MaybeSentinel.DEFAULT))
                for a in assign.value.args)
        result = f"{fn}({', '.join(args)})"
        fn_call = None
    else:
        result, fn_call = ctx.code(assign.value), cst.parse_expression(fn)
    news = [f"(_, {aux_out}), {grads} = {result}"]
    if axis is not None:  # Flax averages the gradients across replicas; unscale does not
        news.append(f"{grads} = {jax}.lax.pmean({grads}, axis_name={ctx.code(axis)})")
    axis_arg = f", axis_name={ctx.code(axis)}" if axis is not None else ""
    news += [f"{grads}, {fin} = {receiver}.unscale({grads}{axis_arg})",
             f"{ds} = {receiver}.update({fin})"]
    stmt = lines[assign]
    nodes = [cst.parse_statement(text + "\n") for text in news]
    nodes[0] = nodes[0].with_changes(leading_lines=stmt.leading_lines)
    nodes[-1] = nodes[-1].with_changes(trailing_whitespace=stmt.trailing_whitespace)
    return nodes, fn_call, stmt, "; ".join(news)
