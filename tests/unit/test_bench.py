"""The throughput benchmark's ceiling, by hand."""

import pytest

from bench.throughput import ceiling_rate


def test_ceiling_adds_the_stages_per_core_and_a_gpu_learner_bounds_on_its_own():
    # 2 cores, each stage 10/s alone: a step costs 1/10 + 1/10 s of env and inference, ratio 2 / 40 of learner
    assert ceiling_rate(2, 10.0, 10.0, 40.0, 2.0, learner_on_gpu=False) == pytest.approx(2 / (0.1 + 0.1 + 0.05))
    # on a GPU the learner's 40 samples/s allow 20 agent steps/s, the cores 2 / 0.2 = 10: the cores bind
    assert ceiling_rate(2, 10.0, 10.0, 40.0, 2.0, learner_on_gpu=True) == pytest.approx(10.0)
    # a slow GPU learner binds: 8 samples/s at ratio 2 is 4 agent steps/s
    assert ceiling_rate(2, 10.0, 10.0, 8.0, 2.0, learner_on_gpu=True) == pytest.approx(4.0)
