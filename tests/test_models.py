import torch
from torch import nn

from project.example.networks import ConvolutionalNetwork, DeepNeuralNetwork, NeuralNetwork


def test_toy_network_is_2_30_20_2_with_relu():
    network = NeuralNetwork(num_inputs=2, num_outputs=2)
    linears = [m for m in network.modules() if isinstance(m, nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(2, 30), (30, 20), (20, 2)]
    assert sum(isinstance(m, nn.ReLU) for m in network.modules()) == 2
    assert network(torch.zeros(5, 2)).shape == (5, 2)


def test_deep_network_layers_follow_the_tutorial():
    network = DeepNeuralNetwork(num_layers=4, input_features=784, num_hidden_features=128, num_classes=10)
    shapes = [(layer.in_features, layer.out_features) for layer in network.layers]
    assert shapes == [(784, 128), (128, 128), (128, 128), (128, 10)]


def test_deep_network_takes_images_and_ends_without_relu():
    torch.manual_seed(0)
    network = DeepNeuralNetwork(4, 784, 128, 10)
    images = torch.randn(3, 1, 28, 28)
    logits = network(images)
    assert logits.shape == (3, 10)
    assert torch.equal(logits, network(images.flatten(1)))
    assert (logits < 0).any(), "a ReLU after the last layer would make every logit >= 0"


def test_deep_network_refuses_fewer_than_two_layers():
    try:
        DeepNeuralNetwork(1, 784, 128, 10)
    except ValueError as error:
        assert "num_layers >= 2" in str(error)
    else:
        raise AssertionError("num_layers=1 was accepted")


def test_convolutional_network_maps_images_to_class_logits():
    network = ConvolutionalNetwork(in_channels=1, num_classes=10, channels=16)
    convolutions = [m for m in network.modules() if isinstance(m, nn.Conv2d)]
    assert [(m.in_channels, m.out_channels) for m in convolutions] == [(1, 16), (16, 32)]
    assert network.classifier.in_features == 32 * 7 * 7
    assert network(torch.zeros(3, 1, 28, 28)).shape == (3, 10)


def test_convolutional_network_refuses_a_size_it_cannot_pool_twice():
    try:
        ConvolutionalNetwork(1, 10, image_size=30)
    except ValueError as error:
        assert "multiple of 4" in str(error)
    else:
        raise AssertionError("image_size=30 was accepted")
