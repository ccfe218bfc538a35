"""Where the torch scaler's scale lives, and how ranks agree on found_inf: torch's positional
device, the checks of ``device=`` and ``process_group=`` at construction (each refusal
names the fix), and the all-reduce of an optimizer's found_inf across ranks."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

__all__ = ["DIST_AVAILABLE", "agree_across_ranks", "check_process_group", "device_of",
           "devices", "explicit_device", "split_device", "unusable_device"]

#: torch.distributed is built in (a constant; asked once).
DIST_AVAILABLE = dist.is_available()


def split_device(args: tuple[Any, ...], device: Any) -> tuple[tuple[Any, ...], Any]:
    """Takes torch's first positional parameter, the device, off ``args``.

    ``torch.amp.GradScaler(device, init_scale, growth_factor, backoff_factor,
    growth_interval, enabled)``: after the device, torch's order is the spec's.
    A number first is the spec's ``init_scale``.

    Example:
        >>> split_device(("cpu", 1024.0), None)
        ((1024.0,), 'cpu')
    """
    if not args or not isinstance(args[0], (str, torch.device)):
        return args, device
    first, rest = args[0], args[1:]
    if device is not None:
        raise TypeError(f"device given twice: {first!r} as the first positional argument and "
                        f"device={device!r}; pass it once")
    if isinstance(first, str):
        try:
            torch.device(first)
        except RuntimeError:
            try:
                hint = f"init_scale={float(first)!r}"
            except ValueError:
                hint = "init_scale=65536.0"
            raise ValueError(
                f"{first!r} is not a torch device: the first positional argument is the device "
                "(as in torch.amp.GradScaler(device, init_scale, ...)) or the scale as a number. "
                f"Pass a device such as 'cpu' or 'cuda:0', or a number ({hint})") from None
    return rest, first


def explicit_device(device: str | torch.device | None, enabled: bool) -> torch.device | None:
    """``device=`` as a ``torch.device`` (None: the device of the first tensor scaled).

    Raises:
        RuntimeError: A CUDA device, enabled, on a machine without CUDA.
    """
    explicit = _device(device) if device is not None else None
    if explicit is not None and explicit.type == "cuda" and enabled \
            and not torch.cuda.is_available():
        # torch.amp.GradScaler warns and disables itself here, and the run goes on
        # in float16 with no loss scaling: gradients underflow unnoticed in a log
        # full of warnings. A loud error at construction costs nothing.
        raise RuntimeError(
            f"device={str(explicit)!r} but CUDA is not available: pass device='cpu' or "
            "enabled=False (or leave device out: the scale then lives on the device of "
            "the first tensor scaled)")
    return explicit


def _device(device: Any) -> torch.device:
    if isinstance(device, bool) or not isinstance(device, (str, int, torch.device)):
        raise TypeError(f"device={device!r} ({type(device).__name__}): pass a string such as "
                        "'cpu', 'cuda' or 'cuda:1', or a torch.device")
    try:
        return torch.device(device)
    except RuntimeError as exc:
        # torch's words: a list of twenty device types, or (an int: an accelerator
        # index) "Cannot access accelerator device when none is available".
        cause = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if cause.startswith("Expected one of"):
            cause = "not a device type torch knows"
        if isinstance(device, int):
            cause = ("an int is an index of the current accelerator, "
                     f"{'and there is none' if 'none is available' in cause else cause}")
        raise ValueError(f"device={device!r} is not a device torch can use here ({cause[:160]}"
                         "): pass 'cpu', 'cuda', 'cuda:N' or a torch.device, or leave it out "
                         "(the device of the first tensor scaled)") from None


def unusable_device(explicit: torch.device, exc: BaseException) -> RuntimeError:
    """The error for a device that could not hold the scale (``"cuda:3"`` on a 2-GPU
    machine, an ``"mps"`` torch was not built with), from torch's: its first sentence names
    the cause, the rest can be a dispatcher dump."""
    cause = str(exc).strip().split(". ")[0].splitlines()[0] if str(exc).strip() \
        else type(exc).__name__
    return RuntimeError(f"device={str(explicit)!r} cannot hold the scale ({cause}): "
                        "pass device='cpu' or enabled=False")


def check_process_group(process_group: Any) -> None:
    """Refuses a ``process_group=`` that is not a ``torch.distributed`` group or None."""
    if process_group is not None and not (DIST_AVAILABLE
                                          and isinstance(process_group, dist.ProcessGroup)):
        raise TypeError(f"process_group must be a torch.distributed group "
                        f"(torch.distributed.new_group(ranks)) or None, got "
                        f"{process_group!r}")


def device_of(optimizer: torch.optim.Optimizer) -> torch.device:
    """The device of the optimizer's first parameter (the CPU when it has none)."""
    for group in optimizer.param_groups:
        for param in group["params"]:
            return param.device
    return torch.device("cpu")


def agree_across_ranks(optimizer_state: dict[str, Any], process_group: Any,
                       device: torch.device) -> None:
    """Makes an optimizer's found_inf the maximum over the ranks of ``process_group``
    (None: the world), as one flag on ``device``, the scale's. Called where
    ``torch.distributed`` is initialised; a group of one rank is left as it is."""
    group = process_group or dist.group.WORLD
    if dist.get_world_size(group) == 1:
        return
    found = torch.zeros((), dtype=torch.float32, device=device)
    for value in optimizer_state["found_inf_per_device"].values():
        found += value.to(found.device, non_blocking=True)
    # Every rank joins the collective, also one whose shard has no gradient.
    on_wire = found.cuda() if dist.get_backend(group) == "nccl" else found
    dist.all_reduce(on_wire, op=dist.ReduceOp.MAX, group=group)
    optimizer_state["found_inf_per_device"] = {found.device: on_wire.to(found.device)}


def devices() -> list[str]:
    """``cpu`` and every CUDA device torch sees."""
    return ["cpu"] + [f"cuda:{i}" for i in range(torch.cuda.device_count())]
