"""Datasets and LightningDataModules; the raw reference path uses the same modules and loaders."""

from project.data.datamodule import ClassificationDataModule
from project.data.image_folder import ImageFolderDataModule
from project.data.in_memory import InMemoryDataModule, InMemoryDataset
from project.data.mnist import MNISTDataModule
from project.data.toy import ToyDataModule

__all__ = [
    "ClassificationDataModule",
    "ImageFolderDataModule",
    "InMemoryDataModule",
    "InMemoryDataset",
    "MNISTDataModule",
    "ToyDataModule",
]
