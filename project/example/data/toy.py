"""The toy problem of the DDP tutorial: five 2-D training points and two test points, two classes."""

import torch

from project.example.data.in_memory import InMemoryDataModule, InMemoryDataset

TRAIN_INPUTS = torch.tensor([[-1.2, 3.1], [-0.9, 2.9], [-0.5, 2.6], [2.3, -1.1], [2.7, -1.5]])
TRAIN_TARGETS = torch.tensor([0, 0, 0, 1, 1])
TEST_INPUTS = torch.tensor([[-0.8, 2.8], [2.6, -1.6]])
TEST_TARGETS = torch.tensor([0, 1])


class ToyDataModule(InMemoryDataModule):
    """The tutorial's 7 points. With no data to spare, validation reuses the 2 test points.

    Its validation set being its test set, k-fold cross-validation (`data.folds=2`) pools the 5 training points
    alone: fold `data.fold` of them validates, the rest trains, and the 2 test points stay the test set. Class 1 has
    2 training points, so 2 folds is the most it takes.
    """

    class_names = ("0", "1")

    def setup(self, stage: str | None = None) -> None:
        training = InMemoryDataset(TRAIN_INPUTS, TRAIN_TARGETS)
        self.test_set = InMemoryDataset(TEST_INPUTS, TEST_TARGETS)
        if self.folds is None:
            self.train_set, self.val_set = training, self.test_set
        else:
            train_index, val_index = self.fold_indices(training.targets)
            self.train_set, self.val_set = training.subset(train_index), training.subset(val_index)
