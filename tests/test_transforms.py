"""course_lib.transforms: Add, Mult and OneHot alone and inside torchvision's Compose."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision import transforms as v1
from torchvision.transforms import v2

from course_lib.transforms import Add, Mult, OneHot

pytestmark = pytest.mark.quick


def test_on_numbers_tensors_and_arrays() -> None:
    assert Add(2)(1) == 3 and Mult(3)(2.5) == 7.5
    assert torch.equal(Add(1)(torch.tensor([1, 2])), torch.tensor([2, 3]))
    assert np.array_equal(Mult(2)(np.array([1.0, 2.0])), np.array([2.0, 4.0]))


def test_order_in_compose_matters_and_repr_reads_well() -> None:
    pipeline = v2.Compose([Add(2), Mult(3)])
    assert pipeline(1) == 9 and v2.Compose([Mult(3), Add(2)])(1) == 5
    assert v1.Compose([Add(2), Mult(3)])(1) == 9  # the classic API too
    assert "Add(2)" in repr(pipeline) and "Mult(3)" in repr(pipeline)
    assert repr(Add(-0.5)) == "Add(-0.5)"


def test_mixed_with_torchvision_transforms() -> None:
    img = Image.fromarray(np.full((4, 4, 3), 255, dtype=np.uint8))
    out = v2.Compose([v2.ToImage(), v2.ToDtype(torch.float32, scale=True), Add(-0.5), Mult(2)])(img)
    assert out.shape == (3, 4, 4) and torch.allclose(out, torch.ones(3, 4, 4))


def test_pil_input_gets_a_hint() -> None:
    img = Image.new("RGB", (4, 4))
    with pytest.raises(TypeError, match=r"not on a PIL image: put v2.ToImage\(\)"):
        Add(1)(img)
    with pytest.raises(TypeError, match="got str"):
        Mult(2)("text")


def test_bad_parameters() -> None:
    with pytest.raises(TypeError, match="Add needs a number"):
        Add("2")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Mult needs a number"):
        Mult(None)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        OneHot(0)


def test_they_pickle_for_worker_processes() -> None:
    restored = pickle.loads(pickle.dumps(v2.Compose([Add(1), Mult(2)])))
    assert restored(1) == 4


def test_one_hot() -> None:
    assert torch.equal(OneHot(4)(2), torch.tensor([0.0, 0.0, 1.0, 0.0]))
    assert torch.equal(OneHot(3)(torch.tensor(0)), torch.tensor([1.0, 0.0, 0.0]))
    with pytest.raises(ValueError, match="target 5 is outside 0..3"):
        OneHot(4)(5)


def test_image_decoder_reads_a_file_into_the_pixels_pillow_gives(tmp_path) -> None:
    from course_lib.transforms import image_decoder

    pixels = np.random.default_rng(0).integers(0, 256, (20, 30, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(tmp_path / "x.png")
    decoded = image_decoder()(str(tmp_path / "x.png"), mode="RGB")
    assert decoded.dtype == torch.uint8 and tuple(decoded.shape) == (3, 20, 30)
    assert torch.equal(decoded, torch.from_numpy(pixels).permute(2, 0, 1))


def test_image_decoder_is_torchcodecs_where_it_loads_else_torchvisions(monkeypatch) -> None:
    import sys

    import torchvision.io

    from course_lib.transforms import image_decoder

    try:
        from torchcodec.decoders import decode_image as codec_decode_image
    except (ImportError, OSError, RuntimeError):
        codec_decode_image = None
    if codec_decode_image is not None:
        assert image_decoder() is codec_decode_image
    monkeypatch.setitem(sys.modules, "torchcodec.decoders", None)  # as if torchcodec were missing: ImportError
    assert image_decoder() is torchvision.io.decode_image
