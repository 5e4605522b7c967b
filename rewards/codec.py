"""Lossless wire formats for images and videos: base64 PNG, base64 MP4 (H.264 RGB, qp 0) or a list
of base64 PNG frames. Shared by the reward server, its client and the VLM judge; never pickle.

    encode_png(uint8 [3, H, W]) -> str          decode_png(str, max_pixels) -> uint8 [3, H, W]
    encode_mp4(uint8 [F, 3, H, W]) -> str       decode_mp4(str, max_frames, max_pixels) -> uint8 [F, 3, H, W]

MP4 needs imageio + imageio-ffmpeg (pip install 'flowgrpo[video]'); libx264rgb at qp 0 keeps every
RGB value, so a video scored remotely sees the same pixels as locally.
"""

from __future__ import annotations

import base64
import binascii
import io
import os
import tempfile

import numpy as np
import torch

from rewards.common import require


class DecodeError(ValueError):
    """The payload is not a valid image or video (the server answers 400)."""


class TooLarge(ValueError):
    """The payload decodes to more pixels or frames than allowed (the server answers 413)."""


def _b64decode(data: str, what: str) -> bytes:
    if not isinstance(data, str):
        raise DecodeError(f"{what} must be a base64 string, got {type(data).__name__}")
    if data.startswith("data:"):
        data = data.split(",", 1)[-1]
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise DecodeError(f"{what} is not valid base64: {exc}") from exc


def encode_png(image: torch.Tensor) -> str:
    """uint8 [3, H, W] -> base64 PNG."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(image.permute(1, 2, 0).cpu().numpy()).save(buffer, format="PNG", compress_level=1)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def decode_png(data: str, max_pixels: int = 4096 * 4096, what: str = "image") -> torch.Tensor:
    """base64 PNG (RGB) -> uint8 [3, H, W]; checks the declared size before decoding pixels."""
    from PIL import Image

    raw = _b64decode(data, what)
    try:
        with Image.open(io.BytesIO(raw)) as pil:
            if pil.format != "PNG":
                raise DecodeError(f"{what} must be a PNG, got {pil.format}")
            width, height = pil.size
            if width * height > max_pixels:
                raise TooLarge(f"{what} is {width}x{height}, more than the server's max_pixels={max_pixels}")
            if pil.mode != "RGB":
                raise DecodeError(f"{what} must be an RGB PNG, got mode {pil.mode}; convert with image.convert('RGB')")
            array = np.asarray(pil.convert("RGB"))
    except (DecodeError, TooLarge):
        raise
    except Exception as exc:  # noqa: BLE001  (PIL raises many types on corrupt data)
        raise DecodeError(f"{what} is not a readable PNG: {exc}") from exc
    return torch.from_numpy(array.copy()).permute(2, 0, 1).contiguous()


def encode_mp4(video: torch.Tensor, fps: int = 8) -> str:
    """uint8 [F, 3, H, W] -> base64 MP4 (libx264rgb, qp 0: lossless RGB)."""
    imageio = require("imageio.v2", "video", "MP4 encoding")
    require("imageio_ffmpeg", "video", "MP4 encoding")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "video.mp4")
        writer = imageio.get_writer(path, format="FFMPEG", mode="I", fps=fps, codec="libx264rgb", pixelformat="rgb24",
                                    macro_block_size=1, output_params=["-qp", "0", "-preset", "ultrafast"],
                                    ffmpeg_log_level="error")
        try:
            for frame in video:
                writer.append_data(frame.permute(1, 2, 0).cpu().numpy())
        finally:
            writer.close()
        with open(path, "rb") as handle:
            return base64.b64encode(handle.read()).decode("ascii")


def decode_mp4(data: str, max_frames: int = 256, max_pixels: int = 4096 * 4096, what: str = "video") -> torch.Tensor:
    """base64 MP4 -> uint8 [F, 3, H, W]; checks size and frame count while reading."""
    imageio = require("imageio.v2", "video", "MP4 decoding")
    require("imageio_ffmpeg", "video", "MP4 decoding")
    raw = _b64decode(data, what)
    frames = []
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "video.mp4")
        with open(path, "wb") as handle:
            handle.write(raw)
        try:
            reader = imageio.get_reader(path, format="FFMPEG")
        except Exception as exc:  # noqa: BLE001
            raise DecodeError(f"{what} is not a readable MP4: {exc}") from exc
        try:
            width, height = reader.get_meta_data().get("size", (0, 0))
            if width * height > max_pixels:
                raise TooLarge(f"{what} is {width}x{height}, more than the server's max_pixels={max_pixels}")
            for frame in reader:
                if len(frames) >= max_frames:
                    raise TooLarge(f"{what} has more than the server's max_frames={max_frames} frames")
                frames.append(torch.from_numpy(np.ascontiguousarray(frame[..., :3])).permute(2, 0, 1))
        except (DecodeError, TooLarge):
            raise
        except Exception as exc:  # noqa: BLE001
            raise DecodeError(f"{what} is not a readable MP4: {exc}") from exc
        finally:
            reader.close()
    if not frames:
        raise DecodeError(f"{what} has no frames")
    return torch.stack(frames)


def encode_video(video: torch.Tensor, fmt: str = "png") -> str | list[str]:
    """uint8 [F, 3, H, W] -> base64 MP4 (fmt="mp4") or a list of base64 PNG frames (fmt="png")."""
    if fmt == "mp4":
        return encode_mp4(video)
    if fmt == "png":
        return [encode_png(frame) for frame in video]
    raise ValueError(f"video format must be 'png' or 'mp4', got {fmt!r}")


def decode_video(data, max_frames: int = 256, max_pixels: int = 4096 * 4096, what: str = "video") -> torch.Tensor:
    """A base64 MP4 string or a list of base64 PNG frames -> uint8 [F, 3, H, W]."""
    if isinstance(data, list):
        if not data:
            raise DecodeError(f"{what} has no frames")
        if len(data) > max_frames:
            raise TooLarge(f"{what} has {len(data)} frames, more than the server's max_frames={max_frames}")
        frames = [decode_png(f, max_pixels, f"{what} frame {i}") for i, f in enumerate(data)]
        if len({tuple(f.shape) for f in frames}) != 1:
            raise DecodeError(f"{what}: frames differ in size")
        return torch.stack(frames)
    return decode_mp4(data, max_frames, max_pixels, what)
