"""What the torch scaler's ``update()`` takes as a flag, and the checks a flag joins.

A flag is what ``unscale`` returns (a 0-d bool tensor) or a bool; it counts as one more
check, after ``step()`` too. A plain number first is torch's positional ``new_scale``; a
float tensor or a list first is refused before anything changes. ``unscale_grads_`` keeps
one flag per device of a model split over devices.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from imperative_misuse_checks import (
    check_a_flag_of_another_framework_is_refused,
    check_a_flag_stands_for_the_unscale_checks_it_was_made_from,
    check_a_non_bool_flag_is_refused,
    check_new_scale_positional_number_or_keyword_tensor,
)

from unifiedamp.backends.torch import TorchGradScaler
from unifiedamp.backends.torch._compat import unscale_grads_


@pytest.mark.parametrize("flag", [lambda f: f.float(), lambda f: f.int(),
                                  lambda f: f.reshape(1).float(), lambda f: [True, False]],
                         ids=["float", "int", "1-element-float", "list"])
def test_a_non_bool_flag_is_refused_and_changes_nothing(flag):
    check_a_non_bool_flag_is_refused(TorchGradScaler(1024.0, device="cpu"),
                                     [torch.tensor([1.0, float("inf")])], flag)


def test_new_scale_stays_torchs_positional_number_or_a_keyword_tensor():
    check_new_scale_positional_number_or_keyword_tensor(TorchGradScaler(1024.0, device="cpu"),
                                                        torch.tensor(64.0))


def test_a_flag_of_another_framework_is_refused():
    check_a_flag_of_another_framework_is_refused(TorchGradScaler(1024.0, device="cpu"),
                                                 [torch.ones(1)], r"torch\.as_tensor")


@pytest.mark.parametrize("x, loss_finite, skipped", [([1.0, 2.0], False, True),
                                                      ([1.0, float("inf")], True, True),
                                                      ([1.0, 2.0], True, False)])
def test_a_flag_after_step_counts_as_one_more_check(x, loss_finite, skipped):
    # The docs' loop with the loss's own check: step() checks the gradients, the flag
    # passed to update() (the loss was finite, or not) is one more check.
    scaler = TorchGradScaler(1024.0, device="cpu")
    param = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([param], lr=0.5)
    loss = (param * torch.tensor(x)).sum()
    scaler.scale(loss).backward()
    scaler.step(opt)
    observed = loss.detach() if loss_finite else torch.tensor(float("nan"))
    scaler.update(torch.isfinite(observed))
    assert scaler.last_step_skipped is skipped
    assert (scaler.get_scale(), scaler.num_skipped_steps) == ((512.0, 1) if skipped else
                                                              (1024.0, 0))
    # step() decided from the gradients alone: the flag comes after it, for the scale.
    stepped = all(map(math.isfinite, x))
    assert torch.equal(param.detach(), torch.tensor([0.5, 0.0]) if stepped else torch.ones(2))


@pytest.mark.parametrize("flag", [np.bool_(True), np.bool_(False), torch.tensor(False)])
def test_where_finite_takes_numpy_bools_and_bool_tensors(flag):
    scaler = TorchGradScaler(device="cpu")
    new, old = [torch.ones(2)], [torch.zeros(2)]
    out = scaler.where_finite(flag, new, old)
    assert torch.equal(out[0], new[0] if bool(flag) else old[0])


@pytest.mark.parametrize("order", [("cpu", "meta"), ("meta", "cpu")])
def test_unscale_grads_gives_each_device_its_own_flag(order):
    # A model split over two devices. This machine has one real device: the second is
    # torch's "meta" device (shapes only), enough to see which device each flag is on.
    params = []
    for device in order:
        param = torch.nn.Parameter(torch.ones(2, device=device))
        param.grad = (torch.tensor([4.0, float("inf")]) if device == "cpu"
                      else torch.ones(2, device=device))
        params.append(param)
    found_inf = torch.zeros(())
    founds = unscale_grads_(TorchGradScaler(device="cpu"), torch.optim.SGD(params),
                            torch.tensor(0.25), found_inf, False)
    assert set(founds) == {torch.device("cpu"), torch.device("meta")}
    for device, found in founds.items():
        assert found.device == device
    assert founds[torch.device("cpu")].item() == 1.0
    assert founds[torch.device("cpu")] is found_inf
    assert params[order.index("cpu")].grad[0].item() == 1.0


def test_a_flag_stands_for_the_unscale_checks_it_was_made_from():
    check_a_flag_stands_for_the_unscale_checks_it_was_made_from(
        TorchGradScaler(1024.0, growth_interval=1, device="cpu"),
        [torch.tensor([float("inf")])], [torch.ones(1)], lambda a, b: a & b)
