"""Datasets and LightningDataModules; the raw reference path uses the same modules and loaders."""

from project.example.data.classification import ClassificationDataModule
from project.example.data.in_memory import InMemoryDataModule, InMemoryDataset
from project.example.data.mnist import MNISTDataModule
from project.example.data.toy import ToyDataModule

__all__ = [
    "ClassificationDataModule",
    "InMemoryDataModule",
    "InMemoryDataset",
    "MNISTDataModule",
    "ToyDataModule",
]
