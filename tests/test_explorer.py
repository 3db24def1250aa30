"""course_lib.explorer: the sliders drive a real measurement."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import ipywidgets as widgets
import pytest
from torchvision.transforms import v2

from course_lib.datasets import ImageFileDataset
from course_lib.explorer import LoaderExplorer

pytestmark = pytest.mark.quick


@pytest.mark.timeout(120)
def test_button_measures_with_the_slider_settings(tiny_set: Path) -> None:
    explorer = LoaderExplorer(ImageFileDataset(tiny_set, "train", transform=v2.PILToTensor()), step_ms=0)
    assert isinstance(explorer.widget, widgets.VBox)
    assert explorer.prefetch.disabled  # prefetch_factor means nothing without workers
    explorer.button.click()
    first = explorer.history[-1]
    assert first.num_workers == 0 and first.batch_size == 32 and first.last.complete
    explorer.workers.value, explorer.batch_size.value, explorer.prefetch.value = 2, 16, 3
    assert not explorer.prefetch.disabled
    assert explorer.settings() == {"batch_size": 16, "num_workers": 2, "prefetch_factor": 3}
    explorer.button.click()
    second = explorer.history[-1]
    assert second.num_workers == 2 and second.prefetch_factor == 3 and len(second.last.batches) == 5
    assert not explorer.button.disabled
