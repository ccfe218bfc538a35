"""``unifiedamp port-state`` on torch: the torch form is the torch backend's native state dict
and torch loads it; a Lightning checkpoint's entry is rewritten for the other scaler and back,
and resumed by Lightning; untrusted and damaged ``.pt`` and ``.ckpt`` files (torch.save's
format) are refused. The framework-free checks: tests/core/test_port_state.py."""

from __future__ import annotations

import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from port_state_files import (  # noqa: E402
    PLAIN,
    STATE,
    canonical,
    check_checksum_refused,
    check_damaged_refused,
    check_no_code_runs_unless_trusted,
    tensor_file,
)
from torch_helpers import lightning_fit  # noqa: E402

import unifiedamp as ua  # noqa: E402
from unifiedamp.porting import convert_state, load_file, port_state_file  # noqa: E402
from unifiedamp.spec import ScalerConfig  # noqa: E402


def test_torch_form_is_the_torch_backends_native_state_dict_and_torch_loads_it():
    ours = ua.GradScaler(**PLAIN.to_dict(), backend="torch")
    ours.load_state_dict(canonical())
    assert convert_state(canonical(), "torch") == ours.native_state_dict()
    native = torch.amp.GradScaler("cpu")
    native.load_state_dict(convert_state(canonical(), "torch"))
    assert (native.get_scale(), native._get_growth_tracker()) == (STATE.scale, 2)


# ================================================================ Lightning




@pytest.mark.filterwarnings("ignore:You're resuming from a checkpoint")
def test_lightning_ckpt_entry_is_rewritten_for_the_other_scaler_and_back(tmp_path):
    ckpt = tmp_path / "ours.ckpt"
    # hysteresis 2: torch.amp.GradScaler cannot load what our scaler writes for this config.
    ours = ua.GradScaler(1024.0, growth_interval=2, hysteresis=2, backend="torch")
    lightning_fit(ours, 5, ckpt_out=ckpt)
    raw = torch.load(ckpt, weights_only=True)
    assert raw["MixedPrecision"]["format"] == "unifiedamp.GradScaler"
    with pytest.raises(ValueError, match="the torch form cannot carry hysteresis=2"):
        port_state_file(ckpt, to="torch", in_place=True)

    ours = ua.GradScaler(1024.0, growth_interval=2, backend="torch")
    lightning_fit(ours, 5, ckpt_out=ckpt)
    raw = torch.load(ckpt, weights_only=True)
    report = port_state_file(ckpt, to="torch", in_place=True)
    assert report["key"] == "MixedPrecision" and report["whole"]
    rewritten = torch.load(ckpt, weights_only=True)
    assert "format" not in rewritten["MixedPrecision"]  # torch's own dict now
    assert rewritten["global_step"] == raw["global_step"]
    assert all(torch.equal(rewritten["state_dict"][k], v) for k, v in raw["state_dict"].items())
    start, native = lightning_fit(torch.amp.GradScaler("cpu"), 7, ckpt_in=ckpt)
    assert start == (ours.get_scale(), ours.state.growth_tracker)

    native_ckpt = tmp_path / "native.ckpt"
    lightning_fit(torch.amp.GradScaler("cpu", 256.0, growth_interval=3), 5, ckpt_out=native_ckpt)
    out = tmp_path / "canonical.ckpt"
    cli = subprocess.run([sys.executable, "-m", "unifiedamp.cli", "port-state", str(native_ckpt),
                          "--to", "canonical", "-o", str(out), "--config",
                          '{"init_scale": 256.0}'], capture_output=True, text=True)
    assert cli.returncode == 0, cli.stderr
    assert "entry 'MixedPrecision', torch form" in cli.stdout
    entry = torch.load(out, weights_only=True)["MixedPrecision"]
    assert entry["config"]["init_scale"] == 256.0 and entry["config"]["growth_interval"] == 3
    start, ours = lightning_fit(ua.GradScaler(backend="torch"), 7, ckpt_in=out)
    assert ours.config == ScalerConfig(256.0, growth_interval=3)
    assert start == (entry["scale"], entry["growth_tracker"])


# ================================================================ untrusted files


@pytest.mark.parametrize("name", ["a.pt", "b.ckpt"])
def test_no_checkpoint_runs_code_unless_the_user_trusts_it(tmp_path, name):
    check_no_code_runs_unless_trusted(tmp_path, name)


@pytest.mark.parametrize("name,member", [("w.pt", "data/0"), ("w.ckpt", "data/0")])
def test_a_checkpoint_whose_data_fails_its_own_checksum_is_refused(tmp_path, name, member):
    check_checksum_refused(tmp_path, name, member)


@pytest.mark.parametrize("ext", [".pt", ".ckpt"])
def test_an_empty_truncated_or_foreign_file_is_refused_naming_it(tmp_path, ext):
    check_damaged_refused(tmp_path, ext)


def test_a_torch_file_with_a_damaged_pickle_is_refused_without_suggesting_trust(tmp_path):
    # A zip whose members match their checksums but whose pickle is not one: torch's
    # weights_only reader fails on it as it does on a refused object.
    import zipfile

    tensor_file(tmp_path / "whole.pt")
    path = tmp_path / "bad.pt"
    with zipfile.ZipFile(tmp_path / "whole.pt") as whole, zipfile.ZipFile(path, "w") as out:
        for info in whole.infolist():
            data = whole.read(info.filename)
            out.writestr(info, b"\x80\x02}q\x00\xff\xff" if info.filename.endswith(
                "data.pkl") else data)
    with pytest.raises(ValueError, match="cannot be read as a torch.save file") as info:
        load_file(path)
    assert "trust" not in str(info.value)
