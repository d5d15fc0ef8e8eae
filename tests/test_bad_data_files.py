"""Damaged MNIST files end in one `error:` line that names the file and the fix, and leave nothing behind.

Each case starts from a valid dataset (tests/idx_files.py) and damages one file: the `.gz` itself, the IDX data
inside it, or the unpacked IDX file. Most run in process through `exit_on_user_error`, as the entry points report
errors; a few run `python -m project.train` to prove the one-line exit end to end.
"""

import gzip
import os
import random
import struct
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from project.engine.errors import exit_on_user_error
from project.example.data import MNISTDataModule
from tests.helpers import mnist_overrides, run_module
from tests.idx_files import make_images, write_idx_dataset

TRAIN_IMAGES, TRAIN_LABELS = "train-images-idx3-ubyte", "train-labels-idx1-ubyte"
TEST_IMAGES, TEST_LABELS = "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"
NOISE = random.Random(0).randbytes(3000)  # starts with 0xcd072cd8: neither gzip's nor IDX's magic number


def set_magic(magic: int) -> Callable[[bytes], bytes]:
    return lambda data: struct.pack(">I", magic) + data[4:]


def set_byte(data: bytes, offset: int, value: int) -> bytes:
    return data[:offset] + bytes([value]) + data[offset + 1 :]


# id → (where the damage is, the file, how its bytes change, what the error says). Where: "gz" changes the .gz file's
# own bytes, "gz data" the IDX data packed in it, "unpacked" the IDX file left in place of its .gz.
CASES = {
    "truncated-gz": (
        "gz",
        TRAIN_IMAGES,
        lambda data: data[: len(data) // 2],
        "is cut short: its gzip stream ends early",
    ),
    "random-bytes-gz": ("gz", TRAIN_LABELS, lambda data: NOISE, "is not a valid gzip file (Not a gzipped file"),
    "zero-byte-gz": ("gz", TEST_LABELS, lambda data: b"", "is empty"),
    "images-magic-gz": (
        "gz data",
        TRAIN_IMAGES,
        set_magic(0x801),
        "is not a file of IDX images: it starts with 0x00000801, not 0x00000803",
    ),
    "labels-magic-gz": (
        "gz data",
        TEST_LABELS,
        set_magic(0x12345678),
        "is not a file of IDX labels: it starts with 0x12345678, not 0x00000801",
    ),
    "short-body-gz": (
        "gz data",
        TEST_IMAGES,
        lambda data: data[:-800],
        "holds 77616 bytes but its header promises 100 images (78416 bytes): it is cut short",
    ),
    "zero-byte": ("unpacked", TRAIN_IMAGES, lambda data: b"", "is empty"),
    "random-bytes": (
        "unpacked",
        TRAIN_LABELS,
        lambda data: NOISE,
        "is not a file of IDX labels: it starts with 0xcd072cd8, not 0x00000801",
    ),
    "labels-magic": (
        "unpacked",
        TRAIN_LABELS,
        set_magic(0x803),
        "is not a file of IDX labels: it starts with 0x00000803, not 0x00000801",
    ),
    "short-body": (
        "unpacked",
        TRAIN_IMAGES,
        lambda data: data[:-800],
        "holds 312816 bytes but its header promises 400 images (313616 bytes): it is cut short",
    ),
    "short-header": (
        "unpacked",
        TEST_LABELS,
        lambda data: data[:5],
        "holds 5 bytes, fewer than the 8-byte header of IDX labels",
    ),
    "extra-bytes": (
        "unpacked",
        TEST_LABELS,
        lambda data: data + bytes(5),
        "holds 113 bytes but its header promises 100 labels (108 bytes): it has extra bytes at its end",
    ),
    "images-not-28x28": (
        "unpacked",
        TEST_IMAGES,
        lambda data: data[:8] + struct.pack(">II", 14, 56) + data[16:],
        "holds 14×56 images, not 28×28",
    ),
    "label-outside-the-classes-gz": (
        "gz data",
        TRAIN_LABELS,
        lambda data: set_byte(data, 8 + 42, 12),
        "holds the label 12 at index 42, but the labels are 0 to 9",
    ),
    "label-outside-the-classes": (
        "unpacked",
        TEST_LABELS,
        lambda data: set_byte(data, 8 + 99, 255),
        "holds the label 255 at index 99, but the labels are 0 to 9",
    ),
    "counts-differ": (
        "unpacked",
        TRAIN_LABELS,
        lambda data: struct.pack(">II", 0x801, 399) + data[8:-1],
        f"{TRAIN_IMAGES} holds 400 images but {TRAIN_LABELS} holds 399 labels",
    ),
}
CASE_ARGS = ("where", "name", "change", "says")


def cases(*ids: str) -> list:
    """The cases `ids` (default: all) as pytest parameters."""
    return [pytest.param(*CASES[case_id], id=case_id) for case_id in ids or CASES]


GZ_CASES = [case_id for case_id, (where, *_) in CASES.items() if where != "unpacked"]


def damage(raw_dir: Path, where: str, name: str, change: Callable[[bytes], bytes]) -> str:
    """Damage one file of the valid dataset in `raw_dir` as a case says; return the damaged file's name."""
    packed = raw_dir / f"{name}.gz"
    if where == "gz":
        packed.write_bytes(change(packed.read_bytes()))
        return packed.name
    data = change(gzip.decompress(packed.read_bytes()))
    if where == "gz data":
        packed.write_bytes(gzip.compress(data))
        return packed.name
    packed.unlink()
    (raw_dir / name).write_bytes(data)
    return name


def exit_of_loading(root: Path, capsys: pytest.CaptureFixture) -> tuple[int, str]:
    """Load the data as the entry points do, where a `UserError` becomes an `error:` line; the exit code and stderr."""

    @exit_on_user_error
    def load() -> None:
        MNISTDataModule("mnist", str(root), batch_size=32, seed=0, val_size=50, download=False).setup("fit")

    with pytest.raises(SystemExit) as exit_info:
        load()
    return exit_info.value.code, capsys.readouterr().err


def assert_one_line_error(code: int, stderr: str, file_name: str, says: str, root: Path) -> None:
    assert code == 2
    assert "Traceback" not in stderr
    last_line = stderr.strip().splitlines()[-1]
    assert last_line.startswith("error: ")
    assert f"{file_name} " in last_line, "the damaged file by its own name (a .gz is not its unpacked file)"
    assert says in last_line
    assert "intact cop" in last_line, "the fix"
    assert not list(root.rglob("*.partial"))


@pytest.fixture
def read_only(monkeypatch: pytest.MonkeyPatch):
    """Make a dir read-only (mode 555). Root may write there anyway, so for root `os.access` is made to answer as it
    does for any other user: the code must then not write there, which the tests check by listing the dir."""
    made = []

    def make(directory: Path) -> None:
        directory.chmod(0o555)
        made.append(directory)
        if os.access(directory, os.W_OK):
            real_access = os.access

            def access(path, mode, **kwargs) -> bool:
                if Path(path) == directory and mode & os.W_OK:
                    return False
                return real_access(path, mode, **kwargs)

            monkeypatch.setattr(os, "access", access)

    yield make
    for directory in made:
        directory.chmod(0o755)


@pytest.fixture
def scratch_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A dir of its own for the test's temporary files, to see that none is left."""
    root = tmp_path / "tmp"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    return root


@pytest.mark.parametrize(CASE_ARGS, cases())
def test_damaged_file_ends_in_one_error_line_naming_it(tmp_path, capsys, where, name, change, says):
    raw_dir = write_idx_dataset(tmp_path)
    damaged_name = damage(raw_dir, where, name, change)
    code, stderr = exit_of_loading(tmp_path, capsys)
    assert_one_line_error(code, stderr, damaged_name, says, tmp_path)
    if damaged_name.endswith(".gz"):
        assert not (raw_dir / name).exists(), "a damaged .gz leaves no unpacked file to be blamed on the next run"


@pytest.mark.parametrize(CASE_ARGS, cases(*GZ_CASES))
def test_damaged_gz_in_a_read_only_dir_ends_in_one_error_line_and_leaves_nothing(
    tmp_path, capsys, read_only, scratch_root, where, name, change, says
):
    raw_dir = write_idx_dataset(tmp_path)
    damaged_name = damage(raw_dir, where, name, change)
    listing = sorted(raw_dir.iterdir())
    read_only(raw_dir)
    code, stderr = exit_of_loading(tmp_path, capsys)
    assert_one_line_error(code, stderr, damaged_name, says, tmp_path)
    assert sorted(raw_dir.iterdir()) == listing
    assert list(scratch_root.iterdir()) == []


def test_read_only_dir_of_gz_files_is_read_through_a_temporary_copy(tmp_path, read_only, scratch_root):
    raw_dir = write_idx_dataset(tmp_path)
    listing = sorted(raw_dir.iterdir())
    read_only(raw_dir)
    datamodule = MNISTDataModule("mnist", str(tmp_path), batch_size=32, seed=0, val_size=50, download=False)
    datamodule.setup("fit")
    images, labels = make_images(100, seed=2)  # the test split write_idx_dataset wrote
    assert torch.equal(datamodule.test_set.targets, labels.long())
    assert torch.allclose(datamodule.test_set[:][0][:, 0], (images.float() / 255 - 0.1307) / 0.3081)
    assert len(datamodule.train_set) == 350 and len(datamodule.val_set) == 50
    assert sorted(raw_dir.iterdir()) == listing, "nothing unpacked into the read-only dir"
    assert list(scratch_root.iterdir()) == [], "the temporary copy is removed once read"


def test_gz_files_are_unpacked_beside_themselves_and_nothing_else_is_left(tmp_path, scratch_root):
    raw_dir = write_idx_dataset(tmp_path)
    MNISTDataModule("mnist", str(tmp_path), batch_size=32, seed=0, val_size=50, download=False).setup("fit")
    names = [TRAIN_IMAGES, TRAIN_LABELS, TEST_IMAGES, TEST_LABELS]
    assert sorted(path.name for path in raw_dir.iterdir()) == sorted(names + [f"{name}.gz" for name in names])
    assert list(scratch_root.iterdir()) == []


@pytest.mark.slow
@pytest.mark.parametrize(
    CASE_ARGS, cases("truncated-gz", "short-body", "counts-differ", "label-outside-the-classes-gz")
)
def test_training_on_a_damaged_file_exits_2_with_one_error_line_and_no_checkpoint(tmp_path, where, name, change, says):
    raw_dir = write_idx_dataset(tmp_path / "data")
    damaged_name = damage(raw_dir, where, name, change)
    run_dir = tmp_path / "run"
    result = run_module(
        "project.train",
        *mnist_overrides(tmp_path / "data", "trainer.max_epochs=1", f"hydra.run.dir={run_dir}"),
        cwd=tmp_path,
    )
    assert_one_line_error(result.returncode, result.stderr, damaged_name, says, tmp_path)
    assert (run_dir / ".hydra").is_dir(), "the run started in this run dir"
    assert list((run_dir / "checkpoints").glob("*")) == []
