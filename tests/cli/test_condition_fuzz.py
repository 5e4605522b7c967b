"""The condition-image fuzz: every kind of bad file or value an edit set's row can name is refused when the set is read,
in one line naming the file, the line and the fix (flowgrpo/conditions.py; the classes in docs/errors.md); every
image a model can take is accepted. Through ``read_prompts``, as preflight and the trainer read a set; one case per
class goes through the entry point in tests/cli/test_user_errors.py."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from flowgrpo.conditions import KEY
from flowgrpo.data import read_prompts
from flowgrpo.run.errors import UserError


def _png_bytes(image) -> bytes:
    import io

    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def _jpeg_bytes(image) -> bytes:
    import io

    buffer = io.BytesIO()
    image.save(buffer, format="JPEG")
    return buffer.getvalue()


RGB = Image.fromarray(np.random.default_rng(0).integers(0, 256, (24, 24, 3), dtype=np.uint8))
# file name -> bytes (or a builder), and whether a model can take it
FILES = {
    "rgb.png": (_png_bytes(RGB), True), "rgb.jpg": (_jpeg_bytes(RGB), True), "grey.png": (_png_bytes(RGB.convert("L")), True),
    "palette.png": (_png_bytes(RGB.convert("P")), True), "bilevel.png": (_png_bytes(RGB.convert("1")), True),
    "rgba.png": (_png_bytes(RGB.convert("RGBA")), False), "la.png": (_png_bytes(RGB.convert("LA")), False),
    "i16.png": (_png_bytes(RGB.convert("L").convert("I;16")), False),
    "cmyk.jpg": (_jpeg_bytes(RGB.convert("CMYK")), False),
    "empty.png": (b"", False), "text.png": (b"hello, not an image", False),
    "truncated.png": (_png_bytes(RGB)[:200], False), "truncated.jpg": (_jpeg_bytes(RGB)[:300], False),
    "bad_crc.png": (_png_bytes(RGB)[:40] + bytes([_png_bytes(RGB)[40] ^ 0xFF]) + _png_bytes(RGB)[41:], False),
}
VALUES = [3, 1.5, True, "", [], [3], [""], {"a": "rgb.png"}, ["rgb.png", 7], "folder.png", "../escape/none.png",
          "/no/such/abs.png"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz")
    for name, (data, _) in FILES.items():
        (root / name).write_bytes(data)
    palette = RGB.convert("P")
    palette.info["transparency"] = 0
    palette.save(root / "palette_transparent.png", transparency=0)
    (root / "folder.png").mkdir()
    return root


def _read(folder, row: dict):
    path = folder / "set.jsonl"
    path.write_text(json.dumps({"prompt": "make the red circle blue", **row}) + "\n")
    return read_prompts(str(path))


@pytest.mark.parametrize("name", sorted(FILES) + ["palette_transparent.png"])
def test_each_file_is_taken_or_refused_in_one_line(name, folder):
    takes = FILES[name][1] if name in FILES else False
    if takes:
        _, metadata = _read(folder, {"image": name})
        assert metadata[0][KEY] == [str(folder / name)]
        return
    with pytest.raises(UserError) as error:
        _read(folder, {"image": name})
    message = str(error.value)
    assert "\n" not in message and message.startswith(f"{folder / 'set.jsonl'}:1") and repr(name) in message, message


@pytest.mark.parametrize("value", VALUES, ids=[repr(v) for v in VALUES])
def test_each_bad_value_is_refused_in_one_line(value, folder):
    """(``null`` is a row without images: the set then mixes counts only if other rows carry some.)"""
    for key in ("image", "images"):
        with pytest.raises(UserError) as error:
            _read(folder, {key: value})
        message = str(error.value)
        assert "\n" not in message and str(folder / "set.jsonl") in message, message
