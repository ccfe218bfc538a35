"""A disabled paddle.amp.GradScaler reports a scale of 1.0, and on a CPU place every one is
disabled.

python/paddle/amp/grad_scaler.py, AmpScaler.__init__: `enable = False` (with a warning) unless
the place is a CUDAPlace, XPUPlace or CustomPlace; `self._init_loss_scaling = 1.0`, set to
init_loss_scaling only `if self._enable`; state_dict() is {} when disabled. On a GPU or XPU
place a GradScaler built enabled scales. The spec's disabled scaler keeps (1024.0, 0, 0).
"""

import warnings

import numpy as np
import paddle

paddle.set_device("cpu")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # "AmpScaler can only be enabled on CUDAPlace, ..."
    on_cpu = paddle.amp.GradScaler(init_loss_scaling=1024.0)
off = paddle.amp.GradScaler(enable=False, init_loss_scaling=1024.0)  # disabled on any place

model = paddle.nn.Linear(2, 1)
optimizer = paddle.optimizer.SGD(learning_rate=0.01, parameters=model.parameters())
loss = model(paddle.ones([1, 2])).sum() * np.float32(np.inf)  # an inf step
for scaler in (on_cpu, off):
    assert scaler.scale(loss) is loss  # passed through, as the spec's disabled scaler does
scaler.scale(loss).backward()
on_cpu.step(optimizer)  # optimizer.step(): the inf gradient is applied
on_cpu.update()
assert not np.isfinite(model.bias.numpy()).all()

spec = 1024.0  # a disabled scaler's state does not move: (1024.0, 0, 0)
scales = [s.get_init_loss_scaling() for s in (on_cpu, off)]
assert not on_cpu.is_enable() and scales == [1.0, 1.0] != [spec, spec], scales
assert on_cpu.state_dict() == {} == off.state_dict()
print(f"paddle.amp.GradScaler(init_loss_scaling=1024.0) on CPU (is_enable() False) and "
      f"enable=False: get_init_loss_scaling() {scales}, state_dict() {{}}; spec {spec!r}")
