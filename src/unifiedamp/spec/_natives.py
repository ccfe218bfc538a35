"""One table per native loss scaler: its call, defaults per version, what it carries, its state.

Data and pure Python only (no framework is imported). Backends and porting read these
tables; adding a native scaler is one entry of :data:`NATIVE_SCALERS` (and, if its
checkpoints hold a state of a new shape, one entry of :data:`STATE_FORMS` with its
branch in :mod:`unifiedamp.spec._state_dict`, which reads and writes each form).

Each entry of :data:`NATIVE_SCALERS`, keyed by the class's qualified name:

- ``framework``, ``backend`` (unifiedamp's backend for it), ``package`` (the
  distribution whose version selects the defaults), ``aliases`` (other spellings
  of the class, and the short names porting takes);
- ``params`` (in positional order), ``keyword_only``, ``names`` (native parameter ->
  canonical one; a parameter not there has no canonical meaning, ``ignored`` says why);
  ``derived`` (a parameter whose value sets several canonical ones: TensorFlow 2.1-2.3's
  ``loss_scale``, ``"dynamic"`` or a number);
- ``versions``: major version -> ``releases`` (the releases with these names and
  defaults), ``defaults`` by native name and ``fixed`` (the canonical values the class
  hard-codes), and anything else that changed in that version (``carries`` included);
- ``carries``: for each canonical parameter, which values the class (its latest version)
  can hold:
  ``"any"``, ``"> 1.0"``, ``"< 1.0"``, ``"<value> only"``, ``"no"`` (it has no such
  parameter: only the canonical default), or jmp's one ``"factor"`` and
  ``"1 / growth_factor only"``, or Flax's ``"None or float32 max"`` (its clamp);
- ``limits`` (values its constructor refuses), ``fix`` (what to use instead when it
  cannot express a config), ``quirks`` (behaviour differences of every config);
- ``state``: the name of its state dict's form in :data:`STATE_FORMS` (None: it has
  no state worth a checkpoint).

The defaults were read from the installed sources (torch 2.13, paddle 3.3.1, keras
3.15.1, jmp 0.0.4, flax 0.12.8) with ``inspect``; paddle 2.x's from its documentation (GradScaler)
and source (AmpScaler); tf-keras 2's from its source. ``test_framework_assumptions.py`` in
each framework's test folder checks them against the framework where it is installed.

Example:
    >>> from unifiedamp.spec import ScalerConfig
    >>> row = NATIVE_SCALERS["paddle.amp.GradScaler"]
    >>> row["versions"]["2"]["defaults"]["init_loss_scaling"], row["state"]
    (32768.0, 'paddle')
    >>> cannot_carry(ScalerConfig(hysteresis=2), "torch.amp.GradScaler")
    ['hysteresis=2']
"""

from __future__ import annotations

from unifiedamp.spec._float32 import FLOAT32_MAX, f32
from unifiedamp.spec._names import CANONICAL

# typing.TYPE_CHECKING without importing typing (tests/core/test_import.py).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from unifiedamp.spec._config import ScalerConfig

__all__ = ["ALIASES", "FRAMEWORKS", "NATIVE_SCALERS", "QUALNAMES", "REQUIRED", "STATE_FORMS",
           "cannot_carry"]

#: A parameter without a default.
REQUIRED = "<required>"

# Canonical values of a scaler that hard-codes nothing beyond torch's rule.
_TORCH_RULE = {"hysteresis": 1, "min_scale": None, "max_scale": None, "dynamic": True}
_TORCH_PARAMS = ("device", "init_scale", "growth_factor", "backoff_factor", "growth_interval",
                 "enabled")
_TORCH_DEFAULTS = {"device": "cuda", "init_scale": 65536.0, "growth_factor": 2.0,
                   "backoff_factor": 0.5, "growth_interval": 2000, "enabled": True}
_TORCH_SAME = {name: name for name in _TORCH_PARAMS[1:]}
_TORCH_LIMITS = {"growth_factor": (">", 1.0), "backoff_factor": ("<", 1.0)}
_TORCH_CARRIES = {"init_scale": "any", "growth_factor": "> 1.0", "backoff_factor": "< 1.0",
                  "growth_interval": "any", "enabled": "any", "hysteresis": "1 only",
                  "min_scale": "no", "max_scale": "no", "dynamic": "True only"}
_TORCH_FIX = "unifiedamp's torch backend can: ua.GradScaler(..., backend='torch')"
_DEVICE = ("where the scale lives, not part of the config: pass device= to the torch backend; "
           "torch disables its scaler (with a warning) for 'cuda' where CUDA is not available")

_PADDLE_PARAMS = ("enable", "init_loss_scaling", "incr_ratio", "decr_ratio",
                  "incr_every_n_steps", "decr_every_n_nan_or_inf", "use_dynamic_loss_scaling")
_PADDLE_NAMES = {"enable": "enabled", "init_loss_scaling": "init_scale",
                 "incr_ratio": "growth_factor", "decr_ratio": "backoff_factor",
                 "incr_every_n_steps": "growth_interval",
                 "decr_every_n_nan_or_inf": "hysteresis", "use_dynamic_loss_scaling": "dynamic"}
_PADDLE_CARRIES = {**{name: "any" for name in CANONICAL}, "growth_factor": "> 1.0",
                   "backoff_factor": "< 1.0", "min_scale": "no", "max_scale": "no"}


def _paddle(releases: str, init: float, interval: int, hysteresis: int) -> dict[str, Any]:
    """One version of a Paddle scaler: its defaults and what it hard-codes."""
    return {"releases": releases,
            "defaults": {"enable": True, "init_loss_scaling": init, "incr_ratio": 2.0,
                         "decr_ratio": 0.5, "incr_every_n_steps": interval,
                         "decr_every_n_nan_or_inf": hysteresis,
                         "use_dynamic_loss_scaling": True},
            "fixed": {"min_scale": None, "max_scale": None}}


_PADDLE_LIMITS = {"incr_ratio": (">", 1.0), "decr_ratio": ("<", 1.0)}
_PADDLE_FIX = "unifiedamp's paddle backend can: ua.GradScaler(..., backend='paddle')"
_PADDLE_QUIRKS = (
    "paddle 3.3.1's scaler disables itself on a CPU place and, at scale(), outside "
    "auto_cast(dtype='float16')",
    "paddle 3.3.1 with NumPy 2: its backoff path raises TypeError (float() of a shape-[1] "
    "tensor)",
    "update() sees only the last optimizer's inf flag; no inf guard on growth",
)
# What both Paddle scalers share: all but their aliases and their defaults.
_PADDLE: dict[str, Any] = {
    "framework": "paddle", "backend": "paddle", "package": "paddlepaddle", "state": "paddle",
    "params": _PADDLE_PARAMS, "names": _PADDLE_NAMES, "carries": _PADDLE_CARRIES,
    "limits": _PADDLE_LIMITS, "fix": _PADDLE_FIX, "quirks": _PADDLE_QUIRKS,
}

_KERAS_IGNORED = {
    "inner_optimizer": "the optimizer it wraps, not part of the config: "
                       "ua.GradScaler(..., backend='keras').wrap(inner_optimizer)",
    "name": "the optimizer's name",
    "dynamic": "Keras 3 takes only dynamic=True (False raises ValueError)",
}
_KERAS_FIX = "needs unifiedamp's wrapper: ua.GradScaler(..., backend='keras').wrap(opt)"
_KERAS_CARRIES = {"init_scale": "any", "growth_factor": "2.0 only", "backoff_factor": "0.5 only",
                  "growth_interval": "any", "enabled": "any", "hysteresis": "1 only",
                  "min_scale": "no", "max_scale": "no", "dynamic": "True only"}
_KERAS3: dict[str, Any] = {
    "releases": ">=3.0",
    "params": ("inner_optimizer", "initial_scale", "dynamic_growth_steps", "name"),
    # Keras 3 takes dynamic= through **kwargs only to refuse False.
    "keyword_only": ("dynamic",),
    "names": {"initial_scale": "init_scale", "dynamic_growth_steps": "growth_interval"},
    "defaults": {"inner_optimizer": REQUIRED, "initial_scale": 32768.0,
                 "dynamic_growth_steps": 2000, "name": None, "dynamic": True},
    "fixed": {"growth_factor": 2.0, "backoff_factor": 0.5, **_TORCH_RULE, "enabled": True},
}
_KERAS3_QUIRKS = (
    "growth 2 and backoff 0.5 are hard-coded; no inf guard on growth (a growth past "
    "float32's max makes the scale inf)",
    "under tf.distribute.MirroredStrategy it checks replica 0's local gradients",
    "stateful apply() fails under the JAX backend")
_TF_KERAS2: dict[str, Any] = {
    "releases": "tf-keras 2 (tensorflow <= 2.15, or TF_USE_LEGACY_KERAS=1)",
    "params": ("inner_optimizer", "dynamic", "initial_scale", "dynamic_growth_steps"),
    "keyword_only": ("name",),
    "names": {"dynamic": "dynamic", "initial_scale": "init_scale",
              "dynamic_growth_steps": "growth_interval"},
    # None means 2**15 and 2000 when dynamic; a static one requires initial_scale.
    "defaults": {"inner_optimizer": REQUIRED, "dynamic": True, "initial_scale": 32768.0,
                 "dynamic_growth_steps": 2000},
    # tf-keras's DynamicLossScale backs off to max(scale / 2, 1): a floor of 1.
    "fixed": {"growth_factor": 2.0, "backoff_factor": 0.5, "hysteresis": 1, "min_scale": 1.0,
              "max_scale": None, "enabled": True},
}
_TF_KERAS2_QUIRKS = ("backoff floors the scale at 1 (tf.maximum(scale / 2, 1))",)
_TF_KERAS2_CARRIES = {**_KERAS_CARRIES, "min_scale": "1.0 only", "dynamic": "any"}
# What every Keras loss-scale optimizer shares: all but its package, call and defaults.
_KERAS: dict[str, Any] = {"framework": "keras", "backend": "keras", "state": "keras",
                          "ignored": _KERAS_IGNORED, "fix": _KERAS_FIX}
_JMP_FIX = "unifiedamp's jax backend can: ua.GradScaler(..., backend='jax')"

#: Each native scaler, keyed by its class's qualified name (see the module docstring).
NATIVE_SCALERS: dict[str, dict[str, Any]] = {
    "torch.amp.GradScaler": {
        "framework": "torch", "backend": "torch", "package": "torch", "state": "torch",
        "aliases": ("torch", "torch.amp.grad_scaler.GradScaler"),
        "params": _TORCH_PARAMS, "names": _TORCH_SAME,
        "ignored": {"device": _DEVICE},
        "versions": {"2": {"releases": ">=2.3", "defaults": _TORCH_DEFAULTS,
                           "fixed": _TORCH_RULE}},
        "carries": _TORCH_CARRIES, "limits": _TORCH_LIMITS, "fix": _TORCH_FIX,
        "quirks": ("default device 'cuda' silently disables it on a CPU-only machine",
                   "refuses growth_factor <= 1 and backoff_factor >= 1",
                   "multiplies by the float64 factor (float32-rounded factors give the spec's "
                   "bits)"),
    },
    "torch.cuda.amp.GradScaler": {
        "framework": "torch", "backend": "torch", "package": "torch", "state": "torch",
        "aliases": ("torch.cuda.amp.grad_scaler.GradScaler",),
        "params": _TORCH_PARAMS[1:], "names": _TORCH_SAME,
        "versions": {"2": {"releases": ">=2.3",
                           "defaults": {k: v for k, v in _TORCH_DEFAULTS.items()
                                        if k != "device"}, "fixed": _TORCH_RULE}},
        "carries": _TORCH_CARRIES, "limits": _TORCH_LIMITS, "fix": _TORCH_FIX,
        "quirks": ("deprecated: torch.amp.GradScaler('cuda', ...)",
                   "disabled (with a warning) where CUDA is not available"),
    },
    # FSDP's scaler takes backoff_factor BEFORE growth_factor (torch 2.13): a positional
    # port that keeps torch.amp's order swaps the two factors.
    "torch.distributed.fsdp.sharded_grad_scaler.ShardedGradScaler": {
        "framework": "torch", "backend": "torch", "package": "torch", "state": "torch",
        "aliases": ("torch.distributed.fsdp.ShardedGradScaler", "ShardedGradScaler"),
        "params": ("device", "init_scale", "backoff_factor", "growth_factor", "growth_interval",
                   "enabled", "process_group"),
        "names": _TORCH_SAME,
        "ignored": {"device": _DEVICE,
                    "process_group": "the ranks that agree on found_inf: pass "
                                     "process_group= to the torch backend"},
        "versions": {"2": {"releases": ">=2.3",
                           "defaults": {**_TORCH_DEFAULTS, "process_group": "WORLD"},
                           "fixed": _TORCH_RULE}},
        "carries": _TORCH_CARRIES, "limits": _TORCH_LIMITS, "fix": _TORCH_FIX,
        "quirks": ("positional order: backoff_factor before growth_factor",),
    },
    "paddle.amp.GradScaler": {
        **_PADDLE, "aliases": ("paddle", "paddle.amp.grad_scaler.GradScaler"),
        # Scripts written against paddle 2.x (whose documentation, and AmpScaler, say
        # 32768 / 1000 / 2) carry other defaults than paddle 3.x: porting must know which.
        "versions": {"2": _paddle("2.x", 32768.0, 1000, 2),
                     "3": _paddle(">=3.0", 65536.0, 2000, 1)},
    },
    # AmpScaler keeps paddle 2.x's scale and interval in 3.x, with hysteresis 1 in both.
    "paddle.amp.AmpScaler": {
        **_PADDLE,
        "aliases": ("paddle.amp.grad_scaler.AmpScaler", "paddle.fluid.dygraph.AmpScaler"),
        "versions": {"2": _paddle("2.x", 32768.0, 1000, 1),
                     "3": _paddle(">=3.0", 32768.0, 1000, 1)},
    },
    "keras.optimizers.LossScaleOptimizer": {
        **_KERAS, "package": "keras",
        "aliases": ("keras", "keras.mixed_precision.LossScaleOptimizer"),
        **{k: v for k, v in _KERAS3.items() if k not in ("releases", "defaults", "fixed")},
        "versions": {"3": {k: _KERAS3[k] for k in ("releases", "defaults", "fixed")}},
        "carries": _KERAS_CARRIES, "quirks": _KERAS3_QUIRKS,
    },
    # tf.keras is tf-keras 2 up to tensorflow 2.15 (and with TF_USE_LEGACY_KERAS=1), Keras 3
    # from tensorflow 2.16: the version picks the row.
    "tf.keras.mixed_precision.LossScaleOptimizer": {
        **_KERAS, "package": "tf.keras",
        "aliases": ("tensorflow.keras.mixed_precision.LossScaleOptimizer",),
        "params": _TF_KERAS2["params"],
        "versions": {"2": {**_TF_KERAS2, "carries": _TF_KERAS2_CARRIES}, "3": _KERAS3},
        "carries": _KERAS_CARRIES,
        "quirks": _TF_KERAS2_QUIRKS + _KERAS3_QUIRKS,
    },
    # The tf-keras package (import tf_keras): Keras 2 for tensorflow >= 2.16, where tf.keras is
    # Keras 3 (tf-models-official uses it). Always tf-keras 2's class.
    "tf_keras.mixed_precision.LossScaleOptimizer": {
        **_KERAS, "package": "tf-keras", "aliases": (),
        "params": _TF_KERAS2["params"], "names": _TF_KERAS2["names"], "keyword_only": ("name",),
        "versions": {"2": {k: _TF_KERAS2[k] for k in ("releases", "defaults", "fixed")}},
        "carries": _TF_KERAS2_CARRIES, "quirks": _TF_KERAS2_QUIRKS,
    },
    # TensorFlow 2.1-2.3's spelling (tf-keras 2's rule, removed in 2.4): its one loss_scale
    # argument is "dynamic", a number (a static scale) or a tf.mixed_precision.experimental
    # DynamicLossScale / FixedLossScale object; porting derives the config from it (see
    # "derived"). Its DynamicLossScale: 2**15, growth x2 every 2000 finite steps, /2 with a
    # floor of 1 (tensorflow/python/training/experimental/loss_scale.py).
    "tf.keras.mixed_precision.experimental.LossScaleOptimizer": {
        **_KERAS, "package": "tensorflow", "state": None,
        "aliases": ("tensorflow.keras.mixed_precision.experimental.LossScaleOptimizer",),
        "params": ("optimizer", "loss_scale"),
        "ignored": {**_KERAS_IGNORED, "optimizer": _KERAS_IGNORED["inner_optimizer"]},
        "names": {"loss_scale": "init_scale"},
        "derived": {"loss_scale": ("init_scale", "dynamic", "growth_interval",
                                   "growth_factor", "backoff_factor")},
        "versions": {"2": {"releases": "tensorflow 2.1-2.3",
                           "defaults": {"optimizer": REQUIRED, "loss_scale": REQUIRED},
                           "fixed": {"growth_factor": 2.0, "backoff_factor": 0.5,
                                     "growth_interval": 2000, "hysteresis": 1,
                                     "min_scale": 1.0, "max_scale": None, "enabled": True,
                                     "dynamic": True}}},
        "carries": {**_TF_KERAS2_CARRIES, "growth_factor": "any", "backoff_factor": "any"},
        "quirks": _TF_KERAS2_QUIRKS + ("removed after TensorFlow 2.3: the class no longer "
                                       "exists (tf.keras.mixed_precision.LossScaleOptimizer "
                                       "replaced it)",),
    },
    "jmp.DynamicLossScale": {
        "framework": "jmp", "backend": "jax", "package": "jmp", "state": "jmp",
        "aliases": ("jmp",),
        "params": ("loss_scale", "counter", "period", "factor", "min_loss_scale"),
        # factor f is growth f and backoff 1/f (handled in code).
        "names": {"loss_scale": "init_scale", "period": "growth_interval",
                  "min_loss_scale": "min_scale"},
        "ignored": {"counter": "state, not config (the growth tracker): from_native() "
                               "carries it"},
        "versions": {"0": {"releases": "0.0.4",
                           "defaults": {"loss_scale": REQUIRED, "counter": 0, "period": 2000,
                                        "factor": 2, "min_loss_scale": 1.0},
                           "fixed": {"hysteresis": 1, "max_scale": None, "dynamic": True,
                                     "enabled": True}}},
        "carries": {"init_scale": "any", "growth_factor": "factor",
                    "backoff_factor": "1 / growth_factor only", "growth_interval": "any",
                    "enabled": "no", "hysteresis": "1 only", "min_scale": "any",
                    "max_scale": "no", "dynamic": "True only"},
        "fix": _JMP_FIX,
        "quirks": ("tree_flatten drops min_loss_scale: after any jit/pytree boundary it is "
                   "1.0 again",
                   "backoff divides by factor (the spec multiplies by f32(1 / factor): the "
                   "same bits for a power of two)"),
    },
    "jmp.StaticLossScale": {
        "framework": "jmp", "backend": "jax", "package": "jmp", "state": None, "aliases": (),
        "params": ("loss_scale",), "names": {"loss_scale": "init_scale"},
        "versions": {"0": {"releases": "0.0.4", "defaults": {"loss_scale": REQUIRED},
                           "fixed": {"dynamic": False, "enabled": True}}},
        "carries": {**{name: "any" for name in CANONICAL}, "enabled": "no",
                    "dynamic": "False only"},
        "fix": _JMP_FIX, "quirks": (),
    },
    # A flax.struct dataclass: its fields are its constructor's parameters, in this order.
    # Its state (a checkpoint's, flax.serialization.to_state_dict's) is the two pytree
    # leaves fin_steps and scale: the "flax" form; the rest is the constructor's.
    # config_from_call reads its fields as written; the config whose spec trajectory is
    # Flax's has growth_interval + 1 (it grows when fin_steps == growth_interval) and
    # max_scale=FLOAT32_MAX (its clamp): what port and port-state write (flax_defaults).
    "flax.training.dynamic_scale.DynamicScale": {
        "framework": "flax", "backend": "jax", "package": "flax", "state": "flax",
        "aliases": ("flax",),
        "params": ("growth_factor", "backoff_factor", "growth_interval", "fin_steps", "scale",
                   "minimum_scale"),
        # growth_interval keeps its number: Flax's rule grows one step later with it (quirks).
        "names": {"growth_factor": "growth_factor", "backoff_factor": "backoff_factor",
                  "growth_interval": "growth_interval", "scale": "init_scale",
                  "minimum_scale": "min_scale"},
        "ignored": {"fin_steps": "state, not config (the growth tracker): port-state and "
                                 "from_native() carry it"},
        "versions": {"0": {"releases": "0.12.8 (read from its source)",
                           # minimum_scale: jnp.finfo(jnp.float32).tiny, 2**-126; None is no
                           # floor, the spec's min_scale=None.
                           "defaults": {"growth_factor": 2.0, "backoff_factor": 0.5,
                                        "growth_interval": 2000, "fin_steps": 0,
                                        "scale": 65536.0, "minimum_scale": 2.0**-126},
                           "fixed": {"hysteresis": 1, "max_scale": None, "dynamic": True,
                                     "enabled": True}}},
        # No hysteresis, ceiling (but its clamp), static or disabled mode (no DynamicScale is
        # jnp's plain value_and_grad); any factor, interval (growth_interval - 1) and floor.
        "carries": {**{name: "any" for name in CANONICAL}, "enabled": "no",
                    "hysteresis": "1 only", "max_scale": "None or float32 max",
                    "dynamic": "True only"},
        "fix": _JMP_FIX,
        "quirks": ("grows one step late: it grows when fin_steps == growth_interval, on the "
                   "(growth_interval + 1)-th finite step in a row, so every growth comes one "
                   "step later than the spec's with the same growth_interval (2001 finite "
                   "steps per growth at the default 2000; the spec's growth_interval + 1 "
                   "runs its trajectory); backoffs and skipped steps match",
                   "grows only when fin_steps equals growth_interval: a fin_steps past it "
                   "(after a lowered growth_interval) never grows until an overflow",
                   "clamps a growth past float32's maximum to it (the spec keeps the scale)",
                   "default minimum_scale is 2**-126 (jnp.finfo(jnp.float32).tiny): a floor",
                   "its first update multiplies Python floats in float64 outside jax.jit (one "
                   "float32 ulp for a factor that is not a power of two)"),
    },
}

#: Every other spelling of a class (and the short names) -> its key in NATIVE_SCALERS.
QUALNAMES: dict[str, str] = {alias: name for name, row in NATIVE_SCALERS.items()
                             for alias in row["aliases"]}


def _allows(rule: str, name: str, config: ScalerConfig) -> bool:
    value = getattr(config, name)
    if rule in ("any", "factor"):
        return True
    if rule == "no":  # no such parameter: only the canonical default (the class's attribute)
        return value == getattr(type(config), name)
    if rule == "None or float32 max":  # Flax clamps a growth at float32's largest number
        return value is None or value == FLOAT32_MAX
    if rule == "1 / growth_factor only":  # jmp backs off by its one factor
        return f32(value) == f32(1.0 / config.growth_factor)
    if rule.endswith(" only"):
        wanted = rule.removesuffix(" only")
        if wanted in ("True", "False"):
            return value is (wanted == "True")
        return value == float(wanted)
    op, bound = rule.split(" ")
    return value > float(bound) if op == ">" else value < float(bound)


def cannot_carry(config: ScalerConfig, native: str, version: str | None = None) -> list[str]:
    """What of ``config`` the native scaler ``native`` cannot hold, as ``name=value`` strings.

    ``native`` is a key of :data:`NATIVE_SCALERS` (or an alias); ``version`` one of its
    major versions (default: the entry's ``carries``, its latest version's). Empty: it
    holds all of it.

    Example:
        >>> from unifiedamp.spec import ScalerConfig
        >>> cannot_carry(ScalerConfig(growth_factor=3.0, min_scale=1.0), "paddle")
        ['min_scale=1.0']
        >>> tf_keras = "tf.keras.mixed_precision.LossScaleOptimizer"
        >>> cannot_carry(ScalerConfig(min_scale=1.0), tf_keras, version="2")
        []
        >>> cannot_carry(ScalerConfig(min_scale=1.0), tf_keras)
        ['min_scale=1.0']
    """
    row = NATIVE_SCALERS[QUALNAMES.get(native, native)]
    carries = row["versions"][version].get("carries", row["carries"]) if version else \
        row["carries"]
    return [f"{name}={getattr(config, name)!r}" for name in CANONICAL
            if not _allows(carries[name], name, config)]


# ------------------------------------------------------------------ the summary per framework


def _summary(name: str, version: str) -> dict[str, Any]:
    row = NATIVE_SCALERS[name]
    entry = row["versions"][version]
    names = entry.get("names", row["names"])
    defaults = {canonical: entry["defaults"][native] for native, canonical in names.items()
                if entry["defaults"].get(native, REQUIRED) is not REQUIRED}
    # The factors it hard-codes (Keras) or derives from its one factor (jmp).
    if "factor" in entry["defaults"]:
        factor = float(entry["defaults"]["factor"])
        defaults |= {"growth_factor": factor, "backoff_factor": 1.0 / factor}
    defaults |= {k: v for k, v in entry["fixed"].items()
                 if k in ("growth_factor", "backoff_factor") and k not in defaults}
    return {"api": name, "version": entry["releases"],
            "names": {canonical: native for native, canonical in names.items()},
            "defaults": {k: defaults[k] for k in CANONICAL if k in defaults},
            "native": row["carries"]}


#: Per framework, its main native scaler: ``api``, ``version`` (the releases with these
#: names and defaults), ``names`` (canonical -> native), ``defaults`` (by canonical name;
#: Keras's hard-coded factors included) and ``native`` (what it can hold): a view of
#: :data:`NATIVE_SCALERS` for the spec document and the porting aliases.
FRAMEWORKS: dict[str, dict[str, Any]] = {
    "torch": _summary("torch.amp.GradScaler", "2"),
    "paddle": _summary("paddle.amp.GradScaler", "3"),
    "paddle2": _summary("paddle.amp.GradScaler", "2"),
    "keras": _summary("keras.optimizers.LossScaleOptimizer", "3"),
    "jmp": _summary("jmp.DynamicLossScale", "0"),
}


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(word.title() for word in rest)


def _derive_aliases() -> dict[str, str]:
    # camelCase (the torch command reference's spelling), then every native
    # spelling of the per-framework view.
    aliases = {_camel(name): name for name in CANONICAL if _camel(name) != name}
    for row in FRAMEWORKS.values():
        aliases.update({native: name for name, native in row["names"].items()
                        if native != name})
    return aliases


#: Porting aliases, each mapping to exactly one canonical name. They rename; they
#: never bring the other framework's defaults along.
ALIASES: dict[str, str] = _derive_aliases()


# ------------------------------------------------------------------ state forms

#: The native state dicts, by form: ``keys`` (what marks a dict as this form), ``backend``
#: (the unifiedamp backend a canonical dict converted from it names) and ``carries`` (the
#: native scaler whose limits its dict shares; None: it carries no config, only the state).
STATE_FORMS: dict[str, dict[str, Any]] = {
    "canonical": {"keys": ("format",), "backend": None, "carries": None},
    "torch": {"keys": ("_growth_tracker",), "backend": "torch",
              "carries": "torch.amp.GradScaler"},
    "paddle": {"keys": ("incr_count", "decr_count"), "backend": "paddle",
               "carries": "paddle.amp.GradScaler"},
    # The optimizer's variables: the config is its constructor's.
    "keras": {"keys": ("dynamic_scale", "step_counter"), "backend": "keras", "carries": None},
    "jmp": {"keys": ("loss_scale", "counter"), "backend": "jax",
            "carries": "jmp.DynamicLossScale"},
    # DynamicScale's two pytree leaves (flax.serialization.to_state_dict): the config is its
    # constructor's, and must be one DynamicScale can hold.
    "flax": {"keys": ("fin_steps", "scale"), "backend": "jax",
             "carries": "flax.training.dynamic_scale.DynamicScale"},
}
