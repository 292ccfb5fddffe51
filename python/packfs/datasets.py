"""A torch dataset read through an in-process ``packfs.Engine``: no mount needed.

    from packfs.datasets import ImageFolder
    train = ImageFolder("/gpfs/datasets/imagenet/train.packfs-index", root="train",
                        transform=transforms.ToTensor(), cache_size="1G")
    loader = torch.utils.data.DataLoader(train, batch_size=256, num_workers=8, shuffle=True)

``ImageFolder`` finds the same classes, ``class_to_idx`` and samples, in the same order, as
torchvision's ``ImageFolder`` over a mount of the same dataset; its samples' paths are relative
to the dataset's root. DataLoader workers share the engine: forked ones reopen what they read
with over the same catalog, spawned ones open the dataset again from its arguments.
"""

from __future__ import annotations

import io
import os
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

from torch.utils.data import Dataset

from .engine import Engine

__all__ = ["ImageFolder", "IMG_EXTENSIONS", "bytes_loader", "pil_loader"]

#: torchvision's ``IMG_EXTENSIONS``.
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def pil_loader(f) -> "PIL.Image.Image":  # noqa: F821
    """torchvision's default: the image as RGB."""
    from PIL import Image

    img = Image.open(f)
    return img.convert("RGB")


def bytes_loader(f) -> bytes:
    """The file's bytes, undecoded (for a decoder of your own, or ``torchvision.io.decode_image``
    after ``torch.frombuffer``)."""
    return f.getvalue()


class ImageFolder(Dataset):
    """Samples in ``root/<class>/**/<file>``: torchvision's ImageFolder over a packfs dataset.

    ``source`` is an open ``packfs.Engine``, or what ``packfs.Engine`` takes (then the keyword
    arguments it does not know here go to it). ``loader`` takes the sample as a binary file
    object (``io.BytesIO``); the default decodes it with PIL to RGB."""

    def __init__(
        self,
        source,
        root: str = "",
        transform: Optional[Callable] = None,
        target_transform: Optional[Callable] = None,
        loader: Callable = pil_loader,
        extensions: Optional[Sequence[str]] = IMG_EXTENSIONS,
        is_valid_file: Optional[Callable[[str], bool]] = None,
        allow_empty: bool = False,
        **engine_options,
    ) -> None:
        self.engine = source if isinstance(source, Engine) else Engine(source, **engine_options)
        self.root = os.fsdecode(root).strip("/")
        self.transform, self.target_transform, self.loader = transform, target_transform, loader
        if (extensions is None) == (is_valid_file is None):
            raise ValueError("give extensions or is_valid_file, not both and not neither")
        if is_valid_file is None:
            lowered = tuple(e.lower() for e in extensions)
            is_valid_file = lambda p: p.lower().endswith(lowered)  # noqa: E731
        self.extensions = None if extensions is None else tuple(extensions)
        self.classes, self.class_to_idx = self.find_classes(self.root)
        self.samples = self._make_dataset(is_valid_file, allow_empty)
        self.imgs = self.samples
        self.targets = [t for _, t in self.samples]

    def _join(self, *parts: str) -> str:
        return "/".join(p for p in parts if p)

    def find_classes(self, directory: str) -> Tuple[List[str], Dict[str, int]]:
        """The class directories of ``directory`` (links to directories too), sorted."""
        classes = sorted(
            name for name, kind in self.engine.scandir(directory)
            if kind == "d" or (kind == "l" and self.engine.isdir(self._join(directory, name)))
        )
        if not classes:
            raise FileNotFoundError(f"Couldn't find any class folder in {directory or '/'}.")
        return classes, {name: i for i, name in enumerate(classes)}

    def _make_dataset(self, is_valid_file, allow_empty) -> List[Tuple[str, int]]:
        samples, empty = [], []
        for target_class in sorted(self.class_to_idx):
            index = self.class_to_idx[target_class]
            found = 0
            for top, _, names in sorted(self.engine.walk(self._join(self.root, target_class),
                                                          followlinks=True)):
                for name in sorted(names):
                    path = self._join(top, name)
                    if is_valid_file(path):
                        samples.append((path, index))
                        found += 1
            if found == 0:
                empty.append(target_class)
        if empty and not allow_empty:
            wanted = f"Supported extensions are: {', '.join(self.extensions)}" \
                if self.extensions else ""
            raise FileNotFoundError(
                f"Found no valid file for the classes {', '.join(sorted(empty))}. {wanted}"
            )
        return samples

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int):
        path, target = self.samples[index]
        sample = self.loader(io.BytesIO(self.engine.read(path)))
        if self.transform is not None:
            sample = self.transform(sample)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return sample, target
