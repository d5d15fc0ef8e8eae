"""Any module's `predict_step` outputs, named, joined over batches, put back in the split's order across ranks and
written as a CSV (project/engine/trained_run.py); the entry point's files are tested in tests/test_predict.py."""

from pathlib import Path

import pytest
import torch

from project.engine.errors import UserError
from project.engine.trained_run import interleave, joined, named, write_table


def test_outputs_are_named_by_their_place_in_what_predict_step_returned():
    scores, labels = torch.zeros(2, 3), torch.zeros(2)
    assert named(scores).keys() == {"output"}
    assert named((scores, labels)).keys() == {"0", "1"}
    assert named([scores]).keys() == {"0"}
    assert named({"scores": scores, 7: labels}).keys() == {"scores", "7"}


@pytest.mark.parametrize(
    ("returned", "named_output"),
    [(None, "'output'"), (torch.tensor(1.0), "'output'"), ({"scores": torch.zeros(2), "note": "x"}, "'note'")],
    ids=["nothing", "a-scalar", "a-string-in-a-dict"],
)
def test_an_output_without_a_row_per_sample_is_refused_naming_it(returned: object, named_output: str):
    with pytest.raises(UserError, match=f"as its output {named_output}: project.predict writes tensors"):
        named(returned)


def test_batches_join_along_the_samples_and_ranks_interleave_back_in_order():
    rank0 = joined([torch.tensor([0.0, 2.0]), torch.tensor([4.0])])
    rank1 = joined([torch.tensor([1.0, 3.0])])
    assert joined([]) == {}
    assert interleave([rank0, rank1])["output"].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]


def test_the_table_has_a_column_per_value_and_none_is_written_for_images(tmp_path: Path):
    table = tmp_path / "predictions.csv"
    assert write_table({"label": torch.tensor([1, 0]), "p": torch.tensor([[0.25, 0.75], [0.5, 0.5]])}, table)
    assert table.read_text().splitlines() == ["index,label,p_0,p_1", "0,1,0.25,0.75", "1,0,0.5,0.5"]
    assert write_table({"p": torch.tensor([[0.25, 0.75], [0.5, 0.5], [1.0, 0.0]])}, table)
    assert table.read_text().splitlines()[0] == "index,p_0,p_1", "a column per value, not per sample"
    assert not write_table({"image": torch.zeros(2, 1, 2, 2)}, tmp_path / "images.csv")
    assert not write_table({"sequence": torch.zeros(2, 3, 4)}, tmp_path / "images.csv"), "a value per step: no cell"
    assert not write_table({}, tmp_path / "nothing.csv")
    assert not (tmp_path / "images.csv").exists()


def test_an_output_with_no_value_per_sample_adds_no_column(tmp_path: Path):
    """A column is a value of every row: an output of shape (samples, 0) has none."""
    table = tmp_path / "predictions.csv"
    assert write_table({"label": torch.tensor([1, 0]), "nothing": torch.zeros(2, 0)}, table)
    assert table.read_text().splitlines() == ["index,label", "0,1", "1,0"]


def test_outputs_of_different_numbers_of_samples_are_no_table(tmp_path: Path):
    """A row per sample: outputs that disagree on how many samples there were fail, rather than lose rows."""
    with pytest.raises(ValueError):
        write_table({"label": torch.tensor([1, 0, 1]), "p": torch.tensor([0.5, 0.5])}, tmp_path / "predictions.csv")


def test_batches_whose_outputs_are_named_otherwise_are_refused_in_one_line():
    """A column per output over every batch: one batch's extra or missing output has no place in it."""
    with pytest.raises(UserError) as refused:
        joined([{"label": torch.tensor([1]), "p": torch.tensor([0.5])}, {"label": torch.tensor([0])}])
    assert str(refused.value) == (
        "predict_step returned outputs ['label', 'p'] for batch 0 and ['label'] for batch 1: project.predict joins "
        "each output over the batches, so return the same outputs for every batch"
    )
    reordered = joined(
        [
            {"label": torch.tensor([1]), "p": torch.tensor([0.5])},
            {"p": torch.tensor([0.25]), "label": torch.tensor([0])},
        ]
    )
    assert reordered["p"].tolist() == [0.5, 0.25], "the same outputs in another order are the same outputs"
