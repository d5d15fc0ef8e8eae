"""Which submodules `trainer=fsdp` makes units (`project.optional.fsdp.units`), on models written elsewhere: whole
blocks by default, never a module its parent reads without calling, never a parameter split from its twin."""

from pathlib import Path

import pytest
import torch
import torchvision
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule

from project.engine.build import networks_of
from project.engine.errors import UserError
from project.example.networks import DeepNeuralNetwork, NeuralNetwork
from project.optional.fsdp.strategy import mixed_precision_policy, shard_module, units_read_where_called
from project.optional.fsdp.units import UnitChoice, network_units
from tests.helpers import one_rank_process_group, requires
from tests.optional.fsdp.transformer_modules import GPT, EncoderClassifier, TiedLanguageModel, TorchTransformerLM

pytestmark = requires("fsdp")

DEFAULT = UnitChoice(None, 100_000)  # conf/trainer/fsdp.yaml's
LINEAR = UnitChoice((nn.Linear,), 0)


def test_the_default_units_are_whole_transformer_layers_and_repeated_blocks():
    assert DEFAULT.of(TorchTransformerLM(), set()) == [
        "transformer.decoder.layers.1",
        "transformer.decoder.layers.0",
        "transformer.encoder.layers.1",
        "transformer.encoder.layers.0",
    ]
    assert DEFAULT.of(EncoderClassifier(), set()) == ["encoder.layers.1", "encoder.layers.0"]
    assert DEFAULT.of(GPT(), set()) == ["blocks.1", "blocks.0"], "its blocks, not the Linear layers inside them"
    stages = DEFAULT.of(torchvision.models.resnet18(), set())
    assert stages == ["layer4.1", "layer4.0", "layer3.1", "layer3.0", "layer2.1", "layer2.0"], "layer1's are small"


def test_a_block_below_the_size_floor_stays_in_the_unit_around_it():
    assert DEFAULT.of(NeuralNetwork(2, 2), set()) == []
    assert DEFAULT.of(DeepNeuralNetwork(4, 784, 128, 10), set()) == ["layers.0"], "784 × 128 + 128 parameters"
    assert UnitChoice(None, 0).of(DeepNeuralNetwork(4, 784, 128, 10), set()) == [f"layers.{i}" for i in (3, 2, 1, 0)]
    assert UnitChoice(None, 10**9).of(GPT(), set()) == []


def test_multihead_attentions_out_proj_is_never_a_unit_of_its_own_by_default():
    for model in (TorchTransformerLM(), EncoderClassifier()):
        units = UnitChoice(None, 0).of(model, set())
        assert units and not any("out_proj" in name or "self_attn" in name for name in units)


def test_a_tied_weight_keeps_its_two_holders_in_one_unit_or_is_refused():
    assert DEFAULT.of(GPT(tie=True), set()) == ["blocks.1", "blocks.0"], "head and embed stay in the root unit"
    assert "head" in LINEAR.of(GPT(), set())
    with pytest.raises(UserError, match=r"makes head \(Linear\) an FSDP unit .* head.weight is also embed.weight"):
        LINEAR.of(GPT(tie=True), set())


def test_a_block_used_at_two_places_is_no_unit_of_its_own():
    shared = nn.Linear(512, 512)
    model = nn.Sequential(shared, nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), shared)
    assert UnitChoice(None, 0).of(model, set()) == ["2"]


def test_networks_of_a_lightning_module_that_share_a_parameter_stay_in_its_root_unit_and_stay_tied(tmp_path: Path):
    """A GPT written into its LightningModule: its networks `embed` and `head` share the output layer's weight, and
    its blocks' `ModuleList` has no forward; the LightningModule's root unit holds what they leave over."""
    module = TiedLanguageModel()
    assert network_units(module, list(networks_of(module))) == ["position", "norm"]
    with one_rank_process_group(tmp_path):
        shard_module(module, DEFAULT, init_device_mesh("cpu", (1,)), mixed_precision_policy("32-true"))
        assert isinstance(module, FSDPModule), "the root unit"
        assert not isinstance(module.embed, FSDPModule) and not isinstance(module.head, FSDPModule)
        assert module.head.weight is module.embed.weight
        assert {name for name, parameter in module.named_parameters() if parameter is module.embed.weight} == {
            "embed.weight"
        }, "one parameter, the root unit's"


def test_a_weight_read_without_its_unit_being_called_is_one_line_naming_layer_classes(tmp_path: Path):
    torch.manual_seed(0)
    module = nn.Module()
    module.network = EncoderClassifier()
    tokens = torch.randint(32, (2, 8))
    with one_rank_process_group(tmp_path):
        mesh = init_device_mesh("cpu", (1,))
        shard_module(module, LINEAR, mesh, mixed_precision_policy("32-true"))
        assert isinstance(module.network.encoder.layers[0].self_attn.out_proj, FSDPModule)
        one_line = r"got mixed torch.Tensor and DTensor\)\. Set trainer.strategy.layer_classes"
        with pytest.raises(UserError, match=one_line), units_read_where_called():
            module.network(tokens)


def test_a_network_reached_by_two_names_is_no_parameter_shared_between_two_networks():
    """An alias (`self.backbone = self.model.backbone`) is one module: sharded once, nothing split."""
    module = nn.Module()
    module.model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))
    module.backbone = module.model[0]
    assert UnitChoice(None, 0).of(module, ["model", "backbone"]) == ["model.2"], "the aliased layer stays in a root"

    gpt = GPT()
    gpt.trunk = gpt.blocks  # an alias of the blocks' parent: each block is still attached once
    assert DEFAULT.of(gpt, set()) == ["blocks.1", "blocks.0"]
