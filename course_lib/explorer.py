"""Notebook 04, section 7: an ipywidgets explorer of DataLoader settings: sliders, and a button that measures one
epoch with :mod:`course_lib.instrument` and draws its timeline (on the button, not on every slider move)."""

from __future__ import annotations

import warnings
from typing import Any

import ipywidgets as widgets
import matplotlib.pyplot as plt
from torch.utils.data import Dataset

from .instrument import InstrumentedLoader, plot_timeline, timed_loader

__all__ = ["LoaderExplorer"]


class LoaderExplorer:
    """Notebook 04, section 7: holds the widgets and the measurements; a cell ending in ``explorer`` shows it."""

    def __init__(
        self, dataset: Dataset, step_ms: float = 20.0, max_workers: int = 4, max_batches: int | None = 24
    ) -> None:
        self.dataset, self.max_batches = dataset, max_batches
        look = dict(style={"description_width": "150px"}, layout=widgets.Layout(width="420px"))
        self.workers = widgets.IntSlider(value=0, min=0, max=max_workers, description="num_workers", **look)
        self.batch_size = widgets.IntSlider(value=32, min=8, max=128, step=8, description="batch_size", **look)
        self.prefetch = widgets.IntSlider(value=2, min=1, max=8, description="prefetch_factor", **look)
        self.step_ms = widgets.FloatSlider(
            value=step_ms, min=0.0, max=100.0, step=5.0, description="training step (ms)", **look
        )
        self.button = widgets.Button(
            description="Measure one epoch", button_style="primary", icon="play", layout=widgets.Layout(width="auto")
        )  # the default width cuts the label
        self.output = widgets.Output()
        self.button.on_click(lambda _: self.run())
        self.workers.observe(lambda change: setattr(self.prefetch, "disabled", change["new"] == 0), names="value")
        self.prefetch.disabled = True
        self.history: list[InstrumentedLoader] = []
        self.widget = widgets.VBox(
            [self.workers, self.batch_size, self.prefetch, self.step_ms, self.button, self.output]
        )

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        """Shown as the widget; a saved notebook, whose widgets need a live kernel, shows this line instead."""
        bundle = self.widget._repr_mimebundle_(**kwargs)
        bundle["text/plain"] = "LoaderExplorer: run this cell to show its sliders and button"
        return bundle

    def settings(self) -> dict[str, Any]:
        """The DataLoader arguments the sliders describe now."""
        kwargs: dict[str, Any] = {"batch_size": self.batch_size.value, "num_workers": self.workers.value}
        if self.workers.value > 0:
            kwargs["prefetch_factor"] = self.prefetch.value
        return kwargs

    def run(self) -> InstrumentedLoader:
        """Measure one epoch (at most ``max_batches`` batches) with the current settings and redraw."""
        self.button.disabled = True
        try:
            with warnings.catch_warnings():
                warnings.filterwarnings(
                    "ignore", message="This DataLoader will create"
                )  # more workers than cores: allowed here
                loader = timed_loader(
                    self.dataset, step_s=self.step_ms.value / 1000, max_batches=self.max_batches, **self.settings()
                )
        finally:
            self.button.disabled = False
        self.history.append(loader)
        self.output.clear_output(wait=True)
        with self.output:
            fig = plot_timeline(loader.last)
            plt.show(fig)
            print(loader.last.summary())
        return loader
