"""The Keras backend: a ``LossScaleOptimizer`` that follows the spec bit for bit, on every
Keras backend (TensorFlow, JAX, torch).

``scaler.wrap(inner)`` returns a :class:`SpecLossScaleOptimizer`: a subclass of
``keras.optimizers.LossScaleOptimizer`` (so ``model.compile`` does not wrap it a
second time under a ``mixed_float16`` policy) whose variables hold the scale and
both trackers, and whose update is the spec's rule written in ``keras.ops``.
Keras 3.15's own class is not used even for the configs it can express: it has
no inf guard on growth (growth past float32 makes the scale inf), divides by
the scale instead of multiplying by ``f32(1 / scale)``, fails in ``apply()``
under the JAX backend, and under ``tf.distribute.MirroredStrategy`` decides on
the first replica's local gradients (an inf on another replica is applied).

TensorFlow and XLA flush float32 subnormals to zero, so the scale's update and
its reciprocal are computed on bit patterns, as the JAX backend does (see
``unifiedamp/backends/jax.py`` for the derivation): the scale follows the spec
bit for bit at every float32 value on every Keras backend.
"""

from __future__ import annotations

import gc
import math
import sys
import warnings
import weakref
from functools import partial
from typing import Any

import keras
import numpy as np
from keras import ops
from keras.src.utils import tracking

from unifiedamp import spec
from unifiedamp._scaler import (
    GradScaler,
    HostCounters,
    NoInfChecksError,
    diagnostics_options,
    is_flag,
    new_scale_value,
    update_arguments,
    watched_pairs,
)
from unifiedamp._tree import leaves, tree_map
from unifiedamp.diagnostics import GradientOverflow, OverflowReport, ScaleHistory, count_overflow
from unifiedamp.spec import MIN_UNSCALABLE, ScalerConfig, ScalerState, f32, f32_bits

__all__ = ["KerasGradScaler", "SpecLossScaleOptimizer"]

_EXP_MASK = 0x7F800000
_MIN_NORMAL_BITS = 0x00800000


# ------------------------------------------------------------ float32 on bit patterns


def _i32(x: Any) -> Any:
    return ops.view(ops.cast(x, "float32"), "int32")


def _f32(bits: Any) -> Any:
    return ops.view(ops.cast(bits, "int32"), "float32")


def _int(value: int) -> Any:
    return ops.convert_to_tensor(value, dtype="int32")


def _mantissa(x: Any) -> Any:
    """The 24-bit significand of a normal float32, as an int32."""
    return ops.bitwise_or(ops.bitwise_and(_i32(x), _int(0x7FFFFF)), _int(0x800000))


def _product_error(a: Any, b: Any, p: Any) -> Any:
    """``a * b - p`` exactly, in units of 2**-46, as an int32: for ``a``, ``b`` in [1, 2) and
    ``p`` in [1, 4) within half an ulp of ``a * b`` (so the result fits in 24 bits).

    Integer arithmetic on 12-bit halves of the significands: TensorFlow's graph
    optimizer (tf.function without XLA) reassociates float sums, which breaks the
    float version of Dekker's product the JAX backend uses; integer sums are exact
    in any order.
    """
    x, c = _mantissa(a), _mantissa(b)
    xh, xl = ops.right_shift(x, 12), ops.bitwise_and(x, _int(0xFFF))
    ch, cl = ops.right_shift(c, 12), ops.bitwise_and(c, _int(0xFFF))
    # p = pm * 2**(pe - 23); in units of 2**-46 it is pm << (23 + pe) = hh * 2**24 + hl.
    pb = _i32(p)
    pe = ops.right_shift(pb, 23) - 127
    pm = _mantissa(p)
    hh = ops.right_shift(pm, 1 - pe)
    hl = ops.where(ops.equal(pe, 0), ops.left_shift(ops.bitwise_and(pm, _int(1)), 23), _int(0))
    mid = xh * cl + xl * ch  # < 2**25
    high = xh * ch - hh + ops.right_shift(mid, 12)
    low = ops.left_shift(ops.bitwise_and(mid, _int(0xFFF)), 12) + xl * cl - hl
    return high * (1 << 24) + low


def _round_half_even(v: Any, below: Any) -> Any:
    """``v`` rounded to an int32, ties to even, where ``v`` is a rounded value and ``below``
    (any sign-carrying number) the remainder it dropped: a tie goes up when it is > 0."""
    floor = ops.floor(v)
    frac = v - floor
    odd = ops.not_equal(ops.floor(floor * 0.5) * 2.0, floor)
    tie_up = ops.logical_or(ops.greater(below, 0),
                            ops.logical_and(ops.equal(below, 0), odd))
    up = ops.logical_or(frac > 0.5, ops.logical_and(ops.equal(frac, 0.5), tie_up))
    return ops.cast(floor, "int32") + ops.cast(up, "int32")


def _normalised(bits: Any) -> tuple[Any, Any]:
    """``(xn, ex)`` with the non-zero float32 of ``bits`` equal to ``xn * 2**ex``, xn in [1, 2)
    a normal float32 and ex an int32, subnormals included (their mantissa, an int below
    2**23, converts to float32 exactly and carries its own exponent)."""
    ebits = ops.bitwise_and(ops.right_shift(bits, 23), _int(0xFF))
    mant = ops.bitwise_and(bits, _int(0x7FFFFF))
    subnormal = ops.equal(ebits, 0)
    as_float = _i32(ops.cast(mant, "float32"))
    frac = ops.where(subnormal, ops.bitwise_and(as_float, _int(0x7FFFFF)), mant)
    ex = ops.where(subnormal, ops.right_shift(as_float, 23) - 127 - 149, ebits - 127)
    return _f32(ops.bitwise_or(_int(127 << 23), frac)), ex


def _mul_bits(bits: Any, cn: Any, ec: Any) -> Any:
    """The bits of ``f32(x * c)`` for the non-negative float32 ``x`` of ``bits`` and a positive
    float32 ``c = cn * 2**ec`` (``cn`` a float32 in [1, 2), ``ec`` an int32: tensors, the
    rule's factors are a variable's values), rounded to nearest even, subnormals included."""
    xn, ex = _normalised(bits)
    hi = xn * cn
    lo = _product_error(xn, cn, hi)
    hbits = _i32(hi)
    e_res = ops.bitwise_and(ops.right_shift(hbits, 23), _int(0xFF)) + ex + ec
    normal = ops.bitwise_or(ops.bitwise_and(hbits, _int(0x7FFFFF)), ops.left_shift(e_res, 23))
    s = ops.clip(149 + ex + ec, -60, 30)  # below -60 the result rounds to 0 anyway
    two_s = _f32(ops.left_shift(s + 127, 23))
    tiny = _round_half_even(hi * two_s, lo)
    out = ops.where(e_res >= 255, _int(_EXP_MASK), ops.where(e_res >= 1, normal, tiny))
    return ops.where(ops.equal(bits, 0), _int(0), out)


def _reciprocal_of_mantissa(m: Any) -> Any:
    """``f32(1 / m)`` for a float32 ``m`` in [1, 2), correctly rounded, in (0.5, 1].

    ``1 / m`` is a division in eager TensorFlow, JAX and torch, but TensorFlow's graph
    optimizer (tf.function without XLA, 2.21) turns it into an approximate reciprocal,
    up to 3 ulps off over every m in [1, 2): of ``1 / m`` and its four neighbours on
    each side, the one with the smallest exact ``|m * r - 1|`` is taken.
    """
    r0 = _i32(1.0 / m)
    best_r, best_err = None, None
    for step in range(-4, 5):
        r = _f32(r0 + step)
        # 2 * r is in [1, 2) for r in [0.5, 1): m * (2 * r) - 2 exactly, as an int.
        err = ops.absolute(_product_error(m, r * 2.0, ops.convert_to_tensor(2.0, "float32")))
        if best_r is None:
            best_r, best_err = r, err
        else:
            better = err < best_err
            best_r, best_err = ops.where(better, r, best_r), ops.where(better, err, best_err)
    return ops.where(ops.equal(m, 1.0), ops.convert_to_tensor(1.0, "float32"), best_r)


def _reciprocal_bits(bits: Any) -> Any:
    """The bits of ``f32(1 / scale)`` (the float64 reciprocal rounded once), for the
    non-negative float32 scale of ``bits``, at every scale: 1 / (m * 2**e) is
    (1 / m) * 2**-e, an exponent shift of the correctly rounded 1 / m, or, where that
    is subnormal (scales above 2**126), 1 / m rounded again to a multiple of 2**-149
    with the sign of the exact 1 - m * r breaking a tie."""
    m, e = _normalised(bits)
    r = _reciprocal_of_mantissa(m)
    rb = _i32(r)
    e_res = ops.right_shift(rb, 23) - e  # biased exponent of the result
    normal = ops.bitwise_or(ops.bitwise_and(rb, _int(0x7FFFFF)), ops.left_shift(e_res, 23))
    s = ops.clip(149 - e, 0, 30)  # only used where the result is subnormal: e >= 126
    t = r * _f32(ops.left_shift(s + 127, 23))
    below = -_product_error(m, r * 2.0, ops.convert_to_tensor(2.0, "float32"))
    tiny = _round_half_even(t, below)
    out = ops.where(e_res >= 255, _int(_EXP_MASK), ops.where(e_res >= 1, normal, tiny))
    return ops.where(ops.equal(bits, 0), _int(_EXP_MASK), out)


def _split(bits: Any) -> tuple[Any, Any]:
    """Two normal float32 factors whose product is the float32 of ``bits`` (see jax.py)."""
    subnormal = bits < _MIN_NORMAL_BITS
    hi = ops.where(subnormal, ops.cast(bits, "float32") * 2.0**-85, _f32(bits))
    lo = ops.where(subnormal, 2.0**-64, 1.0)
    return ops.stop_gradient(hi), ops.stop_gradient(lo)


def _multiply(x: Any, hi: Any, lo: Any | None) -> Any:
    dtype = keras.backend.standardize_dtype(x.dtype)
    wide = ops.cast(x, "float32") if dtype in ("float16", "bfloat16") else x
    product = wide * ops.cast(hi, wide.dtype)
    if lo is not None:
        product = product * ops.cast(lo, wide.dtype)
    return ops.cast(product, dtype)


def _all_finite(grads: list[Any]) -> Any:
    """True where every element of every gradient is finite.

    Exact on every backend; the form is the fastest exact one measured per backend
    (``benchmarks/bench_keras_check.py``: a 5.25M-parameter MLP, SGD, 2-core CPU).

    Under JAX, ``min(int8(isfinite(g))) > 0`` per gradient: XLA's CPU lowers
    ``all(isfinite(g))`` as a bool array reduced through a tree of reduce-windows, and
    an int8 minimum is one vectorised reduce (1.04x against 1.11x a plain step; 1.11x
    against 1.16x with mixed_float16). Float reductions are not exact there (a large
    array's ``max`` drops a NaN) or fuse badly (a ``sum`` pulls the mixed_float16
    gradient's transposed copy into it: 1.5-1.9x).

    In a TensorFlow graph each op is a pass of its own, and ``isfinite`` then ``all``
    writes a bool tensor and reads it back; a float32 ``sum(g)`` reads the gradient
    once. A finite sum proves every element finite (an inf or NaN term makes any sum
    inf or NaN); a sum that overflowed although every element is finite is told apart
    by the exact test, run only then (1.051x against 1.076x plain for the same step).
    """
    grads = [g for g in grads if g is not None]

    def every(grads: list[Any], test: Any) -> Any:
        finite = ops.convert_to_tensor(True)
        for g in grads:
            finite = ops.logical_and(finite, test(g))
        return finite

    def exact(grads: list[Any]) -> Any:
        return every(grads, lambda g: ops.all(ops.isfinite(g)))

    backend = keras.backend.backend()
    if backend == "jax":
        # An empty gradient is finite (and the min of nothing fails).
        return every([g for g in grads if math.prod(g.shape)],
                     lambda g: ops.greater(ops.min(ops.cast(ops.isfinite(g), "int8")), 0))
    if backend != "tensorflow":
        return exact(grads)
    # float16 sums of scaled gradients overflow often: those take the exact test.
    wide: list[Any] = []
    narrow: list[Any] = []
    for g in grads:
        wide_dtype = keras.backend.standardize_dtype(g.dtype) in ("float32", "float64")
        (wide if wide_dtype else narrow).append(g)
    finite = exact(narrow)
    if wide:
        sums = ops.stack([ops.cast(ops.sum(g), "float32") for g in wide])
        finite = ops.logical_and(finite, ops.cond(
            ops.all(ops.isfinite(sums)),
            lambda: ops.convert_to_tensor(True), lambda: exact(wide)))
    return finite


def _select(finite: Any, new: Any, old: Any) -> Any:
    """``new`` where ``finite``, else ``old``, bit for bit (old may be a variable)."""
    old = ops.convert_to_tensor(old)
    return ops.where(finite, ops.cast(new, old.dtype), old)


# ------------------------------------------------------------ the protocol's flag


def _traced(value: Any) -> bool:
    """Whether ``value`` is a symbolic value the host cannot read: a KerasTensor, a tensor
    of a ``tf.function`` graph, a JAX tracer (frameworks looked up only when imported)."""
    if isinstance(value, keras.KerasTensor):
        return True
    tf = sys.modules.get("tensorflow")
    if tf is not None and tf.is_tensor(value):
        return bool(tf.is_symbolic_tensor(value))
    jax = sys.modules.get("jax")
    return jax is not None and isinstance(value, jax.core.Tracer)


def _host_flag(finite: Any) -> bool:
    """The flag as a Python bool (a host read); a symbolic flag is refused."""
    if isinstance(finite, (bool, np.bool_)):
        return bool(finite)
    if _traced(finite):
        raise TypeError(
            f"update(finite) got a symbolic flag ({type(finite).__name__}) inside a compiled "
            "function (tf.function, jax.jit): update() reads the flag on the host, in an "
            "eager loop. Inside a compiled step, use the optimizer scaler.wrap(optimizer) "
            "returns: its apply(grads) checks, skips and updates on the device")
    return bool(ops.convert_to_numpy(finite))


# ------------------------------------------------------------ diagnostics


def _gradient_stats(g: Any) -> tuple[Any, Any, Any]:
    """(inf count, NaN count, largest finite |g|) of one gradient: int32, int32, float32."""
    g = ops.convert_to_tensor(g)
    if keras.backend.standardize_dtype(g.dtype) in ("float16", "bfloat16"):
        g = ops.cast(g, "float32")
    if any(n == 0 for n in g.shape):  # ops.max of nothing fails; unknown sizes are None
        return _int(0), _int(0), ops.convert_to_tensor(0.0, "float32")
    inf = ops.sum(ops.cast(ops.isinf(g), "int32"))
    nan = ops.sum(ops.cast(ops.isnan(g), "int32"))
    largest = ops.max(ops.where(ops.isfinite(g), ops.abs(g), ops.zeros_like(g)))
    return inf, nan, ops.cast(largest, "float32")


def _unscaled(largest: float, scale: float) -> float:
    """A gradient magnitude of the scaled loss times ``f32(1 / scale)``, in float32: what
    unscaling makes of it (rounding is monotonic, so the largest stays the largest)."""
    inverse = np.float32(math.inf) if scale == 0 else np.float32(1.0 / scale)
    with np.errstate(over="ignore", invalid="ignore"):
        return float(np.float32(largest) * inverse)


class _Skip:
    """The last skipped update on the torch backend (host side): its step and scale, the
    report when it was computed then, else weak references to the gradients."""

    __slots__ = ("step", "scale", "loss", "grads", "overflows", "checked", "note")

    def __init__(self, step: int, scale: float, loss: Any):
        self.step, self.scale, self.loss = step, scale, loss
        self.grads: list[tuple[int, Any]] | None = None  # (variable index, weakref)
        self.overflows: list[tuple[int, GradientOverflow]] | None = None
        self.checked = 0
        self.note = ""


def _torch_overflows(pairs: list[tuple[int, Any]]) -> list[tuple[int, GradientOverflow]]:
    """(variable index, counts) of the torch gradients in ``pairs`` that hold inf/NaN: one
    finiteness check per gradient, then counts of the few that fail."""
    import torch

    if not pairs:
        return []
    with torch.no_grad():
        finite = torch.stack([torch.isfinite(g).all() for _, g in pairs]).tolist()
        counts = [(i, count_overflow("", g.detach().float().cpu().numpy()))
                  for (i, g), ok in zip(pairs, finite, strict=True) if not ok]
    return [(i, c) for i, c in counts if c is not None]


_NO_DIAGNOSE = ("The gradients stay inside the compiled train step on the TensorFlow and JAX "
                "Keras backends: build the scaler with diagnose=True "
                "(KerasGradScaler(..., diagnose=True)) to record which of them held inf/NaN "
                "at each skipped step.")


# ------------------------------------------------------------ the rule, as data


def _exactly(value: Any) -> Any:
    """An initializer that gives ``value`` bit for bit (Keras's ``Constant`` multiplies by
    ones, which flushes a subnormal scale to 0 on TensorFlow)."""

    def initializer(shape: Any, dtype: Any = None) -> Any:
        return ops.convert_to_tensor(np.asarray(value, dtype=dtype).reshape(shape))

    return initializer


def _rule_values(config: ScalerConfig) -> list[int]:
    """The rule's parameters as the int32 vector ``scaler_rule`` holds: f32(growth_factor)
    and f32(backoff_factor) each as the bits of its significand (in [1, 2)) and its exponent
    (split here, not in every step), growth_interval, hysteresis, the bits of min_scale (0
    for none: every scale is above), of max_scale (inf for none), dynamic."""
    c = config
    factors = []
    for factor in (c.growth_factor, c.backoff_factor):
        mantissa, exponent = math.frexp(f32(factor))  # exact, subnormals included
        factors += [f32_bits(mantissa * 2), exponent - 1]
    return [*factors, c.growth_interval, c.hysteresis,
            0 if c.min_scale is None else f32_bits(c.min_scale),
            _EXP_MASK if c.max_scale is None else f32_bits(c.max_scale), int(c.dynamic)]


# ------------------------------------------------------------ the optimizer

#: The live SpecLossScaleOptimizer of each inner optimizer, by the inner one's id (the
#: wrapper holds its inner optimizer, so the id stays its own while the entry lives).
_WRAPPERS: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()


def _wrapper_of(inner: Any) -> Any:
    """The live SpecLossScaleOptimizer around ``inner``, or None."""
    if _WRAPPERS.get(id(inner)) is not None:
        # A dropped wrapper of a built optimizer lives on in reference cycles until the
        # collector runs: it trains nothing, so it does not count.
        gc.collect()
    return _WRAPPERS.get(id(inner))


@keras.saving.register_keras_serializable(package="unifiedamp")
class SpecLossScaleOptimizer(keras.optimizers.LossScaleOptimizer):
    """``keras.optimizers.LossScaleOptimizer`` with the unifiedamp spec.

    Built by :meth:`KerasGradScaler.wrap`. Variables: ``dynamic_scale`` (the
    scale), ``step_counter`` (the growth tracker, as in Keras) and
    ``hysteresis_counter``. Works in ``model.fit`` and in custom loops on every
    Keras backend: ``apply(scaled_grads)`` (TensorFlow, torch, and JAX too) and
    ``stateless_apply`` (JAX).

    The rule's parameters are in the variable ``scaler_rule`` (see
    :meth:`set_scaler_config`), so every compiled step follows a change of the config;
    it is not state: ``model.save`` leaves it out (``get_config`` holds the config).
    Nor are the int32 counters every update writes on the device (no host read):
    ``update_count`` (the updates since the optimizer was built or loaded),
    ``skipped_count`` (those that skipped) and ``last_skipped`` (1 if the last one
    did), which ``KerasGradScaler``'s ``num_steps``, ``num_skipped_steps`` and
    ``last_step_skipped`` read.

    Diagnostics (``diagnose``, ``history``) add variables of their own, only when
    on: the history ring ``history_iteration``, ``history_scale``,
    ``history_skipped`` (``history`` slots each), and with ``diagnose`` on
    TensorFlow and JAX ``overflow_step``,
    ``overflow_scale``, ``overflow_checked``, ``overflow_counts`` (inf and NaN count
    per trainable variable) and ``overflow_max`` (largest finite magnitude per
    trainable variable), written in the skipped branch only. They are not state:
    ``model.save`` leaves them out (the file holds the variables an optimizer
    without diagnostics holds, so either kind loads it), and a loaded optimizer
    starts them afresh. ``get_config`` keeps ``diagnose`` and ``history`` when they
    are set, so ``keras.models.load_model`` rebuilds an optimizer that diagnoses
    as the saved one did.

    Args:
        inner_optimizer: The Keras optimizer to wrap.
        scaler_config: The canonical config, a dict (``ScalerConfig.to_dict()``).
        name: The optimizer's name.
        diagnose: Record, in each skipped step, which gradients held inf/NaN
            (:meth:`overflow_report`).
        history: Keep the last ``history`` updates' scale and skip flag on the
            device (:meth:`history`); 0 keeps none.
    """

    def __init__(self, inner_optimizer: Any, scaler_config: dict[str, Any] | None = None,
                 name: str | None = None, diagnose: bool = False, history: int = 0,
                 **kwargs: Any):
        history = diagnostics_options(diagnose, history)
        config = ScalerConfig(**(scaler_config or {}))
        if _wrapper_of(inner_optimizer) is not None:
            # Each wrapper would step it with its own scale and skips: one optimizer's
            # moments and iterations, two rules.
            raise RuntimeError(
                f"{type(inner_optimizer).__name__} optimizer {inner_optimizer.name!r} is "
                "wrapped already, by another scaler: one optimizer takes one scaler. Train "
                "with the optimizer that scaler's wrap() returned (KerasGradScaler.of(it) "
                "gives that scaler back), or give this scaler an optimizer of its own, e.g. "
                "type(opt).from_config(opt.get_config())")
        # Keras's own arguments, for code that reads them; the rule uses the config.
        kwargs.pop("initial_scale", None)
        kwargs.pop("dynamic_growth_steps", None)
        super().__init__(inner_optimizer, initial_scale=f32(config.init_scale),
                         dynamic_growth_steps=config.growth_interval, name=name, **kwargs)
        _WRAPPERS[id(inner_optimizer)] = self
        self._spec = config
        self._pending: ScalerState | None = None
        self._jitted_apply: Any = None
        self._diagnose = diagnose
        self._history_size = history
        # The variables model.save leaves out: the rule (the config is saved) and the
        # diagnostics.
        self._unsaved_ids: frozenset[int] = frozenset()
        # torch only (the host path): updates so far, the last loss given to
        # scale_loss, and the last skipped update.
        self._host_updates = 0
        self._last_loss: Any = None
        self._last_skip: _Skip | None = None

    @property
    def scaler_config(self) -> ScalerConfig:
        """The canonical config this optimizer follows."""
        return self._spec

    @property
    def diagnose(self) -> bool:
        """Whether skipped steps record which gradients held inf/NaN."""
        return self._diagnose

    @property
    def history_size(self) -> int:
        """How many updates the history ring keeps (0: none)."""
        return self._history_size

    # Keras's LossScaleOptimizer.build, its variables made with their start values (a
    # state loaded before the build, and the rule) as initializers: model.fit on
    # TensorFlow builds the optimizer inside the train step it traces, a trace
    # tf.function discards once it has made the variables, so an assignment after the
    # build would be lost; initializers run outside it. As Keras's own build, the
    # optimizer tracks its variables itself.
    @tracking.no_automatic_dependency_tracking
    def build(self, var_list: Any) -> None:
        if self.built:
            return
        start, self._pending = self._pending or ScalerState.initial(self._spec), None

        def add(name: str, dtype: str, value: Any) -> Any:
            return self.add_variable(shape=np.shape(value), dtype=dtype, aggregation="none",
                                     name=name, initializer=_exactly(value))

        self.step_counter = add("step_counter", "int", start.growth_tracker)
        self.dynamic_scale = add("dynamic_scale", "float32", start.scale)
        self.inner_optimizer.build(var_list)
        super(keras.optimizers.LossScaleOptimizer, self).build(var_list)
        self.hysteresis_counter = add("hysteresis_counter", "int", start.hysteresis_tracker)
        self.scaler_rule = add("scaler_rule", "int32", _rule_values(self._spec))
        # The counters behind KerasGradScaler.num_steps, num_skipped_steps and
        # last_step_skipped: not state, so model.save leaves them out, like the rule.
        self.update_count = add("update_count", "int32", 0)
        self.skipped_count = add("skipped_count", "int32", 0)
        self.last_skipped = add("last_skipped", "int32", 0)
        self._unsaved_ids = frozenset([
            id(self.scaler_rule), id(self.update_count), id(self.skipped_count),
            id(self.last_skipped), *self._build_diagnostics(len(var_list))])

    def _build_diagnostics(self, num_variables: int) -> list[int]:
        """Makes the variables ``diagnose`` and ``history`` ask for; their ids."""
        made = []

        def add(shape: tuple[int, ...], dtype: str, name: str) -> Any:
            made.append(self.add_variable(shape=shape, dtype=dtype, name=name,
                                          initializer=keras.initializers.Zeros(),
                                          aggregation="none"))
            return made[-1]

        if self._history_size:
            n = self._history_size
            self.history_iteration = add((n,), "int32", "history_iteration")
            self.history_scale = add((n,), "float32", "history_scale")
            self.history_skipped = add((n,), "int32", "history_skipped")
        if self._diagnose and keras.backend.backend() != "torch":
            self.overflow_step = add((), "int32", "overflow_step")
            self.overflow_scale = add((), "float32", "overflow_scale")
            self.overflow_checked = add((), "int32", "overflow_checked")
            self.overflow_counts = add((num_variables, 2), "int32", "overflow_counts")
            self.overflow_max = add((num_variables,), "float32", "overflow_max")
        return [id(v) for v in made]

    # ------------------------------------------------------------ state

    def read_state(self) -> ScalerState:
        """Scale and trackers as Python numbers (reads the variables)."""
        if not self.built:
            return self._pending or ScalerState.initial(self._spec)
        return ScalerState(float(ops.convert_to_numpy(self.dynamic_scale)),
                           int(ops.convert_to_numpy(self.step_counter)),
                           int(ops.convert_to_numpy(self.hysteresis_counter)))

    def write_state(self, config: ScalerConfig, state: ScalerState) -> None:
        """Sets the config and the state (on the variables once they exist)."""
        self.set_scaler_config(config)
        if self.built:
            self._assign_state(state)
        else:
            self._pending = state

    def set_scaler_config(self, config: ScalerConfig) -> None:
        """Changes the config; the state stays. Steps traced before follow at their next
        run: ``model.fit``'s, and a loop's own ``tf.function`` or ``jax.jit``.

        The rule is data, not code: its parameters are in the variable ``scaler_rule``,
        which the step reads at run time like the scale. Retracing instead would need
        every function that traced the step (``model.train_function`` of each model the
        optimizer trains, a loop's own ``tf.function`` or ``jax.jit``), which the
        optimizer cannot reach, and could not reach a ``fit`` already running; the
        variable costs a few scalar ops a step. A stateless step (``stateless_apply``
        under ``jax.jit``) reads the values it is given: pass it ``opt.variables``'
        values again after a change, as after any assignment to them.
        """
        self._spec = config
        self.initial_scale = f32(config.init_scale)
        self.dynamic_growth_steps = config.growth_interval
        if self.built:
            self.scaler_rule.assign(ops.convert_to_tensor(_rule_values(config), "int32"))

    def _assign_state(self, state: ScalerState) -> None:
        self.dynamic_scale.assign(ops.convert_to_tensor(state.scale, "float32"))
        self.step_counter.assign(ops.cast(state.growth_tracker, self.step_counter.dtype))
        self.hysteresis_counter.assign(ops.cast(state.hysteresis_tracker,
                                                self.hysteresis_counter.dtype))

    # ------------------------------------------------------------ the rule

    def _finite(self, grads: list[Any]) -> Any:
        # spec.unscale_overflows: below MIN_UNSCALABLE 1/scale is inf and every
        # unscaled gradient inf or NaN. Compared on bits: subnormals are flushed.
        unscalable = _i32(self.dynamic_scale) >= f32_bits(MIN_UNSCALABLE)
        return ops.logical_and(_all_finite([g for g in grads if g is not None]), unscalable)

    def _next(self, finite: bool) -> tuple[Any, Any, Any]:
        """(scale, growth_tracker, hysteresis_tracker) after an update with ``finite``, by
        the rule in ``scaler_rule``."""
        scale, growth, hyst = (ops.convert_to_tensor(v) for v in (
            self.dynamic_scale, self.step_counter, self.hysteresis_counter))
        grow_n, grow_e, back_n, back_e, interval, hysteresis, min_bits, max_bits, dynamic = (
            ops.unstack(ops.convert_to_tensor(self.scaler_rule)))
        zero_g, zero_h = ops.zeros_like(growth), ops.zeros_like(hyst)
        bits = _i32(scale)
        if finite:
            growth = growth + 1
            grow = growth >= ops.cast(interval, growth.dtype)
            # max_bits is inf's without a max_scale: an overflow stays inf and keeps the scale.
            grown = ops.minimum(_mul_bits(bits, _f32(grow_n), grow_e), max_bits)
            grown = ops.where(ops.equal(ops.bitwise_and(grown, _int(_EXP_MASK)), _EXP_MASK),
                              bits, grown)
            new = (ops.where(grow, grown, bits), ops.where(grow, zero_g, growth), zero_h)
        else:
            hyst = hyst + 1
            back_off = hyst >= ops.cast(hysteresis, hyst.dtype)
            backed = ops.maximum(_mul_bits(bits, _f32(back_n), back_e), min_bits)
            new = (ops.where(back_off, backed, bits), zero_g, ops.where(back_off, zero_h, hyst))
        # dynamic=False: the scale stays, the trackers are reset.
        dynamic = ops.not_equal(dynamic, 0)
        return (_f32(ops.where(dynamic, new[0], bits)), ops.where(dynamic, new[1], zero_g),
                ops.where(dynamic, new[2], zero_h))

    def _assign_next(self, finite: bool) -> None:
        self._record(not finite)
        scale, growth, hyst = self._next(finite)
        self.dynamic_scale.assign(scale)
        self.step_counter.assign(ops.cast(growth, self.step_counter.dtype))
        self.hysteresis_counter.assign(ops.cast(hyst, self.hysteresis_counter.dtype))

    def unscale_gradients(self, grads: list[Any]) -> list[Any]:
        """The gradients of the scaled loss times ``f32(1 / scale)`` (each keeps its dtype)."""
        hi, lo = _split(_reciprocal_bits(_i32(self.dynamic_scale)))
        if keras.backend.backend() != "tensorflow":  # XLA fuses both products into one pass
            return [None if g is None else _multiply(g, hi, lo) for g in grads]
        # A TF graph runs each product as its own pass over the gradients; the second
        # (lo != 1) is only needed where 1 / scale is subnormal (scale > 2**126).
        present = [g for g in grads if g is not None]
        if not present:
            return list(grads)
        unscaled = iter(ops.cond(ops.equal(lo, 1.0),
                                 lambda: [_multiply(g, hi, None) for g in present],
                                 lambda: [_multiply(g, hi, lo) for g in present]))
        return [None if g is None else next(unscaled) for g in grads]

    def get_unscaled_gradients(self, grads: list[Any]) -> list[Any]:
        """Keras 2's name for :meth:`unscale_gradients` (removed from Keras 3's class)."""
        return self.unscale_gradients(grads)

    def scale_loss(self, loss: Any) -> Any:
        """The loss times the scale, in the loss's dtype (what ``model.fit`` calls)."""
        self._note_loss(loss)
        if not self.built:
            return _multiply(loss, *_split(_int(f32_bits(self._spec.init_scale))))
        return _multiply(loss, *_split(_i32(self.dynamic_scale)))

    def get_scaled_loss(self, loss: Any) -> Any:
        """Keras 2's name for :meth:`scale_loss` (removed from Keras 3's class)."""
        return self.scale_loss(loss)

    # ------------------------------------------------------------ applying

    def check_finite(self, grads: list[Any]) -> Any:
        return self._finite(grads)

    def _stateful_handle_finite_grads(self, grads: list[Any], trainable_variables: Any) -> None:
        tvs = trainable_variables or self._trainable_variables
        unscaled = [g if g is None or self._overwrite_variable_with_gradient(v) else u
                    for g, u, v in zip(grads, self.unscale_gradients(grads), tvs, strict=True)]
        self.inner_optimizer.apply(unscaled, trainable_variables=trainable_variables)
        self._assign_next(True)

    def _stateful_handle_non_finite_grads(self, grads: list[Any] | None = None,
                                          trainable_variables: Any = None,
                                          replicas: list[list[Any]] | None = None) -> None:
        """The skipped branch: with ``diagnose``, the gradients' counts first (of ``grads``,
        or summed over the local replicas' gradient lists ``replicas``)."""
        if self._diagnose and keras.backend.backend() != "torch":
            tvs = trainable_variables or self._trainable_variables
            if replicas is None and grads is not None:
                replicas = [list(grads)]
            self._record_overflow(replicas, self._indices(tvs))
        self._assign_next(False)

    def _common_apply(self, grads: list[Any], trainable_variables: Any = None) -> None:
        if keras.backend.backend() == "torch":
            self._torch_apply(grads, trainable_variables)
            return
        if keras.backend.backend() == "jax":
            # Keras's stateful cond leaks tracers under JAX (3.15): run the stateless
            # update, jitted once (outside jit its lax.cond compiles at every call,
            # ~0.5 s a step), and write its results.
            import jax

            tvs = trainable_variables or self._trainable_variables
            if self._jitted_apply is None:
                self._jitted_apply = jax.jit(self.stateless_apply)
            new_tvs, new_ovs = self._jitted_apply(
                [v.value for v in self.variables], grads, [v.value for v in tvs])
            for var, value in zip(tvs, new_tvs, strict=True):
                var.assign(value)
            for var, value in zip(self.variables, new_ovs, strict=True):
                var.assign(value)
            return
        # Keras's own, with the gradients given to the skipped branch too.
        ops.cond(self.check_finite(grads),
                 lambda: self._stateful_handle_finite_grads(grads, trainable_variables),
                 lambda: self._stateful_handle_non_finite_grads(grads, trainable_variables))

    def _torch_apply(self, grads: list[Any], trainable_variables: Any = None) -> None:
        """The torch backend's apply: torch's own fused check-and-unscale kernel (what
        ``torch.amp.GradScaler`` runs, the gradients unscaled in place) and the rule on the
        host. Keras's cond is a host ``if`` on torch anyway; a few hundred eager scalar
        ops per step (the bit-pattern path) would cost more than the step's own update
        (measured 8 ms on a 5M-parameter MLP). torch keeps subnormals, so the kernel's
        float32 arithmetic is the spec's at every scale."""
        import torch

        tvs = trainable_variables or self._trainable_variables
        scale = self.dynamic_scale.value
        todo = [g for g, v in zip(grads, tvs, strict=True)
                if g is not None and not self._overwrite_variable_with_gradient(v)]
        found = torch.zeros((), dtype=torch.float32, device=scale.device)
        if todo:
            inv = scale.double().reciprocal().float()
            torch._amp_foreach_non_finite_check_and_unscale_(todo, found, inv)
        state = ScalerState(float(scale), int(self.step_counter.value),
                            int(self.hysteresis_counter.value))
        found_inf = bool(found) or spec.unscale_overflows(state.scale)
        self._host_updates += 1
        if found_inf:
            self._torch_skip(grads, tvs, state.scale)
        else:
            self._last_skip = None
            self.inner_optimizer.apply(grads, trainable_variables=trainable_variables)
        self._record(found_inf)
        new = spec.update(self._spec, state, found_inf)
        if new != state:
            self._assign_state(new)

    def _tf_apply(self, grads: list[Any], trainable_variables: Any = None) -> None:
        """TensorFlow's apply, where every replica's check counts: found_inf is the OR over
        the replicas of a ``tf.distribute`` strategy (Keras 3.15 takes the first replica's
        flag, so an inf on another replica is applied). Every replica then takes the same
        branch; no value leaves the graph."""
        import tensorflow as tf

        if tf.distribute.in_cross_replica_context():
            raise ValueError("apply() must be called in a replica context.")

        def non_finite(grads: list[Any]) -> Any:
            # 1.0 where this replica's check fails: a SUM over replicas is 0 when all pass
            # (ReduceOp has no MIN; float32 counts replicas exactly).
            return ops.cast(ops.logical_not(self._finite(grads)), "float32")

        def apply_fn() -> None:
            self._stateful_handle_finite_grads(grads, trainable_variables)

        if tf.__internal__.distribute.strategy_supports_no_merge_call():
            # No strategy, or replicas that each run the update (XLA on GPUs only).
            context = tf.distribute.get_replica_context()
            if context.num_replicas_in_sync == 1:
                self._common_apply(grads, trainable_variables=trainable_variables)
                return
            total = context.all_reduce(tf.distribute.ReduceOp.SUM, non_finite(grads))
            # Each replica holds its own gradients: diagnose records the step and scale
            # but no per-gradient counts here (overflow_checked -1; see overflow_report).
            ops.cond(ops.equal(total, 0.0), apply_fn, self._stateful_handle_non_finite_grads)
            return

        def cross_replica(distribution: Any, grads: Any, trainable_variables: Any) -> None:
            per_replica = distribution.extended.call_for_each_replica(non_finite, args=(grads,))
            # Across every replica (and worker): not only experimental_local_results(...)[0].
            total = distribution.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

            def apply_each() -> None:
                distribution.extended.call_for_each_replica(
                    self._stateful_handle_finite_grads, args=(grads, trainable_variables))

            def skip() -> None:
                # diagnose: the counts summed over this worker's replicas' gradients.
                local = [None if g is None else distribution.experimental_local_results(g)
                         for g in grads]
                n = max((len(r) for r in local if r is not None), default=1)
                replicas = [[None if r is None else r[k] for r in local] for k in range(n)]
                self._stateful_handle_non_finite_grads(
                    trainable_variables=trainable_variables, replicas=replicas)

            # In the cross-replica context, as Keras: the inner optimizer's apply merges.
            ops.cond(ops.equal(total, 0.0), apply_each, skip)

        tf.distribute.get_replica_context().merge_call(
            cross_replica, args=(grads, trainable_variables))

    def stateless_apply(self, optimizer_variables: Any, grads: Any,
                        trainable_variables: Any) -> Any:
        if not self.built:
            raise ValueError(f"To call `stateless_apply`, {type(self).__name__} must be built: "
                             "call optimizer.build(trainable_variables) first")
        # The scale is read from optimizer_variables: under JAX's jitted fit the
        # variables themselves hold no value (Keras 3.15).
        mapping = list(zip(self.variables, optimizer_variables, strict=True))
        with keras.StatelessScope(state_mapping=mapping):
            finite = self._finite(grads)
        if not self._diagnose and all(len(v.shape) == 0 for v in self.inner_optimizer.variables):
            # An inner optimizer without per-variable state (plain SGD: iterations and
            # learning rate): both outcomes computed and selected, which XLA fuses into
            # the update's own pass. A cond's branches write fresh buffers, which glibc's
            # default allocator maps and unmaps at every step: 1.58x a plain
            # mixed_float16 step on XLA's CPU against 1.13x for the select (1.01x against
            # 1.11x where freed memory stays in the process). With moments (Adam) the
            # select would copy them, so the cond stays there. diagnose takes the cond
            # too: its counts are computed in the skipped branch only.
            new_tvs, new_ovs = self._stateless_handle_finite_grads(
                optimizer_variables, grads, trainable_variables)
            old_tvs, old_ovs = self._stateless_handle_non_finite_grads(
                optimizer_variables, trainable_variables)
            pick = partial(_select, finite)
            return (list(map(pick, new_tvs, old_tvs)), list(map(pick, new_ovs, old_ovs)))
        return ops.cond(
            finite,
            lambda: self._stateless_handle_finite_grads(optimizer_variables, grads,
                                                        trainable_variables),
            lambda: self._stateless_handle_non_finite_grads(optimizer_variables,
                                                            trainable_variables, grads))

    def _stateless_handle_finite_grads(self, optimizer_variables: Any, grads: Any,
                                       trainable_variables: Any) -> Any:
        mapping = list(zip(self.variables, optimizer_variables, strict=True))
        with keras.StatelessScope(state_mapping=mapping) as scope:
            unscaled = [g if g is None or self._overwrite_variable_with_gradient(v) else u
                        for g, u, v in zip(grads, self.unscale_gradients(grads),
                                           self._trainable_variables, strict=True)]
            new_tvs, new_inner = self.inner_optimizer.stateless_apply(
                self.inner_optimizer.variables, unscaled, trainable_variables)
            self._assign_next(True)
            own = [scope.get_current_value(v) for v in self._variables]
        return new_tvs, own + list(new_inner)

    def _stateless_handle_non_finite_grads(self, optimizer_variables: Any,
                                           trainable_variables: Any, grads: Any = None) -> Any:
        mapping = list(zip(self.variables, optimizer_variables, strict=True))
        with keras.StatelessScope(state_mapping=mapping) as scope:
            if self._diagnose and grads is not None:
                # The gradients are in the order of the optimizer's variables.
                self._record_overflow([list(grads)], list(range(len(grads))))
            self._assign_next(False)
            new = [scope.get_current_value(v) for v in self.variables]
        return trainable_variables, new

    # ------------------------------------------------------------ diagnostics

    def _indices(self, variables: Any) -> list[int]:
        """Each variable's position among the optimizer's trainable variables."""
        out = []
        for i, v in enumerate(variables):
            try:
                out.append(self._get_variable_index(v))
            except (KeyError, AttributeError, TypeError):
                out.append(i)
        return out

    def _record(self, skipped: Any) -> None:
        """Counts one update in ``update_count``, ``skipped_count`` and ``last_skipped``, and
        writes its history record (device ops, no host read): iteration = updates so far,
        the scale it used (before the update), skipped. ``skipped`` is a Python bool in
        each branch of the compiled step (and on torch's host path), else a tensor."""
        count = ops.convert_to_tensor(self.update_count)
        flag = _int(int(skipped)) if isinstance(skipped, bool) else ops.cast(skipped, "int32")
        if self._history_size:
            hot = ops.equal(ops.arange(self._history_size, dtype="int32"),
                            ops.mod(count, self._history_size))
            value = ops.convert_to_tensor
            self.history_iteration.assign(ops.where(hot, count + 1,
                                                    value(self.history_iteration)))
            self.history_scale.assign(ops.where(hot, value(self.dynamic_scale),
                                                value(self.history_scale)))
            self.history_skipped.assign(ops.where(hot, flag, value(self.history_skipped)))
        self.update_count.assign(count + 1)
        self.last_skipped.assign(flag)
        if skipped is not False:  # a finite branch leaves the count as it is
            self.skipped_count.assign(ops.convert_to_tensor(self.skipped_count) + flag)

    def _record_overflow(self, replicas: list[list[Any]] | None, indices: list[int]) -> None:
        """The skipped branch's record (TensorFlow, JAX): the step and the scale, and for
        each trainable variable its gradient's inf count, NaN count and largest finite
        magnitude (summed, and the largest, over ``replicas``, lists of gradients in the
        order of ``indices``). ``replicas=None``: no counts (``overflow_checked`` -1)."""
        count = ops.convert_to_tensor(self.update_count)
        self.overflow_step.assign(count + 1)
        self.overflow_scale.assign(ops.convert_to_tensor(self.dynamic_scale))
        if replicas is None:
            self.overflow_checked.assign(_int(-1))
            return
        k = len(self._trainable_variables)
        inf, nan = [_int(0)] * k, [_int(0)] * k
        largest = [ops.convert_to_tensor(0.0, "float32")] * k
        checked = set()
        for grads in replicas:
            for i, g in zip(indices, grads, strict=True):
                if g is None:
                    continue
                checked.add(i)
                n_inf, n_nan, big = _gradient_stats(g)
                inf[i], nan[i] = inf[i] + n_inf, nan[i] + n_nan
                largest[i] = ops.maximum(largest[i], big)
        self.overflow_checked.assign(_int(len(checked)))
        if k:
            self.overflow_counts.assign(ops.stack([ops.stack(inf), ops.stack(nan)], axis=1))
            self.overflow_max.assign(ops.stack(largest))

    def _note_loss(self, loss: Any) -> None:
        # torch: the loss given to scale_loss (one tensor; else unknown), for the report's
        # loss_finite (no host read).
        if keras.backend.backend() == "torch":
            self._last_loss = loss.detach() if hasattr(loss, "detach") else None

    def _torch_skip(self, grads: list[Any], tvs: Any, scale: float) -> None:
        """A skipped update on torch: with ``diagnose`` its report's counts now (the
        gradients are unscaled in place by then), else weak references to the gradients."""
        record = _Skip(self._host_updates, scale, self._last_loss)
        pairs = [(i, g) for i, g in zip(self._indices(tvs), grads, strict=True)
                 if g is not None]
        if self._diagnose:
            record.overflows, record.checked = _torch_overflows(pairs), len(pairs)
        else:
            record.grads = [(i, weakref.ref(g)) for i, g in pairs]
        self._last_skip = record

    def _variable_name(self, index: int, names: dict[int, tuple[str, Any]] | None) -> str:
        var = self._trainable_variables[index]
        for key in (id(var), id(getattr(var, "value", None))):
            name, obj = (names or {}).get(key, (None, None))
            if name is not None and (obj is var or obj is getattr(var, "value", None)):
                return name
        return var.path

    def overflow_report(self, names: dict[int, tuple[str, Any]] | None = None
                        ) -> OverflowReport | None:
        """Which gradients held inf/NaN at the last update, if it skipped; else None.

        Each gradient is named by its variable's ``.path`` (``names``, from
        :meth:`KerasGradScaler.watch`, renames). ``step`` counts this optimizer's
        updates since it was built (or loaded); ``max_finite`` is of the unscaled
        gradient (the scaled one's largest finite magnitude times ``f32(1 / scale)``).

        - TensorFlow and JAX: with ``diagnose=True``, from the record the skipped branch
          of the compiled step wrote; ``loss_finite`` is None (the loss stays in the
          step). With ``diagnose=False`` and ``history=N``, the last update's step and
          scale from the history, no gradient listed, and a note to use diagnose=True.
          With neither, nothing is recorded: RuntimeError.
        - torch: with ``diagnose=True`` computed during the skipped ``apply`` (from the
          gradients, unscaled in place by then); without, computed on the first call
          from the gradients as they are now (``model.fit`` keeps them until the next
          step; once freed the report lists none and says so). ``loss_finite``: whether
          the last loss given to ``scale_loss`` was finite.
        - Under ``tf.distribute``, the counts are summed over the worker's replicas
          (replicas that each run the update, XLA on GPUs, record no counts: a note says so).

        Raises:
            RuntimeError: TensorFlow or JAX, built with neither ``diagnose`` nor ``history``.
        """
        torch_backend = keras.backend.backend() == "torch"
        if not (torch_backend or self._diagnose or self._history_size):
            raise RuntimeError(
                f"overflow_report() records nothing on the {keras.backend.backend()} Keras "
                "backend unless asked: the skip is decided inside the compiled train step. "
                "Build the scaler with diagnose=True (which gradients held inf/NaN) or "
                "history=N (which updates skipped): KerasGradScaler(..., diagnose=True)")
        if not self.built:
            return None
        if torch_backend:
            return self._torch_report(names)

        def read(v: Any) -> Any:
            return ops.convert_to_numpy(v)

        count = int(read(self.update_count))
        if not self._diagnose:
            slot = (count - 1) % self._history_size
            if not count or not int(read(self.history_skipped)[slot]):
                return None
            return OverflowReport(int(read(self.history_iteration)[slot]),
                                  float(read(self.history_scale)[slot]), [], 0, None,
                                  note=_NO_DIAGNOSE)
        step = int(read(self.overflow_step))
        if not count or step != count:
            return None
        scale = float(read(self.overflow_scale))
        checked = int(read(self.overflow_checked))
        if checked < 0:
            return OverflowReport(step, scale, [], 0, None, note=(
                "Per-gradient counts are not recorded under a tf.distribute strategy whose "
                "replicas each run the update (XLA on GPUs): each replica holds only its "
                "own gradients."))
        counts, largest = read(self.overflow_counts), read(self.overflow_max)
        overflows = [GradientOverflow(self._variable_name(i, names),
                                      tuple(self._trainable_variables[i].shape),
                                      int(counts[i, 0]), int(counts[i, 1]),
                                      _unscaled(largest[i], scale))
                     for i in range(len(counts)) if counts[i].any()]
        return OverflowReport(step, scale, overflows, checked, None)

    def _torch_report(self, names: dict[int, tuple[str, Any]] | None) -> OverflowReport | None:
        import torch

        skip = self._last_skip
        if skip is None:
            return None
        if skip.overflows is None:  # diagnose=False: the gradients as they are now, once
            alive = [(i, ref()) for i, ref in skip.grads or []]
            pairs = [(i, g) for i, g in alive if g is not None]
            skip.overflows, skip.checked = _torch_overflows(pairs), len(pairs)
            if len(pairs) < len(alive):
                skip.note = (f"{len(alive) - len(pairs)} of the {len(alive)} gradients of "
                             f"step {skip.step} were freed before overflow_report() was "
                             "called: build the scaler with diagnose=True to keep the report "
                             "of each skipped step.")
            skip.grads = None
        loss_finite = None if skip.loss is None else bool(torch.isfinite(skip.loss).all())
        overflows = [GradientOverflow(self._variable_name(i, names), o.shape, o.inf, o.nan,
                                      o.max_finite) for i, o in skip.overflows]
        return OverflowReport(skip.step, skip.scale, overflows, skip.checked, loss_finite,
                              skip.note)

    def history(self) -> ScaleHistory:
        """The last ``history`` updates (oldest first): iteration (this optimizer's updates
        since it was built or loaded, from 1), the scale it used (before the update
        changed it), and whether it skipped. Read from the ring variables, which the
        apply step writes with device ops (no host read per step).

        Raises:
            ValueError: Built with ``history=0`` (the default).
        """
        if not self._history_size:
            raise ValueError("this optimizer keeps no history: build the scaler with history=N "
                             "(e.g. KerasGradScaler(..., history=1000)) to keep the last N "
                             "updates")
        if not self.built:
            return ScaleHistory([], [], [])
        iterations, scales, skipped = (ops.convert_to_numpy(v).tolist() for v in (
            self.history_iteration, self.history_scale, self.history_skipped))
        return ScaleHistory.from_ring(iterations, scales, skipped,
                                      int(ops.convert_to_numpy(self.update_count)))

    # ------------------------------------------------------------ serialisation

    def _saved_variables(self) -> list[Any]:
        return [v for v in self.variables if id(v) not in self._unsaved_ids]

    def save_own_variables(self, store: Any) -> None:
        """As Keras's, without the rule's and the diagnostics' variables."""
        for i, variable in enumerate(self._saved_variables()):
            store[str(i)] = variable.numpy()

    def load_own_variables(self, store: Any) -> None:
        """As Keras's, into the variables :meth:`save_own_variables` writes: a file saved
        with or without diagnostics loads into an optimizer with or without them."""
        variables = self._saved_variables()
        if len(store.keys()) != len(variables):
            # What Keras's own does: a warning, and nothing loaded.
            warnings.warn(f"Skipping variable loading for optimizer '{self.name}', because it "
                          f"has {len(variables)} variables whereas the saved optimizer has "
                          f"{len(store.keys())} variables. ", stacklevel=2)
            return
        for i, variable in enumerate(variables):
            variable.assign(store[str(i)])

    def get_config(self) -> dict[str, Any]:
        """Keras's config and ``scaler_config``; ``diagnose`` and ``history`` when set (so a
        loaded model diagnoses as the saved one did; its records start afresh)."""
        config = super().get_config()
        config["scaler_config"] = self._spec.to_dict()
        if self._diagnose:
            config["diagnose"] = True
        if self._history_size:
            config["history"] = self._history_size
        return config


# ------------------------------------------------------------ the scaler


class KerasGradScaler(HostCounters, GradScaler):
    """A dynamic loss scaler for Keras 3 on any Keras backend; ``wrap(optimizer)`` applies it.

    The scaler and the optimizer it wraps are two objects: ``wrap`` returns the Keras
    optimizer (a :class:`SpecLossScaleOptimizer`), and the scaler reads and writes that
    optimizer's variables (``get_scale``, ``state``, ``state_dict``, ``load_state_dict``,
    the setters, ``num_steps``...). The optimizer's ``apply()`` (and ``model.fit``)
    checks, steps or skips, and updates the scale, inside the compiled step.

    Without ``wrap``, an eager custom loop drives the scaler itself with the protocol
    every backend shares: ``scaled = scaler.scale(loss)``, the gradients of ``scaled``,
    ``grads, finite = scaler.unscale(grads)``, the step where ``finite``, then
    ``scaler = scaler.update(finite)``, which reads the flag (a host read) and applies
    the spec's rule to the scale the scaler holds.

    Args:
        *args: ``init_scale, growth_factor, backoff_factor, growth_interval, enabled``.
        diagnose: The wrapped optimizer records, in each skipped step, which gradients
            held inf/NaN (:meth:`overflow_report`); on TensorFlow and JAX only in the
            compiled step's skipped branch, so a step that does not skip costs nothing more.
        history: The wrapped optimizer keeps the last ``history`` updates' scale and skip
            flag in device variables (:meth:`history`); 0 keeps none.
        **kwargs: The other config parameters, by canonical name or alias (Keras's
            ``initial_scale``, ``dynamic_growth_steps``).

    Example:
        >>> import keras, numpy as np
        >>> import unifiedamp as ua
        >>> scaler = ua.GradScaler(1024.0, growth_interval=2, backend="keras")
        >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        >>> model.compile(optimizer=scaler.wrap(keras.optimizers.SGD(0.1)), loss="mse")
        >>> _ = model.fit(np.ones((4, 3)), np.ones((4, 1)), epochs=2, verbose=0)
        >>> scaler.get_scale(), scaler.state.growth_tracker
        (2048.0, 0)
        >>> scaler.num_steps, scaler.num_skipped_steps, scaler.last_step_skipped
        (2, 0, False)

        Without ``wrap``, the protocol every backend shares (eager):

        >>> scaler = ua.GradScaler(1024.0, backend="keras")
        >>> grads, finite = scaler.unscale([np.array([2048.0, np.inf], np.float32)])
        >>> scaler.update(finite).get_scale(), scaler.last_step_skipped
        (512.0, True)
    """

    backend = "keras"
    capabilities = frozenset({"wrap", "watch", "overflow_report", "history"})

    def __init__(self, *args: Any, diagnose: bool = False, history: int = 0, **kwargs: Any):
        self._history_size = diagnostics_options(diagnose, history)
        self._diagnose = diagnose
        self._config = spec.config_from_args(args, kwargs,
                                             extra_names=("backend", "diagnose", "history"))
        self._state = ScalerState.initial(self._config)
        self._optimizer: SpecLossScaleOptimizer | None = None
        self._names: dict[int, tuple[str, Any]] = {}
        # The history of the updates update(finite) makes (a loop without wrap); they are
        # counted by HostCounters' _count.
        self._ring: list[tuple[int, float, bool]] = []

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.state}, {self.config})"

    def wrap(self, optimizer: Any) -> Any:
        """The Keras optimizer that applies this scaler around ``optimizer``.

        A :class:`SpecLossScaleOptimizer` (a ``keras.optimizers.LossScaleOptimizer``, so
        ``model.compile`` keeps it as it is); with ``enabled=False``, ``optimizer`` itself.
        A scaler wraps one optimizer, and an optimizer takes one scaler: wrapping it
        again (by this scaler or another) raises, naming the optimizer to use instead.
        """
        if not isinstance(optimizer, keras.optimizers.Optimizer):
            raise TypeError(f"wrap() takes a keras.optimizers.Optimizer, got "
                            f"{type(optimizer).__name__}")
        if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
            raise TypeError("the optimizer is a LossScaleOptimizer already: wrap its "
                            "inner_optimizer")
        if self._optimizer is not None:
            if optimizer is self._optimizer.inner_optimizer:
                raise RuntimeError("this scaler wraps this optimizer already: train with the "
                                   "optimizer the first wrap() returned (scaler.optimizer)")
            raise RuntimeError("this scaler wraps an optimizer already: make one scaler per "
                               "optimizer (each holds its own scale)")
        if not self._config.enabled:
            return optimizer
        wrapped = SpecLossScaleOptimizer(optimizer, scaler_config=self._config.to_dict(),
                                         diagnose=self._diagnose, history=self._history_size)
        wrapped.write_state(self._config, self._state)
        self._optimizer = wrapped
        return wrapped

    @classmethod
    def of(cls, optimizer: SpecLossScaleOptimizer) -> KerasGradScaler:
        """The scaler of an optimizer built by ``wrap`` (e.g. after ``keras.models.load_model``).

        Example:
            >>> import keras
            >>> opt = KerasGradScaler(8.0).wrap(keras.optimizers.SGD())
            >>> KerasGradScaler.of(opt).get_scale()
            8.0
        """
        if not isinstance(optimizer, SpecLossScaleOptimizer):
            raise TypeError(f"KerasGradScaler.of takes an optimizer made by "
                            f"KerasGradScaler.wrap, got {type(optimizer).__name__}")
        scaler = cls(**optimizer.scaler_config.to_dict(), diagnose=optimizer.diagnose,
                     history=optimizer.history_size)
        scaler._optimizer = optimizer
        return scaler

    @property
    def optimizer(self) -> SpecLossScaleOptimizer | None:
        """The optimizer ``wrap`` returned (None before, and when disabled)."""
        return self._optimizer

    # ------------------------------------------------------------ config and state

    @property
    def config(self) -> ScalerConfig:
        return self._optimizer.scaler_config if self._optimizer is not None else self._config

    @property
    def state(self) -> ScalerState:
        return self._optimizer.read_state() if self._optimizer is not None else self._state

    def is_enabled(self) -> bool:
        return self._config.enabled

    def get_scale(self) -> float:
        """The current scale (reads the optimizer's variable); 1.0 when disabled."""
        return self.state.scale if self._config.enabled else 1.0

    def _reconfigure(self, config: ScalerConfig) -> KerasGradScaler:
        """Sets the config (in the wrapped optimizer's ``scaler_rule`` too); returns self.

        What the setters (``set_growth_factor``...) call. Steps compiled before follow
        from their next run (``fit``'s, a loop's ``tf.function`` or ``jax.jit``: see
        :meth:`SpecLossScaleOptimizer.set_scaler_config`); so does
        :meth:`load_state_dict`.

        Example:
            >>> import keras, numpy as np
            >>> scaler = KerasGradScaler(8.0, growth_interval=1)
            >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
            >>> model.compile(optimizer=scaler.wrap(keras.optimizers.SGD()), loss="mse")
            >>> x, y = np.ones((1, 2)), np.ones((1, 1))
            >>> _ = model.train_on_batch(x, y)
            >>> scaler.set_growth_factor(4.0) is scaler
            True
            >>> _ = model.train_on_batch(x, y)
            >>> scaler.get_scale()
            64.0
        """
        if self._optimizer is not None:
            self._optimizer.set_scaler_config(config)
        self._config = config
        return self

    # ------------------------------------------------------------ the counters

    def _counter(self, name: str) -> int:
        # The wrapped optimizer's int32 variable (a host read); 0 before it is built.
        opt = self._optimizer
        if opt is None or not opt.built:
            return 0
        return int(ops.convert_to_numpy(getattr(opt, name)))

    @property
    def num_steps(self) -> int:
        """Updates made since the scaler was made: the wrapped optimizer's (counted on the
        device in each ``apply``, read here; they restart at 0 in a loaded optimizer) and
        those ``update(finite)`` made before a wrap. A disabled scaler makes none, nor
        does ``update(new_scale=...)``."""
        return self._updates + self._counter("update_count")

    @property
    def num_skipped_steps(self) -> int:
        """Of :attr:`num_steps`, the updates whose gradients were not all finite."""
        return self._skipped + self._counter("skipped_count")

    @property
    def last_step_skipped(self) -> bool:
        """Whether the last update's gradients were not all finite (its step skipped);
        False before the first."""
        if self._counter("update_count"):
            return bool(self._counter("last_skipped"))
        return self._last_skipped

    def state_dict(self) -> dict[str, Any]:
        """The canonical dict, from the wrapped optimizer's variables."""
        return spec.to_state_dict(self.config, self.state, self.backend)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Loads a canonical dict of any backend (or a native torch/Paddle dict) into the
        wrapped optimizer's variables; validated before anything is written."""
        config, state = spec.parse_state_dict(state_dict, base=self.config)
        config = config.replace(enabled=self._config.enabled)
        self._write(config, state)

    def _write(self, config: ScalerConfig, state: ScalerState) -> None:
        if self._optimizer is not None:
            self._optimizer.write_state(config, state)
        self._config, self._state = config, state

    # ------------------------------------------------------------ the verbs

    def _scale_bits(self) -> Any:
        # The optimizer's variable once it exists (no host read), else the held state.
        if self._optimizer is not None and self._optimizer.built:
            return _i32(self._optimizer.dynamic_scale)
        return _int(f32_bits(self.state.scale))

    def scale(self, outputs: Any) -> Any:
        """Multiplies a tensor (or a list/tuple/dict of them) by the scale, dtypes kept."""
        if not self._config.enabled:
            return outputs
        if self._optimizer is not None:
            self._optimizer._note_loss(outputs)  # torch: for the report's loss_finite
        bits = self._scale_bits()
        return tree_map(lambda x: _multiply(ops.convert_to_tensor(x), *_split(bits)), outputs)

    def unscale(self, grads: Any) -> tuple[Any, Any]:
        """``(grads times f32(1 / scale), all finite)``; the check decides nothing by itself:
        the wrapped optimizer's ``apply`` checks and updates."""
        if not self._config.enabled:
            return grads, ops.convert_to_tensor(True)
        bits = self._scale_bits()
        tensors = tree_map(ops.convert_to_tensor, grads)
        finite = ops.logical_and(_all_finite(leaves(tensors)), bits >= f32_bits(MIN_UNSCALABLE))
        hi, lo = _split(_reciprocal_bits(bits))
        return tree_map(lambda g: _multiply(g, hi, lo), tensors), finite

    def where_finite(self, finite: Any, new: Any, old: Any) -> Any:
        """``new`` where ``finite``, else ``old``, leaf by leaf with ``keras.ops.where`` (no
        host read, so it runs inside a compiled step too): two trees of the same structure,
        e.g. the variables' values after and before a step. Each result has ``old``'s
        dtype; ``None`` leaves stay None.

        Example:
            >>> import numpy as np
            >>> from keras import ops
            >>> s = KerasGradScaler()
            >>> new = [np.float32(1.0), np.ones(2, np.float32)]
            >>> old = [np.float32(0.0), np.zeros(2, np.float32)]
            >>> out = s.where_finite(ops.convert_to_tensor(False), new, old)
            >>> [ops.convert_to_numpy(x).tolist() for x in out]
            [0.0, [0.0, 0.0]]
            >>> ops.convert_to_numpy(s.where_finite(True, new, old)[1]).tolist()
            [1.0, 1.0]
        """
        if not is_flag(finite) or tuple(getattr(finite, "shape", ())) != ():
            raise TypeError(f"where_finite(finite, new, old) takes the one flag unscale() "
                            f"returns (a bool or a 0-d bool tensor), got {finite!r:.80}")

        def select(n: Any, o: Any) -> Any:
            if n is None and o is None:
                return None
            return _select(finite, ops.convert_to_tensor(n), o)

        return tree_map(select, new, old)

    def update(self, finite: Any = None, *, new_scale: Any = None) -> KerasGradScaler:
        """The protocol's update, for a loop that does not ``wrap`` an optimizer: applies the
        spec's rule to the scale this scaler holds, from ``finite`` (the flag
        :meth:`unscale` returned: a bool or a 0-d bool tensor, read on the host), counts the
        update and returns the scaler itself.

        ``new_scale`` (a number or a one-element tensor; a number as the first argument, as
        in torch) sets the scale instead, the trackers kept, not counted as an update; also
        with a wrapped optimizer (its variable is written).

        Raises:
            RuntimeError: The scaler wraps an optimizer: its ``apply()`` (and
                ``model.fit``) updates the scale at each step already.
            NoInfChecksError: No flag: the Keras backend records no checks.
            TypeError: A flag inside a compiled function (``tf.function``, ``jax.jit``),
                which the host cannot read: compile the step with ``wrap()`` instead.

        Example:
            >>> import numpy as np
            >>> s = KerasGradScaler(8.0)
            >>> s.update(np.bool_(False)) is s, s.get_scale(), s.update(2.0).get_scale()
            (True, 4.0, 2.0)
        """
        finite, new_scale = update_arguments(finite, new_scale)
        if not self._config.enabled:
            return self
        if new_scale is not None:
            if ops.is_tensor(new_scale):
                new_scale = ops.convert_to_numpy(new_scale)
            state = self.state._replace(scale=new_scale_value(new_scale))
            self._write(self.config, state)
            return self
        if self._optimizer is not None:
            raise RuntimeError(
                "update() was called on a scaler that wraps an optimizer: the wrapped "
                "optimizer's apply() (and model.fit) checks the gradients and updates the "
                "scale at every step, so update() would apply the rule a second time. Drop "
                "the update() call (scaler.last_step_skipped and num_skipped_steps tell what "
                "apply() decided), or drive a scaler that wraps nothing: scale(loss), "
                "unscale(grads), update(finite)")
        if finite is None:
            raise NoInfChecksError(
                "No inf checks were recorded prior to update(): the keras backend records "
                "none. Pass the flag unscale() returned: grads, finite = scaler.unscale(grads); "
                "scaler.update(finite) (or let a wrapped optimizer's apply() update)")
        found_inf = not _host_flag(finite)
        scale = self._state.scale
        self._state = spec.update(self._config, self._state, found_inf)
        self._count(found_inf)
        if self._history_size:
            self._ring.append((self._updates, scale, found_inf))
            del self._ring[:-self._history_size]
        return self

    # ------------------------------------------------------------ diagnostics

    def watch(self, model: Any) -> None:
        """Names the variables in :meth:`overflow_report`.

        Without it each gradient is named by its variable's ``.path``
        (``"sequential/dense/kernel"``), the name the model gives it, so ``watch`` is
        optional here. ``model`` may be a Keras model or layer (its variables keep their
        paths: nothing changes), a dict ``name -> variable``, an iterable of
        ``(name, variable)`` pairs, or an object with ``named_parameters()`` (on the torch
        Keras backend, the torch parameters a Keras variable holds match too). Matched
        by identity; calls add up (a later name wins); every pair is checked first.

        Example:
            >>> import keras
            >>> scaler = KerasGradScaler(8.0, diagnose=True)
            >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
            >>> scaler.watch({"w": model.layers[0].kernel})
            >>> scaler.watch(model)  # the paths: changes nothing
        """
        if isinstance(model, keras.layers.Layer):
            pairs = [(v.path, v) for v in model.variables]
        else:
            pairs = watched_pairs(model, lambda v: True, "variable")
        for name, variable in pairs:
            self._names[id(variable)] = (name, variable)

    def overflow_report(self) -> OverflowReport | None:
        """After a skipped update, which gradients held inf/NaN; None when the last update
        skipped nothing, before the first, and when the scaler is disabled.

        Read from the wrapped optimizer (see
        :meth:`SpecLossScaleOptimizer.overflow_report` for what each Keras backend
        records); names from :meth:`watch`, else each variable's ``.path``.

        Raises:
            RuntimeError: TensorFlow or JAX, with neither ``diagnose`` nor ``history``.

        Example:
            >>> import keras, numpy as np
            >>> scaler = KerasGradScaler(1024.0, diagnose=True)
            >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, name="fc")],
            ...                          name="net")
            >>> model.compile(optimizer=scaler.wrap(keras.optimizers.SGD()), loss="mse")
            >>> _ = model.train_on_batch(np.array([[1.0, np.inf]]), np.ones((1, 1)))
            >>> report = scaler.overflow_report()
            >>> report.step, report.scale, report.names
            (1, 1024.0, ['net/fc/kernel', 'net/fc/bias'])
            >>> _ = model.train_on_batch(np.ones((1, 2)), np.ones((1, 1)))
            >>> scaler.overflow_report() is None
            True
        """
        if self._optimizer is None:
            return None
        return self._optimizer.overflow_report(self._names)

    def history(self) -> ScaleHistory:
        """The last ``history`` updates (oldest first), a
        :class:`unifiedamp.diagnostics.ScaleHistory`: iteration (the wrapped optimizer's
        updates since it was built, from 1), the scale that update used, whether it
        skipped. Empty before the optimizer is built (and when disabled).

        Raises:
            ValueError: Built with ``history=0`` (the default).

        Example:
            >>> import keras, numpy as np
            >>> scaler = KerasGradScaler(8.0, growth_interval=1, history=2)
            >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
            >>> model.compile(optimizer=scaler.wrap(keras.optimizers.SGD()), loss="mse")
            >>> for x in ([[1.0, 1.0]], [[np.inf, 1.0]], [[1.0, 1.0]]):
            ...     _ = model.train_on_batch(np.array(x), np.ones((1, 1)))
            >>> scaler.history().as_list()
            [(2, 16.0, True), (3, 8.0, False)]
        """
        if not self._history_size:
            raise ValueError("this scaler keeps no history: build it with history=N (e.g. "
                             "KerasGradScaler(..., history=1000)) to keep the last N updates")
        if self._optimizer is None:
            return ScaleHistory([r[0] for r in self._ring], [r[1] for r in self._ring],
                                [r[2] for r in self._ring])
        return self._optimizer.history()

    @classmethod
    def devices(cls) -> list[str]:
        """Keras's backend and its devices."""
        return [f"{keras.backend.backend()}"]
