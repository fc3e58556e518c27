"""ALE's screens to the network's frames, by lbc.native (decision 94): OpenCV's INTER_AREA downscale, the resize
ale-py's AtariVectorEnv runs on every step, to the bit, at a fraction of its CPU.

ale-py resizes each game's max-pooled 210x160 grey screen with cv::resize(INTER_AREA), whose loop for a
non-integer ratio scatters every term into a row of sums through a table, each term waiting on the one before:
10-12% of the games' CPU samples, the resize alone about 80 us a frame (docs/speed.md, session 65). Asked for the
screens unresized, lbc.envs.AtariEnvs resizes them here with the same tables and the same float operations in the
same order (lbc/csrc/area_resize.cpp), and stacks them as ALE does.

`area_tables` is OpenCV's computeResizeAreaTab (imgproc/src/resize.cpp) laid out per output pixel: output i sums
weight[i, t] * source[index[i, t]] over t in OpenCV's order, padded with weight 0 (an exact 0 added).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from lbc import native


def area_scale(source: int, out: int) -> float:
    """The ratio cv::resize uses: 1 / (out / source), as it inverts the scale it is given (not always source / out
    to the last bit)."""
    return 1.0 / (out / source)


def integer_ratio(source: int, out: int) -> bool:
    """Whether cv::resize takes its integer-ratio path for this axis (resizeAreaFast, not these tables)."""
    scale = area_scale(source, out)
    return abs(scale - round(scale)) < np.finfo(np.float64).eps


def area_tables(source: int, out: int) -> tuple[np.ndarray, np.ndarray]:
    """(index int32 [out, terms], weight float32 [out, terms]): each output pixel's source pixels and weights along
    one axis, for out < source, as OpenCV's computeResizeAreaTab builds them (in float64, each weight rounded to
    float32 once), padded to the most terms any output has."""
    if not 0 < out < source:
        raise ValueError(f"an area downscale needs 0 < out < source, got {source} -> {out}")
    scale = area_scale(source, out)
    rows: list[list[tuple[int, float]]] = []
    for d in range(out):
        start = d * scale
        end = start + scale
        cell = min(scale, source - start)
        first, last = math.ceil(start), math.floor(end)
        last = min(last, source - 1)
        first = min(first, last)
        terms: list[tuple[int, float]] = []
        if first - start > 1e-3:
            terms.append((first - 1, (first - start) / cell))
        terms += [(s, 1.0 / cell) for s in range(first, last)]
        if end - last > 1e-3:
            terms.append((last, min(end - last, 1.0, cell) / cell))
        rows.append(terms)
    width = max(len(terms) for terms in rows)
    index = np.zeros((out, width), np.int32)
    weight = np.zeros((out, width), np.float32)
    for d, terms in enumerate(rows):
        for t, (s, w) in enumerate(terms):
            index[d, t] = s
            weight[d, t] = np.float32(w)
        index[d, len(terms):] = terms[-1][0]   # padding: weight 0 on a pixel already read
    return index, weight


class AreaResize:
    """Resizes uint8 [N, H, W] images to [N, h, w] as cv::resize(INTER_AREA) does, by lbc.native's kernel."""

    def __init__(self, source: tuple[int, int], out: tuple[int, int]) -> None:
        if not self.supported(source, out):
            raise ValueError(f"no native area resize for {source} -> {out} (see AreaResize.supported)")
        op = native.area_resize_op()
        if op is None:
            raise RuntimeError("lbc.native's area resize is not available here (AreaResize.available)")
        self._op = op
        self.source, self.out = source, out
        y_index, y_weight = area_tables(source[0], out[0])
        x_index, x_weight = area_tables(source[1], out[1])
        self._tables = tuple(torch.from_numpy(t) for t in (x_index, x_weight, y_index, y_weight))

    @staticmethod
    def supported(source: tuple[int, int], out: tuple[int, int]) -> bool:
        """Whether the kernel reproduces cv::resize here: a downscale on both axes, not both at integer ratios."""
        smaller = all(0 < o < s for s, o in zip(source, out, strict=True))
        return smaller and not all(integer_ratio(s, o) for s, o in zip(source, out, strict=True))

    @staticmethod
    def available() -> bool:
        return native.area_resize_op() is not None

    def __call__(self, images: np.ndarray, out: np.ndarray) -> None:
        """Writes images (uint8 [N, H, W], contiguous) resized into out (uint8 [N, h, w], each image's rows
        contiguous; a view such as a stack's newest frames will do)."""
        self._op(torch.from_numpy(images), torch.from_numpy(out), *self._tables)
