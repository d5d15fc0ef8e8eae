"""Datasets and LightningDataModules; the raw reference path uses the same modules and loaders."""

from project.data.in_memory import InMemoryDataModule, InMemoryDataset
from project.data.mnist import MNISTDataModule
from project.data.toy import ToyDataModule

__all__ = ["InMemoryDataModule", "InMemoryDataset", "MNISTDataModule", "ToyDataModule"]
