"""Decision 94: ALE's screens resized by lbc.native as cv::resize(INTER_AREA) resizes them in ale-py, to the bit.

The reference is ALE itself: the same games, seeds and actions with ALE resizing (its 84x84 observations) and with
lbc.screens resizing its unresized 210x160 screens must give the same observations, episode ends and cut episodes'
last observations. The tables are checked against hand-derived values and a plain loop of OpenCV's order."""

import numpy as np
import pytest

from lbc import native
from lbc.config import load_config
from lbc.envs import AtariEnvs
from lbc.screens import AreaResize, area_tables
from tests.support import same_play


def _resize_here() -> None:
    """make install builds lbc.native (decisions 90, 94): a test fails where it is missing, and is skipped only
    on a CPU the build does not target."""
    problem = native.unavailable()
    if problem is not None and "AVX2" in problem:
        pytest.skip(problem)
    assert problem is None, problem
    assert AreaResize.available()


def test_the_tables_of_a_non_integer_ratio_by_hand():
    """5 -> 2 (scale 2.5): output 0 covers [0, 2.5), output 1 [2.5, 5); weights 1/2.5 for whole pixels, 0.5/2.5 for
    the halves; padded with weight 0. 160 -> 84: every output's weights sum to 1 and it reads at most 3 pixels."""
    index, weight = area_tables(5, 2)
    np.testing.assert_array_equal(index, [[0, 1, 2], [2, 3, 4]])
    np.testing.assert_array_equal(weight, np.float32([[0.4, 0.4, 0.2], [0.2, 0.4, 0.4]]))
    index, weight = area_tables(160, 84)
    assert index.shape == (84, 3) and index.min() == 0 and index.max() == 159
    np.testing.assert_allclose(weight.astype(np.float64).sum(1), 1.0, atol=1e-6)
    assert (np.diff(index, axis=1) >= 0).all()   # OpenCV's order: each output's pixels left to right
    with pytest.raises(ValueError, match="downscale"):
        area_tables(84, 84)


def test_supported_sizes():
    assert AreaResize.supported((210, 160), (84, 84))
    assert not AreaResize.supported((210, 160), (160, 160))     # not a downscale on both axes
    assert not AreaResize.supported((210, 160), (21, 16))       # both integer ratios: OpenCV's other path


def _plain_area_resize(image: np.ndarray, out_h: int, out_w: int) -> np.ndarray:
    """OpenCV's resizeArea_ loop for one channel, written plainly in float32: each source row's horizontal sums
    (buf[dx] += S[sx] * alpha, table order), then the rows' weighted sum per output row, rounded half to even."""
    y_index, y_weight = area_tables(image.shape[0], out_h)
    x_index, x_weight = area_tables(image.shape[1], out_w)
    out = np.zeros((out_h, out_w), np.uint8)
    for dy in range(out_h):
        total = np.zeros(out_w, np.float32)
        for t in range(y_index.shape[1]):
            buf = np.zeros(out_w, np.float32)
            row = image[y_index[dy, t]].astype(np.float32)
            for dx in range(out_w):
                for s in range(x_index.shape[1]):
                    buf[dx] = np.float32(buf[dx] + np.float32(row[x_index[dx, s]] * x_weight[dx, s]))
            total = (total + y_weight[dy, t] * buf).astype(np.float32)
        out[dy] = np.clip(np.rint(total), 0, 255)
    return out


def test_the_kernel_against_a_plain_loop_of_opencvs_order():
    _resize_here()
    rng = np.random.default_rng(0)
    for (h, w), (oh, ow) in [((210, 160), (84, 84)), ((37, 29), (11, 13)), ((9, 7), (4, 3))]:
        images = rng.integers(0, 256, (3, h, w), dtype=np.uint8)
        images[1] = 255   # the saturating end
        out = np.zeros((3, oh, ow), np.uint8)
        AreaResize((h, w), (oh, ow))(images, out)
        for i in range(3):
            np.testing.assert_array_equal(out[i], _plain_area_resize(images[i], oh, ow), err_msg=f"{(h, w)} {i}")
        assert (out[1] == 255).all()


@pytest.mark.parametrize("game", ["pong", "breakout", "ms_pacman"])
def test_atari_frames_resized_here_are_ales_to_the_bit(game):
    """Both paths over 300 steps of random play in 4 games, with a 600-frame cap so that episodes are cut (and
    start again in the same step, their older frames blank) several times."""
    _resize_here()
    cfg = load_config("cpu", [f"env.game={game}", "env.max_episode_frames=600"]).env
    ours, ales = AtariEnvs(cfg, 4, seed=3), AtariEnvs(cfg.model_copy(update={"native_resize": False}), 4, seed=3)
    assert (ours.resized_by, ales.resized_by) == ("lbc.native", "ALE")
    cuts = 0
    for a, b in same_play(ours, ales, 300, seed=0):
        assert (a.final_obs is None) == (b.final_obs is None)
        if a.final_obs is not None:
            np.testing.assert_array_equal(a.final_obs[a.truncated], b.final_obs[b.truncated])
            cuts += int(a.truncated.sum())
    assert cuts >= 4
    np.testing.assert_array_equal(ours.restart(), ales.restart())
    ours.close()
    ales.close()


def test_without_the_library_ale_resizes_and_the_log_says_why(monkeypatch, tmp_path, caplog):
    monkeypatch.setattr(native, "LIBRARY", tmp_path / "liblbc_native.so")
    native.load.cache_clear()
    native.area_resize_op.cache_clear()
    try:
        with caplog.at_level("WARNING", logger="lbc.native"):
            envs = AtariEnvs(load_config("cpu").env, 2, seed=0)
        assert envs.resized_by == "ALE" and "resized by ALE's own code" in caplog.text
        assert envs.reset().shape == (2, 4, 84, 84)
        envs.close()
    finally:
        native.load.cache_clear()
        native.area_resize_op.cache_clear()
