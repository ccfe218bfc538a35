"""What the paddle scaler's ``update()`` takes as a flag, and the checks a flag joins.

A flag is what ``unscale`` returns (a 0-d bool tensor) or a bool; it counts as one more
check, after ``step()`` too. A plain number first is torch's positional ``new_scale``; a
float tensor or a list first is refused before anything changes.
"""

from __future__ import annotations

import numpy as np
import paddle
import pytest
from imperative_misuse_checks import (
    check_a_flag_of_another_framework_is_refused,
    check_a_flag_stands_for_the_unscale_checks_it_was_made_from,
    check_a_non_bool_flag_is_refused,
    check_new_scale_positional_number_or_keyword_tensor,
)

from unifiedamp.backends.paddle import PaddleGradScaler


@pytest.mark.parametrize("flag", [lambda f: f.astype("float32"), lambda f: f.astype("int32"),
                                  lambda f: f.reshape([1]).astype("float32"),
                                  lambda f: [True, False]],
                         ids=["float", "int", "1-element-float", "list"])
def test_a_non_bool_flag_is_refused_and_changes_nothing(flag):
    check_a_non_bool_flag_is_refused(PaddleGradScaler(1024.0),
                                     [paddle.to_tensor([1.0, float("inf")])], flag)


def test_new_scale_stays_torchs_positional_number_or_a_keyword_tensor():
    check_new_scale_positional_number_or_keyword_tensor(PaddleGradScaler(1024.0),
                                                        paddle.to_tensor(64.0))


def test_a_flag_of_another_framework_is_refused():
    check_a_flag_of_another_framework_is_refused(PaddleGradScaler(1024.0),
                                                 [paddle.ones([1])], r"paddle\.to_tensor")


@pytest.mark.parametrize("x, loss_finite, skipped", [([1.0, 2.0], False, True),
                                                      ([1.0, float("inf")], True, True),
                                                      ([1.0, 2.0], True, False)])
def test_a_flag_after_step_counts_as_one_more_check(x, loss_finite, skipped):
    scaler = PaddleGradScaler(1024.0)
    param = paddle.create_parameter([2], "float32",
                                    default_initializer=paddle.nn.initializer.Constant(1.0))
    opt = paddle.optimizer.SGD(learning_rate=0.5, parameters=[param])
    loss = (param * paddle.to_tensor(x)).sum()
    scaler.scale(loss).backward()
    scaler.step(opt)
    observed = loss.detach() if loss_finite else paddle.to_tensor(float("nan"))
    scaler.update(paddle.isfinite(observed))
    assert scaler.last_step_skipped is skipped
    assert (scaler.get_scale(), scaler.num_skipped_steps) == ((512.0, 1) if skipped else
                                                              (1024.0, 0))


@pytest.mark.parametrize("flag", [np.bool_(True), np.bool_(False), False])
def test_where_finite_takes_numpy_and_python_bools(flag):
    scaler = PaddleGradScaler()
    new, old = [paddle.ones([2])], [paddle.zeros([2])]
    out = scaler.where_finite(flag, new, old)
    assert out[0] is (new[0] if bool(flag) else old[0])


def test_a_flag_stands_for_the_unscale_checks_it_was_made_from():
    check_a_flag_stands_for_the_unscale_checks_it_was_made_from(
        PaddleGradScaler(1024.0, growth_interval=1), [paddle.to_tensor([float("inf")])],
        [paddle.ones([1])], paddle.logical_and)
