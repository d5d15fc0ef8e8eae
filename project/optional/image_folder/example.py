"""Writes an image-folder dataset to try `data=image_folder` on, offline:

    python -m project.optional.image_folder.example data/example_images [--per-class N] [--fashion-mnist-root data]

Without `--fashion-mnist-root`: four classes of 28×28 grey PNGs (bars across, bars down, a diagonal, a ring), each
drawn at a random offset with random noise by a seeded generator, so the same command writes the same files. With
`--fashion-mnist-root <data.root of data=fashion_mnist>`: the first N images of each of Fashion-MNIST's ten classes,
from its training files (train/ and val/) and its test files (test/). Either way: N training images per class and
N // 4 for validation and for test, in `<root>/{train,val,test}/<class>/<n>.png`.
"""

import argparse
from pathlib import Path

import torch
from PIL import Image
from torch import Tensor

from project.example.data.mnist import MNISTDataModule

SIZE = 28
SHAPES = ("across", "down", "diagonal", "ring")


def shape_image(shape: str, generator: torch.Generator) -> Tensor:
    """One grey `[1, 28, 28]` uint8 image of `shape`, shifted by up to 3 pixels, with noise."""
    rows, columns = torch.meshgrid(torch.arange(SIZE), torch.arange(SIZE), indexing="ij")
    dy, dx = (torch.randint(-3, 4, (2,), generator=generator)).tolist()
    rows, columns = rows - dy, columns - dx
    if shape == "across":
        ink = (rows % 7) < 2
    elif shape == "down":
        ink = (columns % 7) < 2
    elif shape == "diagonal":
        ink = (rows - columns).abs() < 3
    else:
        radius = ((rows - SIZE / 2) ** 2 + (columns - SIZE / 2) ** 2).sqrt()
        ink = (radius - 8).abs() < 2
    noise = torch.rand(SIZE, SIZE, generator=generator) * 80
    return (ink.float() * 170 + noise).clamp(0, 255).to(torch.uint8).unsqueeze(0)


def shape_splits(per_class: int, seed: int = 0) -> dict[str, dict[str, list[Tensor]]]:
    generator = torch.Generator().manual_seed(seed)
    counts = {"train": per_class, "val": per_class // 4, "test": per_class // 4}
    return {
        split: {shape: [shape_image(shape, generator) for _ in range(count)] for shape in SHAPES}
        for split, count in counts.items()
    }


def fashion_mnist_splits(root: str, per_class: int) -> dict[str, dict[str, list[Tensor]]]:
    datamodule = MNISTDataModule("fashion_mnist", root, batch_size=1, seed=0, val_size=0, download=False)
    datamodule.setup("fit")
    names = datamodule.class_names

    def first(dataset, start: int, count: int) -> dict[str, list[Tensor]]:
        return {
            names[label]: [
                dataset.inputs[i] for i in (dataset.targets == label).nonzero().flatten()[start : start + count]
            ]
            for label in range(len(names))
        }

    return {
        "train": first(datamodule.train_set, 0, per_class),
        "val": first(datamodule.train_set, per_class, per_class // 4),
        "test": first(datamodule.test_set, 0, per_class // 4),
    }


def write(splits: dict[str, dict[str, list[Tensor]]], root: Path) -> int:
    written = 0
    for split, classes in splits.items():
        for name, images in classes.items():
            folder = root / split / name.replace("/", "-")
            folder.mkdir(parents=True, exist_ok=True)
            for number, image in enumerate(images):
                Image.fromarray(image[0].numpy(), mode="L").save(folder / f"{number:05d}.png")
                written += 1
    return written


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m project.optional.image_folder.example", description=__doc__)
    parser.add_argument("root", type=Path, help="where to write train/, val/ and test/")
    parser.add_argument("--per-class", type=int, default=200, help="training images per class (default 200)")
    parser.add_argument("--fashion-mnist-root", help="take Fashion-MNIST's images from this data.root instead")
    args = parser.parse_args(argv)
    if args.per_class < 4:
        parser.error("--per-class must be at least 4 (a quarter of it goes to val and to test)")
    splits = fashion_mnist_splits(args.fashion_mnist_root, args.per_class) if args.fashion_mnist_root else None
    written = write(splits or shape_splits(args.per_class), args.root)
    print(
        f"wrote {written} images under {args.root}: python -m project.train experiment=image_folder_cnn "
        f"data.root={args.root}"
    )


if __name__ == "__main__":
    main()
