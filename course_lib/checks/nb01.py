"""Checks for notebook 01 (map-style datasets)."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import torch
from torch.utils.data import Subset, random_split

from ._core import Hint, attempted, exercise, require


@exercise("01.1", "Squares follows the Dataset protocol: length, items, and IndexError past the end.")
def squares_dataset(squares_cls: Any) -> None:
    """``Squares(n)[i] == (i, i**2)``, ``len == n``, ``IndexError`` out of range."""
    attempted(squares_cls)
    require(isinstance(squares_cls, type), "pass the class itself, `Squares`, not an instance such as `Squares(5)`.")
    ds = squares_cls(5)
    require(hasattr(ds, "__len__") and hasattr(ds, "__getitem__"), "Squares needs both __len__ and __getitem__.")
    n = len(ds)
    require(n == 5, f"len(Squares(5)) should be 5, got {n}: __len__ must return the n given to __init__.")
    item = ds[3]
    require(isinstance(item, tuple) and len(item) == 2, f"Squares(5)[3] should be the tuple (3, 9), got {item!r}: return i, i ** 2.")
    require(
        int(item[0]) == 3 and int(item[1]) == 9,
        f"Squares(5)[3] should be (3, 9), got {item!r}: return (index, index ** 2).",
    )
    require(len(squares_cls(12)) == 12, "len() must follow the n given to __init__, not a fixed number.")
    try:
        ds[5]
    except IndexError:
        pass
    except NotImplementedError:
        raise
    except Exception as exc:
        raise Hint(
            f"Squares(5)[5] raised {type(exc).__name__}; raise IndexError instead so that loops know where the data ends."
        ) from None
    else:
        raise Hint("Squares(5)[5] returned a value; an index past the end must raise IndexError.")
    items = list(itertools.islice(iter(ds), 20))  # bounded, in case iteration never ends
    require(len(items) == 5, f"`for x in Squares(5)` should yield 5 items, it yielded {len(items)}.")


@exercise("01.2", "a reproducible 80/20 split: 640 + 160 disjoint samples, the same on every run.")
def seeded_split(train_part: Any, holdout: Any, dataset: Any) -> None:
    """Both parts come from ``random_split(dataset, [0.8, 0.2], generator=seed 42)``."""
    attempted(train_part, holdout)
    for name, part in (("train_part", train_part), ("holdout", holdout)):
        require(isinstance(part, Subset), f"{name} should be a Subset (what random_split returns), got {type(part).__name__}.")
        require(part.dataset is dataset, f"{name} should be a split of the `train` dataset defined above.")
    n = len(dataset)
    require(
        (len(train_part), len(holdout)) == (int(0.8 * n), n - int(0.8 * n)),
        f"expected {int(0.8 * n)} + {n - int(0.8 * n)} samples, got {len(train_part)} + {len(holdout)}: use the fractions [0.8, 0.2].",
    )
    a, b = set(train_part.indices), set(holdout.indices)
    require(not a & b, f"{len(a & b)} samples are in both parts: each sample must land in exactly one.")
    expected = random_split(range(n), [0.8, 0.2], generator=torch.Generator().manual_seed(42))
    require(
        list(train_part.indices) == list(expected[0].indices),
        "the split is not the one seed 42 gives: pass generator=torch.Generator().manual_seed(42) to random_split.",
    )


@exercise("01.3", "the counts match. Read from .targets, they need no image decoding at all.")
def class_counts(counts: Any, dataset: Any) -> None:
    """``counts`` maps each class name to its number of samples in ``dataset``."""
    attempted(counts)
    require(isinstance(counts, dict), f"counts should be a dict {{class name: count}}, got {type(counts).__name__}.")
    truth = {c: int(k) for c, k in zip(dataset.classes, np.bincount(dataset.targets, minlength=len(dataset.classes)))}
    keys = {str(k) for k in counts}
    if keys != set(truth):
        if all(isinstance(k, (int, np.integer)) for k in counts):
            raise Hint("use the class names as keys (dataset.classes[label]), not the integer labels.")
        raise Hint(f"the keys should be the class names {sorted(truth)}, got {sorted(keys)}.")
    wrong = [c for c in truth if int(counts[c]) != truth[c]]
    if wrong:
        raise Hint(f"the count for {wrong[0]!r} is {counts[wrong[0]]}, but the dataset has {truth[wrong[0]]}.")


__all__ = ["squares_dataset", "seeded_split", "class_counts"]
