"""`compile=true`: which submodules are compiled, in place, for the project's module and one of your own; what is
refused. (Training with it, on both paths and two DDP ranks: tests/optional/reference/test_compare_knobs.py.)"""

from pathlib import Path

import lightning as L
import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from torch import nn

from project.engine.build import CompileNetworks, compile_networks
from project.engine.config import check_config
from project.engine.errors import UserError
from project.engine.upstream import VERSION_BASE
from tests.foreign_modules import RegressionModule
from tests.helpers import CONF_DIR


def compose_train(tmp_path: Path, *overrides: str):
    with initialize_config_dir(str(CONF_DIR), **VERSION_BASE):
        return compose("train", overrides=[*overrides, f"run_dir={tmp_path}"])


def test_the_classifier_compiles_its_network_in_place_and_keeps_its_checkpoint_keys(tmp_path: Path):
    module = instantiate(compose_train(tmp_path, "compile=true").model)
    keys = list(module.state_dict())

    assert compile_networks(module) == ["network"]  # not the loss-and-accuracy metrics
    assert list(module.state_dict()) == keys
    assert module.network._compiled_call_impl is not None
    assert type(module.network).__name__ == "NeuralNetwork"


def test_a_module_of_your_own_has_each_submodule_with_parameters_compiled():
    module = RegressionModule()
    module.unused = nn.ReLU()  # no parameters: nothing to compile
    assert compile_networks(module) == ["layers"]


def test_a_module_whose_parameters_are_not_in_submodules_is_refused_in_one_line():
    class BareParameters(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.zeros(2))

    with pytest.raises(UserError, match="compile=true compiles the submodules .* BareParameters has none"):
        compile_networks(BareParameters())


def test_compile_is_a_switch(tmp_path: Path):
    with pytest.raises(UserError, match="compile must be true or false, got 'yes'"):
        check_config(compose_train(tmp_path, "compile=yes"))


def test_the_compile_switch_compiles_a_modules_networks_as_training_sets_up_and_once_over_fit_and_test(
    monkeypatch: pytest.MonkeyPatch,
):
    module, compiled = RegressionModule(), []
    original = nn.Module.compile
    monkeypatch.setattr(nn.Module, "compile", lambda network: compiled.append(network) or original(network))
    callback = CompileNetworks()
    callback.setup(None, module, "fit")
    assert compiled == [module.layers] and module.layers._compiled_call_impl is not None
    callback.setup(None, module, "test")
    assert compiled == [module.layers], "a test after fit compiles nothing again"
