"""Qwen3-VL image preprocessing in torch, on the model's device, straight from raw capture bytes.

Produces exactly the reference processor's `pixel_values` `[gh*gw, C*T*p*p]` and `image_grid_thw`
`[1, 3]`: smart-resize each side to a multiple of patch*merge (bicubic, antialias, on uint8 like the
reference), rescale by 1/255 and normalise with the processor's mean/std (fused, as the reference does),
then patchify so that each merge window's patches are contiguous and duplicate the frame to T=2.

From raw BGRA the whole path is a few ms on a GPU, against ~100 ms for PNG decode plus the CPU processor.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import torch
from torchvision.transforms.v2 import functional as tvF

from qvl_agent.errors import ImageError
from qvl_agent.image import Screenshot


@dataclass(frozen=True)
class PreprocessSettings:
    """Everything that changes what the vision tower sees; part of the feature-cache key."""

    patch_size: int = 16
    merge_size: int = 2
    temporal_patch_size: int = 2
    min_pixels: int = 65_536
    max_pixels: int = 16_777_216
    mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    std: tuple[float, float, float] = (0.5, 0.5, 0.5)

    @classmethod
    def from_processor(cls, image_processor, max_pixels: int | None = None) -> PreprocessSettings:
        size = image_processor.size
        get = size.get if isinstance(size, dict) else lambda k, d=None: getattr(size, k, d)
        longest = get("longest_edge") or 16_777_216
        return cls(
            patch_size=image_processor.patch_size,
            merge_size=image_processor.merge_size,
            temporal_patch_size=image_processor.temporal_patch_size,
            min_pixels=get("shortest_edge") or 65_536,
            max_pixels=min(longest, max_pixels) if max_pixels else longest,
            mean=tuple(float(v) for v in image_processor.image_mean),
            std=tuple(float(v) for v in image_processor.image_std),
        )

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size


def smart_resize(height: int, width: int, s: PreprocessSettings) -> tuple[int, int]:
    """The reference processor's target size: sides multiples of `factor`, pixels within bounds."""
    factor = s.factor
    if max(height, width) / min(height, width) > 200:
        raise ImageError(f"A {width}x{height} image is too narrow: the aspect ratio must be under 200:1.")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > s.max_pixels:
        beta = math.sqrt((height * width) / s.max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < s.min_pixels:
        beta = math.sqrt(s.min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def grid_for(shot: Screenshot, s: PreprocessSettings) -> tuple[int, int, int]:
    """`(t, gh, gw)` in patches, without touching a pixel."""
    h, w = smart_resize(shot.height, shot.width, s)
    return 1, h // s.patch_size, w // s.patch_size


def visual_tokens(shot: Screenshot, s: PreprocessSettings) -> int:
    _, gh, gw = grid_for(shot, s)
    return gh * gw // (s.merge_size**2)


def _upload(shot: Screenshot, device: torch.device | str) -> torch.Tensor:
    """`[1, C, H, W]` uint8 view of the raw bytes in channels-last layout (C = 4 for BGRA, 3 for RGB),
    on `device`. Raw bytes go up as-is, pinned and asynchronous."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # frombuffer on read-only bytes: we never write to it
        flat = torch.frombuffer(shot.data, dtype=torch.uint8)
    device = torch.device(device)
    if device.type == "cuda":
        flat = flat.pin_memory().to(device, non_blocking=True)
    return flat.view(1, shot.height, shot.width, len(shot.layout)).permute(0, 3, 1, 2)


def _rgb(image: torch.Tensor, layout: str) -> torch.Tensor:
    """RGB channels of an uploaded image, contiguous `[1, 3, H, W]`."""
    return image[:, [2, 1, 0]] if layout == "BGRA" else image.contiguous()


def to_rgb_tensor(shot: Screenshot, device: torch.device | str = "cpu") -> torch.Tensor:
    """`[1, 3, H, W]` uint8 RGB on `device`."""
    return _rgb(_upload(shot, device), shot.layout)


def patchify(images: torch.Tensor, s: PreprocessSettings, mean=None, std=None) -> torch.Tensor:
    """`[1, C, H, W]` -> `[gh*gw, C*T*p*p]` float32 with each merge window's patches contiguous and the
    frame duplicated to T. With `mean`/`std` (per channel, in pixel units) the patches are normalised
    on the way: after the uint8 shuffle and before the T duplication, where there is least to move."""
    b, c, h, w = images.shape
    p, m, t = s.patch_size, s.merge_size, s.temporal_patch_size
    gh, gw = h // p, w // p
    patches = images.reshape(b, c, gh // m, m, p, gw // m, m, p)
    patches = patches.permute(0, 2, 5, 3, 6, 1, 4, 7).reshape(-1, c, p, p)  # [N, C, p, p]
    patches = patches.to(torch.float32)
    if mean is not None:
        patches = (patches - mean.view(1, c, 1, 1)) / std.view(1, c, 1, 1)
    patches = patches.unsqueeze(2).expand(-1, -1, t, -1, -1)  # [N, C, T, p, p]
    return patches.reshape(b * gh * gw, c * t * p * p)


def preprocess(
    shot: Screenshot, s: PreprocessSettings, device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """`(pixel_values [gh*gw, 1536] float32, image_grid_thw [1, 3] long)` on `device`."""
    height, width = smart_resize(shot.height, shot.width, s)
    # Resize first, in the capture's own channels-last layout (alpha included): that is the fast uint8
    # path, and channels are filtered independently, so dropping alpha afterwards changes nothing.
    image = tvF.resize(
        _upload(shot, device), [height, width], interpolation=tvF.InterpolationMode.BICUBIC, antialias=True
    )
    image = _rgb(image, shot.layout)
    # The reference fuses rescale into normalisation: (x - mean*255) / (std*255), in float32.
    mean = torch.tensor(s.mean, device=image.device) * 255.0
    std = torch.tensor(s.std, device=image.device) * 255.0
    pixel_values = patchify(image, s, mean, std)
    grid = torch.tensor([[1, height // s.patch_size, width // s.patch_size]], dtype=torch.long, device=image.device)
    return pixel_values, grid
