"""course_lib.viz: each picture is a real matplotlib figure with the expected axes."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pytest
import torch
from matplotlib.figure import Figure
from PIL import Image

from course_lib import viz

pytestmark = pytest.mark.quick


def test_to_display_handles_every_image_kind() -> None:
    assert viz._to_display(Image.new("RGB", (5, 4))).shape == (4, 5, 3)
    assert viz._to_display(torch.rand(3, 4, 5)).shape == (4, 5, 3)
    assert viz._to_display(torch.rand(1, 4, 5)).shape == (4, 5)
    assert viz._to_display(torch.full((3, 2, 2), 2.0)).max() == 1.0  # floats are clipped to [0, 1]
    assert viz._to_display(np.zeros((4, 5, 3), dtype=np.uint8)).shape == (4, 5, 3)


def test_show_images_grid() -> None:
    fig = viz.show_images([torch.rand(3, 8, 8)] * 10, [str(i) for i in range(10)], ncols=4)
    assert isinstance(fig, Figure) and len(fig.axes) == 12
    assert [ax.get_title() for ax in fig.axes[:3]] == ["0", "1", "2"]
    with pytest.raises(ValueError, match="at least one image"):
        viz.show_images([])


def test_class_histogram_bars() -> None:
    fig = viz.class_histogram({"train": [3, 4], "val": [1, 1]}, ["a", "b"])
    assert len(fig.axes[0].patches) == 4 and fig.axes[0].get_legend() is not None


def test_padded_batch_reports_padding_share() -> None:
    fig = viz.show_padded_batch(torch.zeros(2, 4, dtype=torch.long), torch.tensor([4, 2]))
    assert "25% of the tensor is padding" in fig.axes[0].get_title()


def test_batch_order() -> None:
    fig = viz.show_batch_order([[0, 1, 2], [3, 4]])
    assert len(fig.axes[0].texts) == 5
