"""Mutation testing: does the test suite catch small, realistic bugs in the spec and backends?

Usage: python tools/mutation.py [--only NAME ...] [--list] [--full] [--baseline] [--timeout S]

Each mutant below is one hand-written bug: an exact piece of text in one source
file and what to replace it with. For each mutant the script writes the bug
into the file, runs pytest (``-x -q -p no:cacheprovider``) on the mutant's test
selection (or on the whole suite with ``--full``), writes the original file
back, and records whether the tests failed ("killed") or passed ("survived").
It prints a table and the kill rate per area and always exits 0: it is a
report for developers, not a CI gate. A run of every mutant takes about a quarter
of an hour on two cores.

The source tree is edited in place while a mutant runs, so do not run tests,
benchmarks or an editor's auto-save on the same checkout meanwhile. The
original bytes are kept in memory and written back in a ``finally`` (also on
Ctrl-C, SIGTERM or an error), and the script refuses to start when
``git status`` shows a target file modified, so it never overwrites
uncommitted work.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

import run_tests  # tools/run_tests.py, beside this script

ROOT = Path(__file__).resolve().parents[1]


class Mutant(NamedTuple):
    """One realistic bug: ``old`` (exactly once in ``path``) becomes ``new``.

    ``tests`` is the pytest selection expected to kill it (files, node ids, and
    ``-k`` expressions, as on a command line), kept to about a minute or less.
    """

    name: str
    path: str
    old: str
    new: str
    tests: str


SPEC = "src/unifiedamp/spec"
BACKENDS = "src/unifiedamp/backends"
PORTING = "src/unifiedamp/porting"

# Selections, fastest first within each: with -x the first failure ends the run. A selection
# runs as one pytest per session (tools/run_tests.py) its paths belong to.
_NUMPY_FILES = "tests/core/test_numpy_backend.py"
_TORCH_FILES = " ".join(f"tests/torch/test_torch_{topic}.py" for topic in (
    "scaler", "host_reads", "skips", "state", "devices", "private_api"))
_PADDLE_FILES = " ".join(f"tests/paddle/test_paddle_{topic}.py" for topic in (
    "names", "rule", "training", "state", "devices", "private_api"))
_KERAS_FILES = " ".join(f"tests/keras/test_keras_{topic}.py" for topic in (
    "wrapper", "training", "saving", "private_api"))
_PORT_FILES = " ".join(f"tests/{folder}/test_port.py" for folder in (
    "core", "torch", "paddle", "jax", "keras"))
_UNTRUSTED_FILES = " ".join(f"tests/{folder}/test_untrusted_files.py" for folder in (
    "core", "torch", "paddle", "jax"))
_MISUSE_FILES = " ".join(f"tests/{folder}/test_imperative_misuse.py" for folder in (
    "core", "torch", "paddle", "jax", "mlx"))
_STATE_FILES = " ".join(f"tests/{folder}/test_state_dict.py" for folder in (
    "core", "torch", "paddle", "jax", "mlx", "keras"))
_T_RULE = f"tests/core/test_spec_reference.py {SPEC}/_rule.py " \
          "tests/core/test_conformance.py::TestNumpyConformance"
_T_STATE = f"{_STATE_FILES} {SPEC}/_state_dict.py " \
           "tests/core/test_conformance.py::TestNumpyConformance"
_T_CONFIG = f"tests/core/test_spec_config.py {SPEC}/_config.py tests/core/test_spec_reference.py"
# The test_state_dict.py files drive every backend through a checkpoint (loads, static mode).
_T_NUMPY = f"{_NUMPY_FILES} tests/core/test_conformance.py::TestNumpyConformance {_STATE_FILES}"
_T_TORCH = f"{_TORCH_FILES} tests/torch/test_conformance.py::TestTorchConformance {_STATE_FILES}"
_T_TORCH_STATE = f"{_TORCH_FILES} tests/torch/test_torch_porting.py " \
                 f"tests/torch/test_conformance.py::TestTorchConformance {_STATE_FILES}"
_T_JAX = "tests/jax/test_jax_backend.py tests/jax/test_jax_devices.py " \
         "tests/jax/test_conformance.py::TestJaxConformance"
_T_MLX = "tests/mlx/test_mlx_backend.py tests/mlx/test_conformance.py::TestMlxConformance"
_T_FUNCTIONAL = f"{_T_MLX} {_T_JAX} {_STATE_FILES}"
_T_FLOAT32 = "tests/jax/test_float32_bits.py::test_jax_namespace_matches_ieee_under_jit " \
             "tests/jax/test_float32_bits.py::test_jax_multiply_takes_the_factor_as_arrays_too " \
             + _T_JAX
_T_KERAS = f"{_KERAS_FILES} tests/keras/test_conformance.py::TestKerasConformance"
_T_PADDLE = f"{_PADDLE_FILES} tests/paddle/test_conformance.py::TestPaddleConformance " \
            f"{_STATE_FILES}"
_T_PORT = _PORT_FILES

MUTANTS: tuple[Mutant, ...] = (
    # ---------------------------------------------------------------- spec: the rule
    Mutant("spec-static-keeps-trackers", f"{SPEC}/_rule.py",
           "return ScalerState(scale, 0, 0)",
           "return ScalerState(scale, growth, hyst)", _T_RULE),
    Mutant("spec-backoff-gt", f"{SPEC}/_rule.py",
           "if hyst >= config.hysteresis:", "if hyst > config.hysteresis:", _T_RULE),
    Mutant("spec-growth-gt", f"{SPEC}/_rule.py",
           "if growth >= config.growth_interval:", "if growth > config.growth_interval:",
           _T_RULE),
    Mutant("spec-hysteresis-kept-on-finite", f"{SPEC}/_rule.py",
           "hyst, growth = 0, growth + 1", "hyst, growth = hyst, growth + 1", _T_RULE),
    Mutant("spec-growth-kept-on-inf", f"{SPEC}/_rule.py",
           "growth, hyst = 0, hyst + 1", "growth, hyst = growth, hyst + 1", _T_RULE),
    Mutant("spec-min-scale-unrounded", f"{SPEC}/_rule.py",
           "scale = max(scale, f32(config.min_scale))",
           "scale = max(scale, config.min_scale)", _T_RULE),
    Mutant("spec-max-scale-unrounded", f"{SPEC}/_rule.py",
           "candidate = min(candidate, f32(config.max_scale))",
           "candidate = min(candidate, config.max_scale)", _T_RULE),
    Mutant("spec-growth-factor-unrounded", f"{SPEC}/_rule.py",
           "candidate = f32(scale * f32(config.growth_factor))",
           "candidate = f32(scale * config.growth_factor)", _T_RULE),
    Mutant("spec-overflowing-growth-taken", f"{SPEC}/_rule.py",
           "if math.isfinite(candidate):", "if not math.isnan(candidate):", _T_RULE),
    Mutant("spec-unscale-overflow-boundary", f"{SPEC}/_rule.py",
           "return scale < MIN_UNSCALABLE", "return scale <= MIN_UNSCALABLE", _T_RULE),
    Mutant("spec-reference-nan-is-finite", f"{SPEC}/_vectors.py",
           'kind != "F" or unscale_overflows', 'kind == "I" or unscale_overflows', _T_RULE),
    # ---------------------------------------------------------------- spec: state dicts
    Mutant("state-older-version-accepted", f"{SPEC}/_state_dict.py",
           "if version != STATE_VERSION or isinstance(version, bool):",
           "if not isinstance(version, int) or version > STATE_VERSION "
           "or isinstance(version, bool):", _T_STATE),
    Mutant("state-scale-not-rounded", f"{SPEC}/_state_dict.py",
           "return f32(scale) + 0.0", "return scale + 0.0", _T_STATE),
    Mutant("state-negative-tracker-accepted", f"{SPEC}/_state_dict.py",
           "or isinstance(value, bool) or int(value) < 0:", "or isinstance(value, bool):",
           _T_STATE),
    Mutant("state-paddle-decr-count-dropped", f"{SPEC}/_state_dict.py",
           'trackers = {"growth_tracker": "incr_count", "hysteresis_tracker": "decr_count"}',
           'trackers = {"growth_tracker": "incr_count"}', _T_STATE),
    Mutant("state-native-missing-key-unchecked", f"{SPEC}/_state_dict.py",
           "    if missing:\n        raise _state_error(f\"missing key(s) {missing} (a native",
           "    if False:\n        raise _state_error(f\"missing key(s) {missing} (a native",
           "tests/core/test_state_dict.py::"
           "test_a_native_paddle_dict_missing_a_key_names_it_and_changes_nothing " + _T_STATE),
    # ---------------------------------------------------------------- spec: config
    Mutant("config-min-max-compared-unrounded", f"{SPEC}/_config.py",
           "if lo is not None and hi is not None and f32(lo) > f32(hi):",
           "if lo is not None and hi is not None and lo > hi:", _T_CONFIG),
    Mutant("config-init-bounds-unrounded", f"{SPEC}/_config.py",
           '"min_scale" if lo is not None and init < f32(lo) else',
           '"min_scale" if lo is not None and init < lo else', _T_CONFIG),
    Mutant("config-bool-interval-accepted", f"{SPEC}/_config.py",
           "if not isinstance(value, numbers.Integral) or isinstance(value, bool):\n"
           "        raise _invalid(name, value, TypeError)\n    if int(value) < 1:",
           "if not isinstance(value, numbers.Integral):\n"
           "        raise _invalid(name, value, TypeError)\n    if int(value) < 1:", _T_CONFIG),
    Mutant("config-backoff-one-refused", f"{SPEC}/_config.py",
           "0 < backoff <= 1 and", "0 < backoff < 1 and", _T_CONFIG),
    # ---------------------------------------------------------------- functional base (JAX, MLX)
    Mutant("functional-static-keeps-trackers", f"{BACKENDS}/_functional.py",
           "self._make(config, self.loss_scale, xp.zeros_like(self.growth_tracker),\n"
           "                              xp.zeros_like(self.hysteresis_tracker),",
           "self._make(config, self.loss_scale, self.growth_tracker,\n"
           "                              self.hysteresis_tracker,",
           _T_FUNCTIONAL),
    Mutant("functional-min-clamp-swapped", f"{BACKENDS}/_functional.py",
           "backed = xp.maximum(backed,", "backed = xp.minimum(backed,", _T_FUNCTIONAL),
    Mutant("functional-max-clamp-swapped", f"{BACKENDS}/_functional.py",
           "grown = xp.minimum(grown,", "grown = xp.maximum(grown,", _T_FUNCTIONAL),
    Mutant("functional-backoff-gt", f"{BACKENDS}/_functional.py",
           "(hyst >= config.hysteresis)", "(hyst > config.hysteresis)", _T_FUNCTIONAL),
    Mutant("functional-growth-gt", f"{BACKENDS}/_functional.py",
           "(growth >= config.growth_interval)", "(growth > config.growth_interval)",
           _T_FUNCTIONAL),
    Mutant("functional-growth-kept-on-inf", f"{BACKENDS}/_functional.py",
           "xp.where(inf, 0, self.growth_tracker + 1)",
           "xp.where(inf, self.growth_tracker, self.growth_tracker + 1)", _T_FUNCTIONAL),
    Mutant("functional-restore-takes-enabled", f"{BACKENDS}/_functional.py",
           "self._make(config.replace(enabled=self._config.enabled),",
           "self._make(config,", _T_FUNCTIONAL),
    # ---------------------------------------------------------------- float32 on bits (JAX, Keras)
    Mutant("float32-mul-bits-no-zero-case", f"{BACKENDS}/_float32_bits.py",
           "return xp.where(xp.equal(bits, 0), self.int32(0), out)", "return out", _T_FLOAT32),
    Mutant("float32-product-error-drops-the-low-product", f"{BACKENDS}/_float32_bits.py",
           "self.int32(0xFFF)), 12) + xl * cl - hl", "self.int32(0xFFF)), 12) - hl",
           _T_FLOAT32),
    Mutant("float32-tie-ignores-the-remainder", f"{BACKENDS}/_float32_bits.py",
           "tie_up = xp.logical_or(xp.greater(below, 0),", "tie_up = xp.logical_or(False,",
           _T_FLOAT32),
    Mutant("float32-reciprocal-no-neighbours", f"{BACKENDS}/_float32_bits.py",
           "+ self.int32(list(range(-4, 5))))", "+ self.int32(list(range(0, 1))))",
           "tests/keras/test_float32_bits.py::test_keras_namespace_matches_ieee"),
    Mutant("float32-reciprocal-tie-by-the-wrong-sign", f"{BACKENDS}/_float32_bits.py",
           "tiny = self.round_half_even(t, -error)", "tiny = self.round_half_even(t, error)",
           _T_FLOAT32),
    Mutant("float32-split-flushes-subnormals", f"{BACKENDS}/_float32_bits.py",
           "lo = xp.where(subnormal, self.float32(2.0**-64), self.float32(1.0))",
           "lo = xp.where(subnormal, self.float32(1.0), self.float32(1.0))", _T_FLOAT32),
    # ---------------------------------------------------------------- JAX
    Mutant("jax-unscale-checks-unscaled-grads", f"{BACKENDS}/jax/_scaler.py",
           "        finite = _all_finite(grads, axis_name, caller) & self._reciprocal_finite()\n"
           "        return _multiply(grads, inverse), finite",
           "        out = _multiply(grads, inverse)\n"
           "        return out, _all_finite(out, axis_name, caller) & self._reciprocal_finite()",
           _T_JAX),
    Mutant("jax-nan-is-finite", f"{BACKENDS}/jax/_scaler.py",
           "jnp.min(jnp.isfinite(jnp.asarray(leaf))", "jnp.min(~jnp.isinf(jnp.asarray(leaf))",
           _T_JAX),
    Mutant("jax-all-finite-any-device", f"{BACKENDS}/jax/_scaler.py",
           "lax.psum((~finite).astype(jnp.int32), axes) == 0",
           "lax.pmax(finite.astype(jnp.int32), axes) == 1", _T_JAX),
    Mutant("jax-loss-scaled-axis-ignored", f"{BACKENDS}/jax/_optax.py",
           "finite = (_all_finite(updates, axis_name, \"loss_scaled\")",
           "finite = (_all_finite(updates, None, \"loss_scaled\")",
           "tests/jax/test_jax_devices.py::"
           "test_loss_scaled_with_axis_name_skips_on_every_device_in_shard_map_and_pmap "
           + _T_JAX),
    Mutant("functional-report-drops-the-loss", f"{BACKENDS}/_functional_diagnostics.py",
           "loss_finite=loss_is_finite(backend.xp, loss)", "loss_finite=None",
           "tests/mlx/test_diagnostics_functional_mlx.py "
           "tests/jax/test_diagnostics_functional_jax.py"),
    # ---------------------------------------------------------------- MLX
    Mutant("mlx-nan-is-finite", f"{BACKENDS}/mlx.py",
           "finite = finite & mx.isfinite(mx.sum(leaf * 0))",
           "finite = finite & ~mx.any(mx.isinf(leaf))", _T_MLX),
    # ---------------------------------------------------------------- NumPy
    Mutant("numpy-nan-is-finite", f"{BACKENDS}/numpy.py",
           "found_inf = found_inf or not bool(np.isfinite(g).all())",
           "found_inf = found_inf or bool(np.isinf(g).any())", _T_NUMPY),
    Mutant("numpy-unscale-not-recorded", f"{BACKENDS}/numpy.py",
           "        self._functional_found_inf.append(not finite)\n", "", _T_NUMPY),
    Mutant("numpy-unscale-skipped", f"{BACKENDS}/numpy.py",
           "np.multiply(g, inv, out=g,", "np.multiply(g, 1.0, out=g,", _T_NUMPY),
    Mutant("numpy-all-optimizers-must-be-inf", f"{BACKENDS}/numpy.py",
           "found_inf = any(checks)", "found_inf = all(checks)", _T_NUMPY),
    Mutant("numpy-update-keeps-functional-checks", f"{BACKENDS}/numpy.py",
           "        self._functional_found_inf.clear()\n", "",
           "tests/core/test_numpy_backend.py::"
           "test_update_clears_the_functional_checks_so_one_inf_skips_one_update " + _T_NUMPY),
    Mutant("numpy-unscale-checks-unscaled-grads", f"{BACKENDS}/numpy.py",
           "            found_inf = found_inf or not bool(np.isfinite(g).all())\n"
           "            with np.errstate(over=\"ignore\", invalid=\"ignore\"):\n"
           "                np.multiply(g, inv, out=g, casting=\"same_kind\")\n",
           "            with np.errstate(over=\"ignore\", invalid=\"ignore\"):\n"
           "                np.multiply(g, inv, out=g, casting=\"same_kind\")\n"
           "            found_inf = found_inf or not bool(np.isfinite(g).all())\n",
           "tests/core/test_numpy_backend.py::"
           "test_unscale_checks_the_gradients_as_given_not_as_unscaled " + _T_NUMPY),
    # ---------------------------------------------------------------- torch
    Mutant("torch-spec-update-no-inf-guard", f"{BACKENDS}/torch/_rule.py",
           "torch.where(candidate != math.inf, candidate, scale, out=scale)",
           "scale.copy_(candidate)", _T_TORCH),
    # The factor must be float32 (the spec's f32(scale * f32(factor))); the bug that
    # changes bits keeps it in float64, as torch's own kernel takes it.
    Mutant("torch-spec-update-growth-factor-float64", f"{BACKENDS}/torch/_rule.py",
           "torch.where(grow, constants[\"growth\"], constants[\"one\"]))",
           "torch.where(grow, torch.tensor(config.growth_factor, dtype=torch.float64, "
           "device=scale.device), constants[\"one\"]))",
           _T_TORCH),
    Mutant("torch-spec-update-backoff-gt", f"{BACKENDS}/torch/_rule.py",
           "back_off = new_hyst >= config.hysteresis", "back_off = new_hyst > config.hysteresis",
           _T_TORCH),
    Mutant("torch-spec-update-growth-gt", f"{BACKENDS}/torch/_rule.py",
           "grow = new_growth >= config.growth_interval",
           "grow = new_growth > config.growth_interval", _T_TORCH),
    Mutant("torch-spec-update-static-keeps-trackers", f"{BACKENDS}/torch/_rule.py",
           "        growth.zero_()\n        hyst.zero_()\n        return\n",
           "        return\n", _T_TORCH),
    Mutant("torch-spec-update-hysteresis-kept-on-finite", f"{BACKENDS}/torch/_rule.py",
           "new_hyst = torch.addcmul(inf, hyst, inf)", "new_hyst = hyst + inf", _T_TORCH),
    Mutant("torch-native-growth-factor-unrounded", f"{BACKENDS}/torch/_scaler.py",
           "self._float32_factors = (spec.f32(self._config.growth_factor),",
           "self._float32_factors = (self._config.growth_factor,", _T_TORCH),
    Mutant("torch-native-backoff-factor-unrounded", f"{BACKENDS}/torch/_scaler.py",
           "                                 spec.f32(self._config.backoff_factor))",
           "                                 self._config.backoff_factor)", _T_TORCH),
    Mutant("torch-clamp-off-by-one", f"{BACKENDS}/torch/_scaler.py",
           "growth.clamp_(max=self._config.growth_interval - 1)",
           "growth.clamp_(max=self._config.growth_interval)", _T_TORCH),
    Mutant("torch-update-last-optimizer-only", f"{BACKENDS}/torch/_scaler.py",
           "found = torch.stack(found_infs).sum().clamp_(max=1.0)",
           "found = found_infs[-1]", _T_TORCH),
    Mutant("torch-unscalable-bound-ignores-backoff", f"{BACKENDS}/torch/_rule.py",
           "backoff = spec.f32(config.backoff_factor) * (1 - 2.0**-24)",
           "backoff = spec.f32(config.growth_factor)", _T_TORCH),
    Mutant("torch-host-skip-run-not-carried", f"{BACKENDS}/torch/_scaler.py",
           "            self._consecutive_skips_device.fill_(self._consecutive_skips_host)\n",
           "", _T_TORCH),
    Mutant("torch-fused-skips-not-counted", f"{BACKENDS}/torch/_scaler.py",
           "            self._skip_count_device.add_(found)",
           "            self._skip_count_device.add_(found * 0)", _T_TORCH),
    Mutant("torch-unscalable-check-flipped", f"{BACKENDS}/torch/_scaler.py",
           "if self._updates >= self._check_unscalable_from or torch.compiler.is_compiling()",
           "if self._updates < self._check_unscalable_from or torch.compiler.is_compiling()",
           _T_TORCH),
    Mutant("torch-functional-unscale-no-unscalable-check", f"{BACKENDS}/torch/_scaler.py",
           "            self._found_inf_if_reciprocal_overflows([found])\n",
           "            pass\n", _T_TORCH),
    Mutant("torch-update-drops-functional-next-to-optimizer", f"{BACKENDS}/torch/_scaler.py",
           "        if functional:\n            found_infs += functional\n",
           "        if functional and not found_infs:\n"
           "            found_infs += functional\n",
           _T_TORCH),
    Mutant("torch-load-no-clamp-rearm", f"{BACKENDS}/torch/_scaler.py",
           "        self._clamp_tracker = True\n        self._hysteresis_may_be_set = "
           "state.hysteresis_tracker > 0",
           "        self._hysteresis_may_be_set = state.hysteresis_tracker > 0",
           _T_TORCH_STATE),
    Mutant("torch-load-takes-enabled", f"{BACKENDS}/torch/_scaler.py",
           "self._config = config.replace(enabled=self._config.enabled)",
           "self._config = config", _T_TORCH_STATE),
    Mutant("torch-host-skip-flag-last-optimizer-only", f"{BACKENDS}/torch/_scaler.py",
           "self._host_found |= skipped", "self._host_found = skipped",
           "tests/torch/test_torch_skips.py::"
           "test_collapse_counts_an_iteration_whose_first_optimizer_skipped " + _T_TORCH),
    Mutant("torch-functional-unscale-flag-unclamped", f"{BACKENDS}/torch/_scaler.py",
           "        if len(groups) > 1:\n            found.clamp_(max=1.0)  # a 0/1 flag",
           "        #",
           "tests/torch/test_torch_skips.py::"
           "test_functional_unscale_of_several_dtypes_counts_one_inf_for_the_rule " + _T_TORCH),
    # ---------------------------------------------------------------- paddle
    Mutant("paddle-update-last-flag-only", f"{BACKENDS}/paddle/_scaler.py",
           "                if _is_set(s[\"found_inf\"]):\n"
           "                    optimizer_found = True",
           "                optimizer_found = _is_set(s[\"found_inf\"])", _T_PADDLE),
    Mutant("paddle-reciprocal-overflow-not-inf", f"{BACKENDS}/paddle/_scaler.py",
           "            return True\n        if len(flags) == 1:",
           "            pass\n        if len(flags) == 1:", _T_PADDLE),
    Mutant("paddle-non-float32-not-unscaled", f"{BACKENDS}/paddle/_scaler.py",
           "paddle.assign(self._multiply(g, reciprocal=True), g)", "paddle.assign(g, g)",
           _T_PADDLE),
    Mutant("paddle-scale-tensor-not-written", f"{BACKENDS}/paddle/_scaler.py",
           "self._scale_tensor.fill_(state.scale)", "pass", _T_PADDLE),
    Mutant("paddle-factor-cache-kept", f"{BACKENDS}/paddle/_scaler.py",
           "                factor.fill_(float(_factor_value(state.scale, key)))",
           "                pass",
           _T_PADDLE),
    Mutant("paddle-step-ignores-flag", f"{BACKENDS}/paddle/_scaler.py",
           "return None if skipped else call(*args, **kwargs)", "return call(*args, **kwargs)",
           _T_PADDLE),
    Mutant("paddle-load-takes-enabled", f"{BACKENDS}/paddle/_scaler.py",
           "self._config = config.replace(enabled=self._config.enabled)",
           "self._config = config", _T_PADDLE),
    Mutant("paddle-ranks-not-agreed", f"{BACKENDS}/paddle/_scaler.py",
           "if self._distributed is not False and dist.is_initialized() and",
           "if False and dist.is_initialized() and",
           "tests/distributed/test_distributed_paddle.py"),
    Mutant("paddle-update-keeps-functional-checks", f"{BACKENDS}/paddle/_scaler.py",
           "        self._functional_found_inf = []\n        if self._prechecked:",
           "        if self._prechecked:",
           "tests/paddle/test_paddle_training.py::"
           "test_update_clears_the_functional_checks_so_one_inf_skips_one_update " + _T_PADDLE),
    Mutant("paddle-float64-checked-in-float32", f"{BACKENDS}/paddle/_scaler.py",
           "wide = g if g.dtype == paddle.float64 else g.astype(paddle.float32)",
           "wide = g.astype(paddle.float32)",
           "tests/paddle/test_paddle_training.py::test_a_float64_gradient_is_checked_in_float64 "
           + _T_PADDLE),
    # ---------------------------------------------------------------- keras
    Mutant("keras-grow-gt", f"{BACKENDS}/keras/_rule.py",
           "full_g = growth >= ops.cast(interval, growth.dtype)",
           "full_g = growth > ops.cast(interval, growth.dtype)", _T_KERAS),
    Mutant("keras-backoff-gt", f"{BACKENDS}/keras/_rule.py",
           "full_h = hyst >= ops.cast(hysteresis, hyst.dtype)",
           "full_h = hyst > ops.cast(hysteresis, hyst.dtype)", _T_KERAS),
    Mutant("keras-no-overflow-guard", f"{BACKENDS}/keras/_rule.py",
           "ops.where(F32.is_finite(grown), grown, bits)",
           "ops.where(F32.is_finite(grown), grown, grown)", _T_KERAS),
    Mutant("keras-no-reciprocal-overflow-check", f"{BACKENDS}/keras/_optimizer.py",
           "unscalable = F32.bits(self.dynamic_scale) >= f32_bits(MIN_UNSCALABLE)",
           "unscalable = F32.bits(self.dynamic_scale) >= 0", _T_KERAS),
    Mutant("keras-config-not-saved", f"{BACKENDS}/keras/_optimizer.py",
           'config["scaler_config"] = self._config.to_dict()', "pass", _T_KERAS),
    Mutant("keras-pending-state-dropped", f"{BACKENDS}/keras/_optimizer.py",
           "        start = self._pending_state or ScalerState.initial(self._config)",
           "        start = ScalerState.initial(self._config)", _T_KERAS),
    Mutant("keras-first-replica-only", f"{BACKENDS}/keras/_tensorflow.py",
           "total = distribution.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)",
           "total = distribution.experimental_local_results(per_replica)[0]",
           "tests/keras/test_keras_distributed.py"),
    # Killed only where the test runs: TensorFlow takes this path for XLA-compiled
    # replicas on GPUs alone (a CUDA build of TensorFlow); elsewhere the test skips.
    Mutant("keras-no-merge-call-not-all-reduced", f"{BACKENDS}/keras/_tensorflow.py",
           "total = context.all_reduce(tf.distribute.ReduceOp.SUM, non_finite(grads))",
           "total = non_finite(grads)",
           "tests/keras/test_keras_distributed.py::"
           "test_mirrored_xla_custom_loop_on_gpus_skips_on_every_replica"),
    Mutant("keras-rule-change-not-in-variable", f"{BACKENDS}/keras/_optimizer.py",
           "        if self.built:\n            self.scaler_rule.assign(",
           "        if False:\n            self.scaler_rule.assign(",
           "tests/keras/test_keras_training.py::"
           "test_fit_and_compiled_apply_follow_a_rule_changed_after_compiling"),
    Mutant("keras-second-scaler-accepted", f"{BACKENDS}/keras/_optimizer.py",
           "        if _wrapper_of(inner_optimizer) is not None:",
           "        if False:",
           "tests/keras/test_keras_wrapper.py::"
           "test_an_optimizer_wrapped_by_one_scaler_cannot_be_wrapped_by_another"),
    # ---------------------------------------------------------------- port-state, diagnostics
    Mutant("port-state-paddle-decr-count-zero", f"{SPEC}/_state_dict.py",
           '"decr_count": s.hysteresis_tracker,', '"decr_count": 0,',
           "tests/core/test_port_state.py::"
           "test_forms_with_a_hysteresis_counter_keep_a_nonzero_tracker "
           "tests/core/test_spec_natives.py"),
    Mutant("port-state-paddle-unpickles-anything", f"{PORTING}/_safe_pickle.py",
           "    if name not in _PADDLE:\n        raise Refused(f\"a reference to {name}\")\n"
           "    return _PADDLE[name]",
           "    if name not in _PADDLE:\n        return _opaque\n    return _PADDLE[name]",
           "tests/paddle/test_port_state.py::"
           "test_no_checkpoint_runs_code_unless_the_user_trusts_it "
           "tests/core/test_port_state.py::"
           "test_no_checkpoint_runs_code_unless_the_user_trusts_it "
           "tests/torch/test_port_state.py::"
           "test_no_checkpoint_runs_code_unless_the_user_trusts_it"),
    Mutant("port-state-paddle-real-eval", f"{PORTING}/_safe_pickle.py",
           '    "builtins.eval": _dense_tensor_data,',
           '    "builtins.eval": lambda args, pos: eval(*args),',
           f"{_UNTRUSTED_FILES}"),
    Mutant("port-state-paddle-eval-any-namespace", f"{PORTING}/_safe_pickle.py",
           ' and list(args[1]) == ["data"]', " and True",
           "tests/core/test_untrusted_files.py::"
           "test_a_crafted_file_is_refused_clearly_by_the_api_and_the_cli "
           "tests/torch/test_untrusted_files.py::"
           "test_a_crafted_file_is_refused_clearly_by_the_api_and_the_cli"),
    Mutant("port-state-paddle-tensor-records-kept", f"{PORTING}/_safe_pickle.py",
           "        return x[1] if tensor_record else x",
           "        return x",
           "tests/paddle/test_untrusted_files.py::"
           "test_fuzzed_pickles_and_json_end_in_the_trusted_data_or_a_clear_error"),
    Mutant("port-state-paddle-void-dtype-read", f"{PORTING}/_pickle_reader.py",
           'DTYPES = ("b1", "i1",', 'DTYPES = ("V8", "b1", "i1",',
           "tests/core/test_untrusted_files.py::"
           "test_a_crafted_file_is_refused_clearly_by_the_api_and_the_cli "
           "tests/torch/test_untrusted_files.py::"
           "test_a_crafted_file_is_refused_clearly_by_the_api_and_the_cli"),
    Mutant("port-state-damaged-pickle-suggests-trust", f"{PORTING}/_pickle_reader.py",
           "    if not ok:\n        raise ValueError(what)",
           "    if not ok:\n        raise Refused(what)",
           "tests/paddle/test_port_state.py::"
           "test_an_empty_truncated_or_foreign_file_is_refused_naming_it "
           "tests/core/test_port_state.py::"
           "test_an_empty_truncated_or_foreign_file_is_refused_naming_it "
           "tests/jax/test_port_state.py::"
           "test_an_empty_truncated_or_foreign_file_is_refused_naming_it "
           "tests/torch/test_port_state.py::"
           "test_an_empty_truncated_or_foreign_file_is_refused_naming_it"),
    Mutant("port-state-shared-children-uncounted", f"{PORTING}/_limits.py",
           "    if total > limits.max_entries:", "    if False:",
           f"{_UNTRUSTED_FILES}"),
    Mutant("port-state-zip-checksum-unchecked", f"{PORTING}/_limits.py",
           "    if bad is not None:\n        raise ValueError(f\"{path}: the data of its member",
           "    if False:\n        raise ValueError(f\"{path}: the data of its member",
           "tests/core/test_port_state.py::"
           "test_a_checkpoint_whose_data_fails_its_own_checksum_is_refused "
           "tests/torch/test_port_state.py::"
           "test_a_checkpoint_whose_data_fails_its_own_checksum_is_refused"),
    Mutant("port-state-torch-global-unnamed", f"{PORTING}/_safe_pickle.py",
           '    name = (re.search(r"GLOBAL ([\\w.]+)", message)',
           '    name = (re.search(r"[Uu]nsupported (?:global|class):? ([\\w.]+)", message)',
           "tests/paddle/test_port_state.py::"
           "test_no_checkpoint_runs_code_unless_the_user_trusts_it "
           "tests/core/test_port_state.py::"
           "test_no_checkpoint_runs_code_unless_the_user_trusts_it "
           "tests/torch/test_port_state.py::"
           "test_no_checkpoint_runs_code_unless_the_user_trusts_it"),
    Mutant("files-mode-of-mkstemp", "src/unifiedamp/_atomic_write.py",
           "            os.chmod(tmp, old.st_mode & 0o7777)", "            pass",
           "tests/core/test_untrusted_files.py::"
           "test_a_rewrite_keeps_the_files_mode_and_a_new_file_follows_the_umask"),
    Mutant("files-sweep-removes-live-temps", "src/unifiedamp/_atomic_write.py",
           "        if match and not _alive(int(match.group(1))):", "        if match:",
           "tests/core/test_untrusted_files.py::"
           "test_the_temp_sweep_keeps_a_live_writers_file_and_a_stray_name_blocks_nothing"),
    Mutant("files-symlink-replaced", "src/unifiedamp/_atomic_write.py",
           "    real = os.path.realpath(path)", "    real = os.path.abspath(path)",
           "tests/core/test_port_state.py::"
           "test_in_place_through_a_symlink_rewrites_the_target_and_keeps_the_link"),
    Mutant("files-temp-left-after-failure", "src/unifiedamp/_atomic_write.py",
           "        with contextlib.suppress(FileNotFoundError):\n            os.remove(tmp)",
           "        pass",
           "tests/core/test_port_state.py::"
           "test_a_write_stopped_by_a_full_disk_or_sigkill_leaves_the_checkpoint_whole"),
    Mutant("files-stale-temps-kept", "src/unifiedamp/_atomic_write.py",
           "        if match and not _alive(int(match.group(1))):",
           "        if match and _alive(int(match.group(1))):",
           "tests/core/test_port_state.py::"
           "test_a_write_stopped_by_a_full_disk_or_sigkill_leaves_the_checkpoint_whole"),
    Mutant("history-skipped-string-read-as-true", "src/unifiedamp/diagnostics.py",
           "            if not _is_bool(b):", "            if b is None:",
           "tests/core/test_diagnostics.py::"
           "test_history_from_json_refuses_a_record_it_would_misread"),
    Mutant("paddle-mid-iteration-load-accepted", f"{BACKENDS}/paddle/_scaler.py",
           "            raise mid_iteration_load_error()", "            pass",
           f"{_MISUSE_FILES}"),
    Mutant("paddle-second-thread-accepted", f"{BACKENDS}/paddle/_scaler.py",
           "        elif self._iteration_thread != me:", "        elif False:",
           f"{_MISUSE_FILES}"),
    Mutant("diagnostics-summary-and-0-more", "src/unifiedamp/diagnostics.py",
           'names += f" and {more} more" if more > 0 else ""',
           'names += f" and {more} more" if more >= 0 else ""',
           "tests/core/test_diagnostics.py::"
           "test_summary_names_limit_gradients_and_counts_only_the_rest "
           "tests/core/test_diagnostics.py"),
    # ---------------------------------------------------------------- one interface
    Mutant("numpy-where-finite-always-new", f"{BACKENDS}/numpy.py",
           "return tree_map(lambda n, o: n if keep else o, new, old)",
           "return tree_map(lambda n, o: n, new, old)",
           f"tests/cross/test_agnostic_step.py {_NUMPY_FILES}"),
    Mutant("numpy-update-ignores-the-flag", f"{BACKENDS}/numpy.py",
           "                checks.append(not bool(finite))", "                pass",
           f"tests/cross/test_interface.py tests/keras/test_interface.py {_NUMPY_FILES}"),
    Mutant("torch-skips-counted-twice", f"{BACKENDS}/torch/_scaler.py",
           "            self._skip_count_host += host_found",
           "            self._skip_count_host += host_found * 2",
           f"{_TORCH_FILES} tests/torch/test_callbacks_accelerate.py"),
    Mutant("imperative-skips-not-counted", f"{BACKENDS}/_imperative.py",
           "        self._skipped += int(found_inf)", "        pass",
           f"{_PADDLE_FILES} {_NUMPY_FILES} tests/cross/test_agnostic_step.py"),
    Mutant("functional-updates-not-counted", f"{BACKENDS}/_functional.py",
           "        updates = (self.updates + 1).astype(xp.int32)",
           "        updates = self.updates",
           "tests/mlx/test_mlx_backend.py tests/jax/test_jax_backend.py "
           "tests/jax/test_jax_devices.py tests/cross/test_agnostic_step.py"),
    Mutant("functional-setter-drops-the-state", f"{BACKENDS}/_functional.py",
           "self._replaced(self._make(config, *self._leaves()), ",
           "self._replaced(type(self)(**config.to_dict()), ",
           "tests/cross/test_interface.py tests/keras/test_interface.py "
           "tests/jax/test_jax_backend.py tests/jax/test_jax_devices.py "
           "tests/mlx/test_mlx_backend.py"),
    Mutant("torch-where-finite-ignores-the-flag", f"{BACKENDS}/torch/_scaler.py",
           "            return tree_map(lambda n, o: torch.where(finite, n, o), new, old)",
           "            return new",
           f"tests/cross/test_agnostic_step.py {_TORCH_FILES}"),
    Mutant("registry-aliases-case-sensitive", "src/unifiedamp/_registry.py",
           "        name = BACKEND_ALIASES.get(name.lower(), "
           "name.lower() if name.lower() in rows else name)",
           "        name = BACKEND_ALIASES.get(name, name)",
           "tests/cross/test_interface.py tests/keras/test_interface.py"),
    Mutant("flag-tensorflow-bool-not-read", "src/unifiedamp/_scaler.py",
           """    return text.strip("<>' ").removeprefix("dtype: '") in ("bool", "bool_")""",
           """    return text in ("bool", "bool_")""",
           f"{_KERAS_FILES} -k update"),
    # ---------------------------------------------------------------- porting
    Mutant("port-torch-factors-unrounded", f"{PORTING}/_config.py",
           "value = f32(value)", "value = float(value)", _T_PORT),
)


# ---------------------------------------------------------------- running


class Result(NamedTuple):
    mutant: Mutant
    outcome: str  # killed, timeout, survived, stale, error
    seconds: float
    detail: str


def area(path: str) -> str:
    if path.startswith(SPEC + "/"):
        return "spec"
    if path.startswith(BACKENDS + "/"):
        return "backends"
    if path.startswith(PORTING + "/"):
        return "porting"
    return "other"


def occurrences(mutant: Mutant) -> int:
    file = ROOT / mutant.path
    return file.read_text(encoding="utf-8").count(mutant.old) if file.exists() else 0


def modified_files(paths: list[str]) -> list[str] | None:
    """Target files git reports as changed (staged, unstaged or untracked); None if git
    cannot tell (not a checkout, no git)."""
    try:
        proc = subprocess.run(["git", "status", "--porcelain", "--", *paths], cwd=ROOT,
                              capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    # Porcelain v1: two status letters, a space, the path (renames: "old -> new").
    return sorted({line[3:].split(" -> ")[-1] for line in proc.stdout.splitlines() if line})


class _Terminated(Exception):
    pass


def _on_sigterm(signum: int, frame: object) -> None:
    # Turned into an exception so the finally that restores the file runs.
    raise _Terminated()


@contextmanager
def applied(mutant: Mutant) -> Iterator[None]:
    """The mutant written into its file; the original bytes and times written back after."""
    file = ROOT / mutant.path
    original = file.read_bytes()
    stat = file.stat()
    mutated = original.decode("utf-8").replace(mutant.old, mutant.new, 1).encode("utf-8")
    try:
        file.write_bytes(mutated)
        yield
    finally:
        file.write_bytes(original)
        # The original mtime makes the bytecode cached for the original valid again.
        os.utime(file, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def _kill(proc: subprocess.Popen[str]) -> None:
    # pytest runs in its own session: this ends it and any process it started.
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def sessions_of(selection: list[str]) -> list[tuple[str, list[str] | None, list[str]]]:
    """The selection split into test sessions (tools/run_tests.py): a path under
    ``tests/<folder>`` goes to that folder's session (``tests/keras`` to keras-tensorflow;
    ``keras-jax:tests/keras/...`` names another), a module of the package to the session
    that runs its doctests, options (``-k EXPR``) to every session. An empty selection is
    every session: (session, its paths or None for all of them, options)."""
    if not selection:
        return [(name, None, []) for name in run_tests.SESSIONS]
    paths, options, rest = [], [], list(selection)
    while rest:
        arg = rest.pop(0)
        if arg.startswith("-"):
            options.append(arg)
            if arg in ("-k", "-m") and rest:
                options.append(rest.pop(0))
        else:
            paths.append(arg)
    groups: dict[str, list[str]] = {}
    for path in paths:
        session, _, path = path.rpartition(":") if re.match(r"^[\w-]+:tests/", path) \
            else ("", "", path)
        groups.setdefault(session or run_tests.session_of(path), []).append(path)
    return [(name, group, options) for name, group in groups.items()]


def run_pytest(selection: list[str], timeout: float) -> tuple[int | None, str]:
    """(the first failing session's pytest exit code, or 0, or None on timeout; the
    output)."""
    deadline, output = time.monotonic() + timeout, ""
    for session, paths, options in sessions_of(selection):
        cmd = run_tests.command(session, ["-x", "-q", "-p", "no:cacheprovider", *options],
                                paths)
        # No bytecode from a mutated source is left behind for a later, honest run.
        env = {**os.environ, **run_tests.SESSIONS[session][0], "PYTHONDONTWRITEBYTECODE": "1"}
        code, out = _run(cmd, env, deadline - time.monotonic())
        output += out
        if code != 0:
            return code, output
    return 0, output


def _run(cmd: list[str], env: dict[str, str], timeout: float) -> tuple[int | None, str]:
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=max(timeout, 1))
    except subprocess.TimeoutExpired:
        _kill(proc)
        return None, ""
    except BaseException:
        _kill(proc)
        raise
    return proc.returncode, out


_FAILED = re.compile(r"^(?:FAILED|ERROR) (\S+)", re.M)


def first_failure(output: str) -> str:
    match = _FAILED.search(output)
    if match:
        return match.group(1)
    lines = [line for line in output.strip().splitlines() if line.strip()]
    return lines[-1][:80] if lines else ""


def judge(code: int | None, output: str) -> tuple[str, str]:
    if code is None:
        return "timeout", "(timed out: counted as killed)"
    if code == 0:
        return "survived", ""
    if code in (1, 2):  # tests failed; or collection/import failed, which -x stops at
        return "killed", first_failure(output)
    # 3 internal error, 4 usage error, 5 no test selected: the selection is broken.
    return "error", f"pytest exit {code}: {first_failure(output)}"


def run_mutant(mutant: Mutant, full: bool, timeout: float) -> Result:
    count = occurrences(mutant)
    if count != 1:
        return Result(mutant, "stale", 0.0, f"stale mutant: old text found {count} times")
    selection = [] if full else shlex.split(mutant.tests)
    start = time.perf_counter()
    with applied(mutant):
        code, output = run_pytest(selection, timeout)
    outcome, detail = judge(code, output)
    return Result(mutant, outcome, time.perf_counter() - start, detail)


def run_baselines(mutants: list[Mutant], full: bool, timeout: float) -> dict[str, str]:
    """Runs each distinct selection on the unmutated code; returns the failing ones."""
    failing = {}
    selections = sorted({"" if full else m.tests for m in mutants})
    for sel in selections:
        code, output = run_pytest(shlex.split(sel), timeout)
        status = "passes" if code == 0 else f"FAILS ({judge(code, output)[1] or code})"
        print(f"baseline: {sel or '(whole suite)'}: {status}", flush=True)
        if code != 0:
            failing[sel] = status
    return failing


# ---------------------------------------------------------------- reporting


def print_table(results: list[Result]) -> None:
    width = max([len("mutant"), *(len(r.mutant.name) for r in results)])
    fwidth = max([len("file"), *(len(r.mutant.path) for r in results)])
    print(f"\n{'mutant':<{width}}  {'file':<{fwidth}}  {'result':<8}  {'seconds':>7}  "
          "first failing test")
    for r in results:
        print(f"{r.mutant.name:<{width}}  {r.mutant.path:<{fwidth}}  {r.outcome:<8}  "
              f"{r.seconds:7.1f}  {r.detail}")


def print_summary(results: list[Result]) -> None:
    print()
    for name in ("spec", "backends", "porting", "other"):
        rows = [r for r in results if area(r.mutant.path) == name]
        if not rows:
            continue
        killed = sum(r.outcome in ("killed", "timeout") for r in rows)
        judged = sum(r.outcome in ("killed", "timeout", "survived") for r in rows)
        rate = f"{100 * killed / judged:.0f}%" if judged else "n/a"
        others = {o: sum(r.outcome == o for r in rows) for o in ("stale", "error")}
        extra = ", ".join(f"{n} {o}" for o, n in others.items() if n)
        print(f"{name:<9} killed {killed}/{judged} ({rate})" + (f"; {extra}" if extra else ""))
    survivors = [r.mutant.name for r in results if r.outcome == "survived"]
    if survivors:
        print("survived (write a test that fails on each):", ", ".join(survivors))


def print_list() -> None:
    for m in MUTANTS:
        count = occurrences(m)
        state = "" if count == 1 else f"  [stale mutant: old text found {count} times]"
        print(f"{m.name:<44} {m.path}{state}\n{'':<44} tests: {m.tests}")


def select(names: list[str] | None) -> list[Mutant]:
    if not names:
        return list(MUTANTS)
    by_name = {m.name: m for m in MUTANTS}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        for name in unknown:
            close = difflib.get_close_matches(name, by_name, n=3)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            print(f"unknown mutant {name!r}{hint}; --list shows them all", file=sys.stderr)
        raise SystemExit(2)
    return [by_name[n] for n in names]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Apply hand-written mutants one at a time and report which the tests kill.")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run only these mutants")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument("--full", action="store_true",
                        help="run the whole test suite for each mutant (slow)")
    parser.add_argument("--baseline", action="store_true",
                        help="first check that each selection passes on the unmutated code")
    parser.add_argument("--timeout", type=float, default=600.0,
                        help="seconds per mutant; a timeout counts as killed (default 600)")
    args = parser.parse_args(argv)
    if args.list:
        print_list()
        return 0
    mutants = select(args.only)
    paths = sorted({m.path for m in mutants})
    changed = modified_files(paths)
    if changed is None:
        print("cannot run git status here: refusing to edit files whose uncommitted changes "
              "could not be checked", file=sys.stderr)
        return 2
    if changed:
        for path in changed:
            print(f"{path} has uncommitted changes: commit or set them aside first; "
                  "nothing was run", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _on_sigterm)
    failing = run_baselines(mutants, args.full, args.timeout) if args.baseline else {}
    results: list[Result] = []
    try:
        for i, mutant in enumerate(mutants, 1):
            print(f"[{i}/{len(mutants)}] {mutant.name} ...", end=" ", flush=True)
            if ("" if args.full else mutant.tests) in failing:
                result = Result(mutant, "error", 0.0, "selection fails without the mutant")
            else:
                result = run_mutant(mutant, args.full, args.timeout)
            results.append(result)
            print(f"{result.outcome} ({result.seconds:.1f} s)", flush=True)
    except (KeyboardInterrupt, _Terminated):
        print("\ninterrupted; every file was restored; partial report:", file=sys.stderr)
        print_table(results)
        print_summary(results)
        return 130
    print_table(results)
    print_summary(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
