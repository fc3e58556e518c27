"""The throughput benchmark's ceiling, by hand."""

import pytest

from bench.throughput import build_parser, ceiling_rate


def test_ceiling_adds_the_stages_per_core_and_a_gpu_learner_bounds_on_its_own():
    # 2 cores, each stage 10/s alone: a step costs 1/10 + 1/10 s of env and inference, ratio 2 / 40 of learner
    assert ceiling_rate(2, 10.0, 10.0, 40.0, 2.0, learner_on_gpu=False) == pytest.approx(2 / (0.1 + 0.1 + 0.05))
    # on a GPU the learner's 40 samples/s allow 20 agent steps/s, the cores 2 / 0.2 = 10: the cores bind
    assert ceiling_rate(2, 10.0, 10.0, 40.0, 2.0, learner_on_gpu=True) == pytest.approx(10.0)
    # a slow GPU learner binds: 8 samples/s at ratio 2 is 4 agent steps/s
    assert ceiling_rate(2, 10.0, 10.0, 8.0, 2.0, learner_on_gpu=True) == pytest.approx(4.0)


def _args(*argv):
    return build_parser().parse_args(list(argv))


def test_a_plain_bench_measures_the_paper_preset_on_a_gpu_and_the_default_on_a_cpu():
    from bench.throughput import apply_machine_defaults
    gpu = _args()
    apply_machine_defaults(gpu, gpu=True)
    assert (gpu.preset, gpu.actors, gpu.actor_scaling, gpu.overrides) == \
        ("lbc-bm", 12, "1,2,4,8,12", ["actor.device=cuda"])
    cpu = _args()
    apply_machine_defaults(cpu, gpu=False)
    assert (cpu.preset, cpu.actors, cpu.actor_scaling, cpu.overrides) == ("cpu", 1, "", [])
    chosen = _args("--preset", "impala", "--actors", "2")   # what the user names is kept
    apply_machine_defaults(chosen, gpu=True)
    assert (chosen.preset, chosen.actors, chosen.actor_scaling, chosen.overrides) == ("impala", 2, "", [])
