"""The canonical parameter names, in order: the vocabulary every module of the spec shares."""

__all__ = ["CANONICAL", "POSITIONAL"]

CANONICAL = (
    "init_scale",
    "growth_factor",
    "backoff_factor",
    "growth_interval",
    "enabled",
    "hysteresis",
    "min_scale",
    "max_scale",
    "dynamic",
)
#: The parameters that may be given positionally, in ``torch.amp.GradScaler``'s order.
POSITIONAL = CANONICAL[:5]
