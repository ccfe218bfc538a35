"""The test vectors: configs, step patterns and the scales they must produce, computed by hand."""

from __future__ import annotations

from typing import Any, NamedTuple

from unifiedamp.spec._config import ScalerConfig
from unifiedamp.spec._rule import ScalerState, unscale_overflows, update

__all__ = ["VECTORS", "Vector", "run_reference"]


class Vector(NamedTuple):
    """One reference scenario: a config, a step pattern and the scales it must produce.

    ``steps`` is a string of ``F`` (all gradients finite), ``I`` (an inf) and
    ``N`` (a NaN), one character per iteration. ``changes`` maps a step index
    to config changes applied just before that step (as ``set_*`` would).
    ``scales`` is the scale after each update, computed by hand.
    """

    name: str
    config: dict[str, Any]
    steps: str
    scales: tuple[float, ...]
    changes: dict[int, dict[str, Any]] = {}

    def to_dict(self) -> dict[str, Any]:
        d = self._asdict()
        d["scales"] = list(self.scales)
        d["changes"] = {str(k): v for k, v in self.changes.items()}
        return d


def run_reference(vector: Vector) -> list[ScalerState]:
    """The reference trajectory of a vector: the state after each update.

    Example:
        >>> [s.scale for s in run_reference(VECTORS[0])] == list(VECTORS[0].scales)
        True
    """
    config = ScalerConfig(**vector.config)
    state = ScalerState.initial(config)
    trace = []
    for i, kind in enumerate(vector.steps):
        if i in vector.changes:
            config = config.replace(**vector.changes[i])
        state = update(config, state, kind != "F" or unscale_overflows(state.scale))
        trace.append(state)
    return trace


_G = 1.100000023841858  # f32(1.1)
VECTORS: tuple[Vector, ...] = (
    Vector("growth_on_nth_finite", {"init_scale": 1024.0, "growth_interval": 3},
           "FFFFFF", (1024, 1024, 2048, 2048, 2048, 4096)),
    Vector("backoff_resets_growth", {"init_scale": 1024.0, "growth_interval": 3},
           "IFFFIIFFFF", (512, 512, 512, 1024, 512, 256, 256, 256, 512, 512)),
    Vector("nan_backs_off_like_inf", {"init_scale": 1024.0, "growth_interval": 2},
           "NFFNI", (512, 512, 1024, 512, 256)),
    Vector("interval_one", {"init_scale": 1024.0, "growth_interval": 1},
           "FFIF", (2048, 4096, 2048, 4096)),
    Vector("defaults_first_steps", {}, "IIF", (32768, 16384, 16384)),
    Vector("hysteresis_two", {"init_scale": 1024.0, "growth_interval": 3, "hysteresis": 2},
           "IIFIFII", (1024, 512, 512, 512, 512, 512, 256)),
    # A backoff re-arms the hysteresis: the next backoff needs two more overflows.
    Vector("hysteresis_rearmed_after_backoff", {"init_scale": 1024.0, "hysteresis": 2},
           "IIII", (1024, 512, 512, 256)),
    Vector("min_scale_clamp", {"init_scale": 4.0, "min_scale": 1.5}, "IIIF",
           (2, 1.5, 1.5, 1.5)),
    Vector("max_scale_clamp", {"init_scale": 4.0, "growth_interval": 1, "max_scale": 10.0},
           "FFFI", (8, 10, 10, 5)),
    Vector("growth_overflow_keeps_scale", {"init_scale": 2.0**127, "growth_interval": 1},
           "FFIF", (2.0**127, 2.0**127, 2.0**126, 2.0**127)),
    Vector("non_power_of_two_factors_float32",
           {"init_scale": 1.0, "growth_factor": 1.1, "backoff_factor": 0.7,
            "growth_interval": 1},
           "FFFI",
           # float32 after every multiply. Carrying the scale in float64 and rounding
           # once at the end gives 0.9316999912261963 at the last step instead.
           (_G, 1.2100000381469727, 1.3310000896453857, 0.9317000508308411)),
    # The factors are rounded to float32 before they multiply: 77 * f32(1.1) = 84.7000046
    # rounds to 84.70000457763672, while 77 * 1.1 in float64 rounds to 84.69999694824219;
    # then f32(0.7) against 0.7 again gives different float32 products.
    Vector("factors_rounded_to_float32_before_multiplying",
           {"init_scale": 77.0, "growth_factor": 1.1, "backoff_factor": 0.7,
            "growth_interval": 1},
           "FI", (84.70000457763672, 59.290000915527344)),
    # Every update rounds the factor first, the first one too: 77 * f32(0.9) rounds to
    # 69.29999542236328, 77 * 0.9 in float64 to 69.30000305175781; the third backoff then
    # tells a float64 factor at every update (56.13300323486328) from one at the first
    # update only, from a scale still held as a float64 (56.132999420166016).
    Vector("backoff_factor_rounded_to_float32_every_update",
           {"init_scale": 77.0, "backoff_factor": 0.9},
           "III", (69.29999542236328, 62.3699951171875, 56.13299560546875)),
    Vector("backoff_below_one", {"init_scale": 2.0}, "IIIF", (1, 0.5, 0.25, 0.25)),
    Vector("growth_factor_one", {"init_scale": 8.0, "growth_factor": 1.0,
                                 "growth_interval": 1}, "FFI", (8, 8, 4)),
    Vector("backoff_factor_one", {"init_scale": 8.0, "backoff_factor": 1.0,
                                  "growth_interval": 2}, "IFIFF", (8, 8, 8, 8, 16)),
    Vector("static_mode", {"init_scale": 1024.0, "growth_interval": 1, "dynamic": False},
           "FIFNF", (1024, 1024, 1024, 1024, 1024)),
    # Bounds are float32 values too: f32(0.1) = 0.10000000149..., f32(0.15) = 0.15000000596...
    Vector("bounds_rounded_to_float32",
           {"init_scale": 0.125, "growth_interval": 1, "min_scale": 0.1, "max_scale": 0.15},
           "IFF", (0.10000000149011612, 0.15000000596046448, 0.15000000596046448)),
    # The same with hysteresis 2: torch runs these configs as tensor ops, not its kernel.
    Vector("growth_overflow_keeps_scale_with_hysteresis",
           {"init_scale": 2.0**127, "growth_interval": 1, "hysteresis": 2},
           "FFIIF", (2.0**127, 2.0**127, 2.0**127, 2.0**126, 2.0**127)),
    Vector("non_power_of_two_factors_with_hysteresis",
           {"init_scale": 1.0, "growth_factor": 1.1, "backoff_factor": 0.7,
            "growth_interval": 1, "hysteresis": 2},
           "FFFII", (_G, 1.2100000381469727, 1.3310000896453857, 1.3310000896453857,
                     0.9317000508308411)),
    # 24-bit mantissas everywhere: the product needs every bit (JAX's exact multiply).
    # (2 - 2**-23)**2 = 4 - 2**-21 + 2**-46 rounds down to 4 - 2**-21, and so on.
    Vector("full_mantissa_operands",
           {"init_scale": 2 - 2.0**-23, "growth_factor": 2 - 2.0**-23,
            "backoff_factor": 1 - 2.0**-24, "growth_interval": 1},
           "FIFI", (4 - 2.0**-21, 4 - 3 * 2.0**-22, 8 - 2.0**-19, 8 - 5 * 2.0**-21)),
    # Subnormal products round to the nearest multiple of 2**-149: 1536 * f32(0.7) =
    # 1075.19998 -> 1075, then 1075 * f32(0.7) = 752.49998 -> 752 (just below a tie).
    Vector("subnormal_products_round_to_nearest",
           {"init_scale": 3 * 2.0**-140, "backoff_factor": 0.7}, "II",
           (1075 * 2.0**-149, 752 * 2.0**-149)),
    # A subnormal product whose 24-bit rounding lands exactly on a tie: only the exact
    # remainder below those 24 bits (positive here) says to round up. 0x1.96b8b6p-126 *
    # 0x1.24e7a6p-3 = (1906091.5 + ~2**-24) * 2**-149, and likewise the second vector.
    Vector("subnormal_tie_broken_by_remainder",
           {"init_scale": float.fromhex("0x1.96b8b6p-126"),
            "backoff_factor": float.fromhex("0x1.24e7a6p-3")}, "I", (1906092 * 2.0**-149,)),
    Vector("subnormal_tie_broken_by_remainder_2",
           {"init_scale": float.fromhex("0x1.33db4ep-126"),
            "backoff_factor": float.fromhex("0x1.4fd42ep-2")}, "I", (3308389 * 2.0**-149,)),
    # Below about 2.94e-39, 1/scale overflows float32: every check finds inf, so a
    # finite step backs off like an inf one (spec.unscale_overflows).
    Vector("reciprocal_overflow_skips_finite_steps",
           {"init_scale": 2.0**-130, "growth_interval": 1}, "FFF",
           (2.0**-131, 2.0**-132, 2.0**-133)),
    Vector("backoff_reaches_zero_and_stays", {"init_scale": 2.0**-148, "growth_interval": 1},
           "IIFF", (2.0**-149, 0.0, 0.0, 0.0)),
    Vector("lowered_interval_grows_next_finite",
           {"init_scale": 1024.0, "growth_interval": 5},
           "FFFFF", (1024, 1024, 1024, 2048, 2048), changes={3: {"growth_interval": 2}}),
)
