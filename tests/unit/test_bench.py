"""The throughput benchmark's ceiling, by hand."""

import os
import re
import shlex
import subprocess
import sys
from itertools import count
from pathlib import Path

import numpy as np
import pytest

from bench.throughput import (
    argument_problem,
    build_parser,
    ceiling_rate,
    describe_cpu,
    in_turn,
    precision_lever,
    preset_config,
    stage_figures,
)
from lbc.config import load_config


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
    assert (cpu.preset, cpu.actors, cpu.actor_scaling, cpu.overrides) == ("cpu", None, "", [])   # from the stages
    chosen = _args("--preset", "impala", "--actors", "2")   # what the user names is kept
    apply_machine_defaults(chosen, gpu=True)
    assert (chosen.preset, chosen.actors, chosen.actor_scaling, chosen.overrides) == ("impala", 2, "", [])


def test_actors_fill_the_cores_acting_takes_at_the_ceiling():
    from bench.throughput import actors_to_fill
    # impala on 2 cores (measured stages): acting 1/2452 + 1/4888 s, learning 1/2497 s per agent step:
    # 2 x 0.612 / 1.013 = 1.21 cores of acting, more than one actor keeps busy
    assert actors_to_fill(2, 2452.0, 4888.0, 2497.0, 1.0) == 2
    # cpu: the learner's 2/1223 s per agent step leaves acting 0.54 of a core
    assert actors_to_fill(2, 2489.0, 4374.0, 1223.0, 2.0) == 1
    # a fast learner: acting takes nearly all 16 cores
    assert actors_to_fill(16, 1000.0, 1000.0, 1e9, 1.0) == 16
    # 2.05 cores of acting: a twentieth of a core is not worth a third actor
    assert actors_to_fill(41, 1.0, 1.0, 1.0, 38.0) == 2


def test_cpu_table_splits_the_window_by_service_and_agent_step():
    from bench.cpu_use import cpu_table
    start = {"learner_svc": 10.0, "actor_svc 0": 5.0}
    end = {"learner_svc": 22.0, "actor_svc 0": 11.0, "replay_svc": 0.6}   # replay started inside the window
    rows = cpu_table(start, end, seconds=10.0, agent_steps_per_s=1000.0, cores=2)
    assert rows[1].split() == ["learner_svc", "1.20", "1.200"]
    assert rows[2].split() == ["actor_svc", "0", "0.60", "0.600"]
    assert rows[3].split() == ["replay_svc", "0.06", "0.060"]
    assert rows[-2].split() == ["all", "services", "1.86", "1.860"]
    assert rows[-1].split()[:2] == ["idle", "0.14"]
    # the hypervisor took 0.1 of a core: no service is charged it, and it is not idle either
    rows = cpu_table(start, end, seconds=10.0, agent_steps_per_s=1000.0, cores=2, stolen=0.1)
    assert rows[-2].split()[:5] == ["taken", "by", "the", "hypervisor", "0.10"]
    assert rows[-1].split()[:2] == ["idle", "0.04"]


def test_ceiling_gap_parts_sum_to_the_windows_cpu_and_give_the_ratio():
    from bench.cpu_use import ceiling_gap, ceiling_gap_line, ratio_on_cores_left
    from bench.throughput import ceiling_rate
    # stages alone: games 4,000 agent steps/s a core, inference 4,000 samples/s, learner 10,000 samples/s, ratio 2
    env, inference, learner, ratio = 4000.0, 4000.0, 10000.0, 2.0
    acting_ms, learning_ms = (1 / env + 1 / inference) * 1e3, ratio / learner * 1e3   # 0.5 and 0.2
    ceiling = ceiling_rate(2, env, inference, learner, ratio, learner_on_gpu=False)      # 2 / 0.7 ms
    used = {"actor_svc 0": 0.6, "actor_svc 1": 0.6, "actor_svc eval": 0.2, "learner_svc": 0.5, "replay_svc": 0.06,
            "bandit_svc": 0.01, "lbc.launch": 0.01}                                   # 1.98 of 2 cores
    gap = ceiling_gap(used, cores=2, agent_steps_per_s=2000.0, acting_ms=acting_ms, learning_ms=learning_ms)
    by_hand = {"games and inference alone": 0.5, "learner alone": 0.2, "actors over their stages alone": 0.1,
               "learner over its stage alone": 0.05, "evaluator": 0.1, "replay": 0.03, "other services": 0.01,
               "taken by the hypervisor": 0.0, "idle cores": 0.01}
    assert gap == pytest.approx(by_hand)
    assert sum(gap.values()) == pytest.approx(2 / 2000.0 * 1e3)     # cores / agent steps/s, in ms
    assert 2000.0 / ceiling == pytest.approx(0.7)                   # the ratio the line reports
    assert "= 0.700 / 1.000 ms of CPU an agent step = 0.70" in ceiling_gap_line(gap)
    assert "evaluator +0.100" in ceiling_gap_line(gap)
    assert "hypervisor left" not in ceiling_gap_line(gap)
    # the hypervisor took 0.01 of the two cores (the idle share's worth here): the same ratio, its part named,
    # and the ratio on the cores it left: 0.7 / (1.0 - 0.005)
    gap = ceiling_gap(used, cores=2, agent_steps_per_s=2000.0, acting_ms=acting_ms, learning_ms=learning_ms,
                      stolen=0.01)
    assert gap == pytest.approx(by_hand | {"taken by the hypervisor": 0.005, "idle cores": 0.005})
    assert sum(gap.values()) == pytest.approx(1.0)
    assert ratio_on_cores_left(gap) == pytest.approx(0.7 / 0.995)
    assert "on the cores the hypervisor left, 0.70" in ceiling_gap_line(gap)
    # records before session 66 have no steal part
    old = {part: ms for part, ms in by_hand.items() if part != "taken by the hypervisor"}
    assert ratio_on_cores_left(old) == pytest.approx(0.7)


SPIN_3_S = "t = time.process_time(); exec('while time.process_time() - t < 3.0: pass')"   # 3 s of CPU


def _spinning_service_readings(read, spin: str, copies: int, wait: float, window: float) -> tuple:
    """Two readings of read(pid) `window` seconds apart, `wait` seconds after a parent (the launcher's place) started
    `copies` processes of one service (`-m learner_svc`), each running `spin`."""
    import time
    child = f"subprocess.Popen([sys.executable, '-c', {spin!r}, '-m', 'learner_svc'])"
    parent = subprocess.Popen([sys.executable, "-c", f"import subprocess, sys; ps = [{', '.join([child] * copies)}]; "
                               "[p.wait() for p in ps]"])
    try:
        time.sleep(wait)
        before = read(parent.pid)
        time.sleep(window)
        after = read(parent.pid)
    finally:
        parent.wait(timeout=60)
    return before, after


def test_service_cpu_seconds_counts_a_busy_child_under_its_service_name():
    from bench.cpu_use import service_cpu_seconds
    before, after = _spinning_service_readings(service_cpu_seconds, f"import time; {SPIN_3_S}", 1, 0.5, 1.0)
    assert "learner_svc" in after
    assert after["learner_svc"] - before.get("learner_svc", 0.0) > 0.3


def test_busiest_threads_show_two_spinners_on_one_core_waiting_for_it():
    from bench.cpu_use import busiest_threads, cpu_table, service_thread_seconds
    if not Path("/proc/self/task").exists() or not any(Path("/proc/self/task").glob("*/schedstat")):
        pytest.skip("the kernel keeps no schedstat here")
    core = min(os.sched_getaffinity(0))
    # two processes of one service spinning on the same core: each is always runnable, so between them the core is
    # busy and each waits for it about half of the time
    spin = f"import os, time; os.sched_setaffinity(0, {{{core}}}); {SPIN_3_S}"
    before, after = _spinning_service_readings(service_thread_seconds, spin, 2, 1.0, 1.5)
    ran, waited = busiest_threads(before, after, 1.5)["learner_svc"]
    assert 0.05 < ran < 0.7, ran
    assert waited > 0.3, waited
    assert ran + waited > 0.8   # spinning: never asleep
    # and a service whose thread started within the window counts it from zero
    assert busiest_threads({}, {"s": {1: (0.3, 0.2)}}, 1.0) == {"s": pytest.approx((0.3, 0.2))}
    assert busiest_threads({"s": {1: (0.1, 0.1)}}, {"s": {1: (0.3, 0.2), 2: (0.05, 0.0)}}, 2.0) == {
        "s": pytest.approx((0.1, 0.05))}
    rows = cpu_table({"s": 1.0}, {"s": 2.0}, 2.0, 1000.0, cores=2, threads={"s": (0.45, 0.12)})
    assert "waited for a core" in rows[0] and rows[1].split() == ["s", "0.50", "0.500", "0.45", "0.12"]


def _simulated_repeat_share(capacity, inserted, batch, period, periods, seed=0):
    """A FIFO replay by brute force: full at the start, `inserted` new sequences and `batch` distinct uniform
    draws per learner step; the share of draws already drawn since the period's start."""
    rng = np.random.default_rng(seed)
    newest = capacity   # keys 0 .. capacity - 1 stored
    seen, hits, draws = set(), 0, 0
    for step in range(period * periods):
        if step % period == 0:
            seen = set()   # the copy into the target network
        newest += inserted
        drawn = rng.choice(capacity, batch, replace=False) + newest - capacity
        hits += sum(int(k) in seen for k in drawn)
        draws += batch
        seen.update(int(k) for k in drawn)
    return hits / draws


@pytest.mark.parametrize(("capacity", "inserted", "batch", "period"),
                         [(2000, 8, 16, 250), (500, 16, 32, 100), (1000, 4, 8, 40)])
def test_target_repeat_share_matches_a_replay_drawn_by_brute_force(capacity, inserted, batch, period):
    from bench.throughput import target_repeat_share
    want = _simulated_repeat_share(capacity, inserted, batch, period, periods=30)
    assert target_repeat_share(capacity, inserted, batch, period) == pytest.approx(want, abs=0.015)
    assert target_repeat_share(capacity, inserted, batch, 0) == 0.0   # no target network


def test_the_learner_stage_keeps_the_previous_steps_keys_for_the_repeat_share():
    from bench.throughput import _replay_keyed
    batch = {"reset": np.zeros((16, 2), bool)}
    batches = _replay_keyed(batch, 0.25)
    steps = [next(batches)["key"].copy() for _ in range(5)]
    for before, after in zip(steps, steps[1:], strict=False):
        assert len(set(after)) == 16 and len(set(before) & set(after)) == 4
        assert min(set(after) - set(before)) > before.max()   # the others are new
    assert next(_replay_keyed(batch, 0.0))["param_version"].tolist() == [0] * 16


def test_the_learner_step_operation_count_grows_with_the_sequence_and_not_with_the_batch():
    """learner_operations: the launches of a step do not depend on the batch size (the docs compare presets by
    it), and each step of the unroll adds its recurrent core's and the loss's operations."""
    from bench.throughput import learner_operations
    from lbc.config import load_config
    catch = load_config("catch", ["sequence.length=10"])
    count = learner_operations(catch)
    assert learner_operations(catch, batch_size=7) == count
    # counted eagerly on the CPU whatever the run's GPU settings (gpu_checks.sh sets learner.cuda_graphs)
    assert learner_operations(load_config("catch", ["sequence.length=10", "learner.cuda_graphs=true"])) == count
    longer = learner_operations(load_config("catch", ["sequence.length=14"]))
    # four more steps: at least the LayerNorm-LSTM's 12 forward and 10 backward operations each (lbc.lstm_bptt)
    assert longer - count >= 4 * 22


def test_replay_waits_are_each_sides_waiting_seconds_over_the_window():
    from bench.system import replay_waits
    # 12 s held and 1.5 s waited before the window, 18 and 1.5 after it: over 20 s, 30% and none
    held, waited = replay_waits((12.0, 1.5), (18.0, 1.5), 20.0)
    assert held == pytest.approx(0.30) and waited == 0.0
    assert replay_waits((0.0, 0.0), (0.0, 5.0), 10.0) == (0.0, 0.5)


def test_the_precision_levers_measure_the_precision_the_preset_does_not_run_in():
    """--levers: a learner or actors running bf16 are measured in fp32 (the row read backwards), those running
    fp32 in bf16, each on its own stage."""
    cpu = ["learner.device=cpu", "actor.device=cpu"]
    assert precision_lever(load_config("impala", [*cpu, "learner.precision=bf16", "actor.precision=fp32"])) == {
        "learner in fp32": ("learner", ["learner.precision=fp32"]),
        "actor in bf16": ("inference", ["actor.precision=bf16"])}
    assert precision_lever(load_config("impala", [*cpu, "learner.precision=fp32", "actor.precision=bf16"])) == {
        "learner in bf16": ("learner", ["learner.precision=bf16"]),
        "actor in fp32": ("inference", ["actor.precision=fp32"])}


def test_the_frame_read_bench_times_every_read_and_leaves_the_current_read_in_place():
    """bench.frame_read takes turns between the reads (float32 and bfloat16 stacks, decision 65; bfloat16 from
    single frames, decision 66; those in blocks, decision 83) and puts lbc.nets.pixel_dtype and
    LBCNet.sequence_input back however it ends; each read's blocks time steps that really ran, with that read
    installed."""
    import lbc.nets
    from bench.frame_read import CURRENT, READS, interleaved

    original = lbc.nets.pixel_dtype, lbc.nets.LBCNet.sequence_input
    seen: list[tuple[object, object]] = []

    def step() -> float:
        seen.append((lbc.nets.pixel_dtype, lbc.nets.LBCNet.sequence_input))
        return 0.01

    medians = interleaved(step, rounds=2, block_seconds=0.03)
    assert set(medians) == set(READS) and all(abs(m - 0.01) < 1e-12 for m in medians.values())
    for read in READS.values():   # a warm-up step, then 3, in each of 2 rounds
        assert seen.count((read.pixel_dtype, read.sequence_input)) == 2 * (1 + 3)
    assert len(set(seen)) == len(READS) == 4 and READS[CURRENT].sequence_input is original[1]
    assert (lbc.nets.pixel_dtype, lbc.nets.LBCNet.sequence_input) == original


def test_the_end_to_end_window_counts_between_two_readings_and_refuses_a_restart():
    from bench.system import SystemReading, window_rates

    def reading(t: float, frames: float, steps: float) -> SystemReading:
        return SystemReading(time=t, frames=frames, learner_steps=steps, lag=None, cpu={}, target_cache=(0.0, 0.0),
                             replay_waits=(0.0, 0.0), learner_seconds={}, actor_seconds=(0.0, 0.0, 0.0))

    assert window_rates(reading(10.0, 4_000, 7), reading(14.0, 24_000, 15)) == (5_000.0, 2.0)
    with pytest.raises(RuntimeError, match="restarted"):   # an actor's counter started again from zero
        window_rates(reading(10.0, 4_000, 7), reading(14.0, 1_000, 15))
    with pytest.raises(RuntimeError, match="restarted"):   # the learner's
        window_rates(reading(10.0, 4_000, 7), reading(14.0, 24_000, 0))


@pytest.mark.parametrize("handles_ctrl_c", [True, False])
def test_a_launcher_left_by_a_failed_window_is_stopped_as_ctrl_c_stops_it_then_killed(handles_ctrl_c):
    import subprocess
    import sys
    import time

    from bench.system import stop_launcher

    # a stand-in for lbc.launch: exits 3 on SIGINT (as the launcher stops its services and exits), or ignores it
    code = ("import signal, sys, time\n"
            + ("signal.signal(signal.SIGINT, lambda *a: sys.exit(3))\n" if handles_ctrl_c else
               "signal.signal(signal.SIGINT, signal.SIG_IGN)\n")
            + "print('up', flush=True)\ntime.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "up\n"
    start = time.monotonic()
    stop_launcher(proc, grace=1.0)
    assert proc.returncode == (3 if handles_ctrl_c else -9)
    assert time.monotonic() - start < 10
    stop_launcher(proc)   # one that has ended already is left as it is


def test_the_warm_up_waits_for_every_service_to_answer_and_gives_up_on_a_launcher_that_ends(tmp_path):
    import time

    from bench.system import NotUp, _wait_until_up
    from tests.support import endpoint_overrides

    # fresh ports nobody listens on: the services of a launcher still starting
    endpoints = load_config("catch", endpoint_overrides(tmp_path)).endpoints
    starting = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        start = time.monotonic()
        with pytest.raises(NotUp, match=r"actor 0.*learner.*after 2 s"):
            _wait_until_up(starting, tmp_path, endpoints, actors=1, remote=False, limit=2.0)
        assert 2.0 <= time.monotonic() - start < 15.0
    finally:
        starting.kill()
        starting.wait()
    ended = subprocess.Popen([sys.executable, "-c", "raise SystemExit(4)"])
    ended.wait()
    with pytest.raises(RuntimeError, match="exited with 4 while its services started"):
        _wait_until_up(ended, tmp_path, endpoints, actors=1, remote=False, limit=60.0)


def test_a_benchmark_that_fails_late_keeps_what_it_measured(tmp_path, monkeypatch):
    import json

    import bench.throughput

    def stages_then_fail(args, cfg, record):   # the stages measured, then the first end-to-end window fails
        record["stages"] = _record()["stages"]
        raise RuntimeError("an actor did not answer")

    monkeypatch.setattr(bench.throughput, "stages", stages_then_fail)
    # main runs itself again (execve) with the services' environment where it lacks it: that would replace pytest
    for name, value in bench.throughput.SERVICE_ENV_DEFAULTS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(sys, "argv", ["bench.throughput", "--preset", "catch", "--out", str(tmp_path / "out")])
    with pytest.raises(RuntimeError, match="did not answer"):
        bench.throughput.main()
    kept = json.loads((tmp_path / "out" / "bench.json").read_text())
    assert kept["stages"] == _record()["stages"] and kept["preset"] == "catch"
    assert (tmp_path / "out" / "bench.png").exists()


def test_the_learner_step_split_is_each_parts_seconds_per_step_in_the_window():
    from bench.system import SystemReading, learner_step_split

    def reading(steps: float, seconds: dict[str, float]) -> SystemReading:
        return SystemReading(time=0.0, frames=0.0, learner_steps=steps, lag=None, cpu={}, target_cache=(0.0, 0.0),
                             replay_waits=(0.0, 0.0), learner_seconds=seconds, actor_seconds=(0.0, 0.0, 0.0))

    # 4 steps: 0.2 s waiting for batches, 0.6 s of loss and backward, device_wait first seen at the end
    split = learner_step_split(reading(10, {"batch": 1.0, "loss_backward": 2.0}),
                               reading(14, {"batch": 1.2, "loss_backward": 2.6, "device_wait": 0.4}))
    assert split == pytest.approx({"batch": 50.0, "loss_backward": 150.0, "device_wait": 100.0})
    assert list(split) == ["batch", "loss_backward", "device_wait"]   # in the loop's order (PARTS)
    assert learner_step_split(reading(10, {"batch": 1.0}), reading(10, {"batch": 2.0})) == {}


def test_the_learner_levers_measure_what_the_preset_does_not_run():
    from bench.throughput import learner_levers

    # `cpu` keeps its target network's outputs (that row reads backwards) and prepares each batch in its step
    scripted = "learner.native_unroll=false"
    plain = "learner.frame_blocks=false"
    torchs = "learner.native_stacks=false"
    assert learner_levers(load_config("cpu", ["learner.precision=fp32", scripted, plain])) == {
        "batches prepared ahead": ("learner", ["learner.prepare_ahead=True"]),
        "target outputs not kept": ("learner", ["learner.target_cache=false"])}
    # a learner that prepares ahead is measured without
    assert learner_levers(load_config("cpu", ["learner.precision=fp32", "learner.prepare_ahead=true"]))[
        "batches not prepared ahead"] == ("learner", ["learner.prepare_ahead=False"])
    # `impala` does neither and has no target network: preparing ahead is the one lever
    assert learner_levers(load_config("impala", ["learner.precision=fp32", scripted, plain])) == {
        "batches prepared ahead": ("learner", ["learner.prepare_ahead=True"])}
    # where lbc.native's unroll runs (make install builds it; decision 90), the LSTM by TorchScript, read backwards;
    # not with the feed-forward core or a GPU learner
    assert learner_levers(load_config("impala", ["learner.precision=fp32"]))["LSTM by TorchScript"] == (
        "learner", [scripted])
    assert "LSTM by TorchScript" not in learner_levers(load_config("impala-cpu", []))
    # on a CPU both read their frames in blocks, in bf16 (decision 83) and float32 (decision 92), read backwards; a
    # deep torso cannot
    for precision in ("bf16", "fp32"):
        assert learner_levers(load_config("impala", [f"learner.precision={precision}"]))["frames not in blocks"] == (
            "learner", ["learner.frame_blocks=false"])
        assert "frames not in blocks" in learner_levers(load_config("cpu", [f"learner.precision={precision}"]))
    assert "frames not in blocks" not in learner_levers(load_config("cpu", ["learner.precision=bf16",
                                                                            "learner.frame_blocks=false"]))
    assert "frames not in blocks" not in learner_levers(load_config("cpu", ["learner.precision=bf16",
                                                                            "net.torso=deep"]))
    # where lbc.native writes the blocks' stacks (decision 96), torch's passes, read backwards; not where the frames
    # are not in blocks (a row would measure the preset again) or the preset has torch write them already
    for precision in ("bf16", "fp32"):
        assert learner_levers(load_config("cpu", [f"learner.precision={precision}"]))["stacks by torch's passes"] == (
            "learner", [torchs])
    for settings in ([plain], [torchs], ["net.torso=deep"]):
        assert "stacks by torch's passes" not in learner_levers(load_config("cpu", settings))


def test_the_actor_levers_measure_the_stacks_read_whole_and_the_ring_pushed_by_torch():
    """Decisions 85, 92 and 97: a CPU actor with a small torso reads its stacks through a frame ring, in bf16 or
    float32, pushed by lbc.native, and --levers measures its inference with the stacks read whole and with the ring
    pushed by torch's passes (rows read backwards); the deep torso and a ring turned off have no row, a ring set to
    torch's passes no row for them."""
    from bench.throughput import actor_levers

    for precision in ("bf16", "fp32"):
        assert actor_levers(load_config("impala", [f"actor.precision={precision}"])) == {
            "stacks read whole": ("inference", ["actor.frame_ring=false"]),
            "ring pushed by torch's passes": ("inference", ["actor.native_ring=false"])}
        assert "stacks read whole" in actor_levers(load_config("cpu", [f"actor.precision={precision}"]))
    assert actor_levers(load_config("cpu", ["actor.native_ring=false"])) == {
        "stacks read whole": ("inference", ["actor.frame_ring=false"])}
    for off in (["actor.precision=fp32", "actor.frame_ring=false"], ["actor.precision=bf16", "actor.frame_ring=false"],
                ["actor.precision=bf16", "net.torso=deep"]):
        assert actor_levers(load_config("cpu", off)) == {}, off


def test_the_games_lever_measures_screens_resized_by_ale_where_lbc_native_resizes_them():
    """Decision 94: where lbc.native resizes the Atari screens, --levers measures the games with ALE resizing them
    (read backwards); games that are not Atari, or set to ALE's resize, have no row."""
    from bench.throughput import env_levers, stage_step
    from lbc import native

    problem = native.unavailable()
    if problem is not None and "AVX2" in problem:
        pytest.skip(problem)
    assert env_levers(load_config("impala")) == {"screens resized by ALE": ("environment", ["env.native_resize=false"])}
    assert env_levers(load_config("cpu", ["env.native_resize=false"])) == {}
    assert env_levers(load_config("catch")) == {}
    step, samples = stage_step(load_config("cpu", ["env.num_envs=2"]), "environment")
    assert samples == 2 and step() > 0   # the CPU seconds of one step of the games


def test_an_actors_loop_split_is_each_parts_milliseconds_per_loop_and_adds_up_to_the_window():
    from bench.system import SystemReading, actor_loop_split

    def reading(t: float, frames: float, seconds: tuple[float, float, float]) -> SystemReading:
        return SystemReading(time=t, frames=frames, learner_steps=0.0, lag=None, cpu={}, target_cache=(0.0, 0.0),
                             replay_waits=(0.0, 0.0), learner_seconds={}, actor_seconds=seconds)

    # two actors of 32 games at 4 frames a step for 10 s: 200 loops each, 400 in all (25,600 frames each);
    # their seconds summed: games 8, inference 6, waiting for replay 4, so 2 s of the 20 went elsewhere
    split = actor_loop_split(reading(5.0, 1_000, (1.0, 1.0, 1.0)), reading(15.0, 1_000 + 2 * 25_600, (9.0, 7.0, 5.0)),
                             actors=2, frames_per_loop=32 * 4)
    assert split == pytest.approx({"games": 20.0, "inference": 15.0, "waiting for replay": 10.0, "the rest": 5.0})
    assert sum(split.values()) == pytest.approx(1e3 * 10.0 * 2 / 400)   # each loop's share of the actors' time
    assert actor_loop_split(reading(5.0, 1_000, (0.0,) * 3), reading(6.0, 1_000, (0.0,) * 3), 1, 128) == {}


def test_the_inference_services_passes_are_read_per_pass_in_the_window():
    from bench.system import SystemReading, inference_passes

    def reading(t: float, counts: tuple[float, ...]) -> SystemReading:
        return SystemReading(time=t, frames=0.0, learner_steps=0.0, lag=None, cpu={}, target_cache=(0.0, 0.0),
                             replay_waits=(0.0, 0.0), learner_seconds={}, actor_seconds=(0.0,) * 3, inference=counts)

    # 10 s: 250 passes answering 4,000 requests of 32 games, 2.5 s of forward passes
    passes = inference_passes(reading(5.0, (50, 800, 25_600, 0.5)), reading(15.0, (300, 4_800, 153_600, 3.0)))
    assert passes == pytest.approx({"passes/s": 25.0, "requests a pass": 16.0, "games a pass": 512.0,
                                    "forward ms a pass": 10.0})
    assert inference_passes(reading(5.0, ()), reading(15.0, ())) == {}   # local inference: no service
    assert inference_passes(reading(5.0, (3, 3, 96, 0.1)), reading(6.0, (3, 3, 96, 0.1))) == {}


def test_the_inference_lever_is_the_other_way_of_inference_where_the_family_has_two():
    from bench.throughput import other_inference

    assert other_inference(load_config("impala")) == "remote"
    assert other_inference(load_config("lbc-bm", ["actor.inference=remote"])) == "local"
    assert other_inference(load_config("ngu")) is None   # its actors need networks of their own


def _record() -> dict:
    return {"machine": "x86_64", "cores": 2, "preset": "impala", "game": "pong", "settings": [], "torch": "2",
            "time": 0.0,
            "stages": {"environment_agent_steps_per_s": 2000.0, "inference_samples_per_s": 6000.0,
                       "learner_samples_per_s": 4000.0, "learner_step_ms": {"copy": 1.0},
                       "ceiling_frames_per_s": 9000.0},
            "levers": [{"lever": "learner in fp32", "stage": "learner", "rate": 3000.0, "gain": 0.75,
                        "ceiling_frames_per_s": 8000.0}],
            "end_to_end": [{"actors": 1, "frames_per_s": 5000.0, "learner_steps_per_s": 2.0, "held": 0.0,
                            "waited": 0.5},
                           {"actors": 2, "frames_per_s": 7000.0, "learner_steps_per_s": 3.0, "held": 0.25,
                            "waited": 0.0}],
            "actors": 2, "ratio": 0.78, "agent_steps_per_s": 1750.0, "cpu": {"actor_svc 0": 0.7, "learner_svc": 0.9},
            "ceiling_gap_ms": {"games and inference alone": 0.4, "learner alone": 0.2,
                               "actors over their stages alone": 0.05, "learner over its stage alone": -0.01,
                               "evaluator": 0.05, "replay": 0.02, "other services": 0.0, "idle cores": 0.01},
            "other_inference": {"inference": "remote", "frames_per_s": 6000.0, "x": 0.86}}


def test_a_bench_record_is_written_as_json_and_drawn(tmp_path):
    import json

    from bench.record import throughput_bars, write

    record = _record()
    data, picture = write(record, tmp_path / "out")
    assert json.loads(data.read_text()) == record
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [v for _, v in throughput_bars(record)] == [9000.0, 5000.0, 7000.0, 6000.0]
    # a run without stages (--end-to-end-only) has no ceiling and no levers, and still draws what it has
    partial = {k: v for k, v in record.items()
               if k not in ("stages", "levers", "ratio", "other_inference", "ceiling_gap_ms")}
    assert [v for _, v in throughput_bars(partial)] == [5000.0, 7000.0]
    assert write(partial, tmp_path / "partial")[1].exists()
    # the stages alone again after the window: their ceiling drawn last
    after = record | {"stages_after": {"ceiling_frames_per_s": 8000.0, "ratio_to_mean_ceiling": 0.82}}
    assert [v for _, v in throughput_bars(after)] == [9000.0, 5000.0, 7000.0, 6000.0, 8000.0]
    assert write(after, tmp_path / "after")[1].exists()
    # a window the hypervisor took cores from: drawn as a part of its own beside the idle cores
    gap = record["ceiling_gap_ms"] | {"taken by the hypervisor": 0.1}
    assert write(record | {"stolen_cores": 0.175, "ceiling_gap_ms": gap}, tmp_path / "stolen")[1].exists()


def test_the_drift_line_reads_achieved_against_the_mean_of_the_ceilings_before_and_after_the_window():
    from bench.throughput import drift_line
    # 2,000 agent steps/s before, 1,500 after (-25%), 1,400 achieved: 1,400 / 1,750 = 0.80; 4 frames a step
    line = drift_line(2000.0, 1500.0, 1400.0, 4)
    assert line == ("ceiling 6,000 frames/s (before the window 8,000: -25%); achieved / the two ceilings' mean = "
                    "0.80")
    assert "(before the window 8,000: +0%)" in drift_line(2000.0, 2000.0, 1800.0, 4)


def test_records_compare_side_by_side_by_their_main_run(tmp_path):
    import json

    from bench.record import compare, main, write

    record = _record()
    write(record, tmp_path / "a")
    runs = [{**run, "learner_bound_frames_per_s": 4_800.0} for run in record["end_to_end"]]
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "7.json").write_text(json.dumps({**record, "actors": 1, "end_to_end": runs,
                                                       "settings": ["actor.inference=remote"]}))
    header, a, b = compare([tmp_path / "a", tmp_path / "b" / "7.json"])
    assert header.split()[:2] == ["run", "frames/s"]
    # a: its 2-actor run, ratio, 3.00 steps/s, no learner bound recorded, 25% held, 0% waited, no steal time
    # recorded (before session 66), no GPU, (0.7 + 0.9) / 1750 s = 0.914 ms
    assert a.split()[-9:] == ["7,000", "0.78", "3.00", "-", "25%", "0%", "-", "-", "0.914"]
    assert b.startswith("b/7: ") and "actor.inference=remote" in b
    assert b.split()[-9:-5] == ["5,000", "0.78", "2.00", "4,800"]
    (tmp_path / "d.json").write_text(json.dumps({**record, "stolen_cores": 0.14}))
    assert compare([tmp_path / "d.json"])[1].split()[-3] == "0.14"
    # drawn side by side too, a record without the step's and the loop's parts (a) beside one with them (c)
    (tmp_path / "c.json").write_text(json.dumps({**record, "learner_step_ms": {"device_wait": 80.0, "batch": 5.0},
                                                 "actor_loop_ms": {"games": 20.0, "inference": 7.0}}))
    picture = tmp_path / "runs.png"
    assert main([str(tmp_path / "a"), str(tmp_path / "c.json"), "--picture", str(picture)]) == 0
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_records_of_one_name_from_several_hosts_keep_their_own_bars_and_machines(tmp_path):
    import json

    from bench.record import bar_names, compare, main

    record = _record()
    hosts = (("zen4-s56", "AMD EPYC (family 25 model 17)"), ("amx-s54", "Intel Xeon (family 6 model 167)"))
    for host, machine in hosts:
        (tmp_path / host).mkdir()
        (tmp_path / host / "cpu.json").write_text(json.dumps({**record, "machine": machine}))
    paths = [tmp_path / "zen4-s56" / "cpu.json", tmp_path / "amx-s54" / "cpu.json"]
    _, zen4, amx = compare(paths)
    assert zen4.startswith("zen4-s56/cpu: ") and "[AMD EPYC (family 25 model 17)]" in zen4
    assert "[Intel Xeon (family 6 model 167)]" in amx
    # one machine: no machine in the labels
    assert "[" not in compare([tmp_path / "zen4-s56" / "cpu.json"])[1].split("  ")[0]
    assert bar_names(["zen4-s56/cpu", "amx-s54/cpu"]) == ["zen4-s56/cpu", "amx-s54/cpu"]
    assert bar_names(["a", "b/7"]) == ["a", "7"]
    assert main([*map(str, paths), "--picture", str(tmp_path / "hosts.png")]) == 0


def test_the_machine_line_tells_apart_hosts_of_one_name_by_generation_and_bf16():
    zen3 = "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 1\nmodel name\t: AMD EPYC\n" \
           "processor\t: 1\ncpu family\t: 25\nmodel\t\t: 1\nmodel name\t: AMD EPYC\n"
    zen4 = zen3.replace("model\t\t: 1", "model\t\t: 17")
    assert describe_cpu(zen3, "AVX2", False) == "AMD EPYC (family 25 model 1), AVX2, no bf16 in hardware"
    assert describe_cpu(zen4, "AVX512", True) == "AMD EPYC (family 25 model 17), AVX512, bf16 in hardware"
    assert describe_cpu("", "DEFAULT", False).endswith(", DEFAULT, no bf16 in hardware")


def test_the_machine_line_says_when_mps_shares_the_gpu(tmp_path):
    """MPS counts as on where its control daemon's pipe is in the directory CUDA would look in."""
    from bench.throughput import under_mps

    pipes = tmp_path / "mps"
    assert not under_mps({"CUDA_MPS_PIPE_DIRECTORY": str(pipes)})
    pipes.mkdir()
    (pipes / "control").touch()
    assert under_mps({"CUDA_MPS_PIPE_DIRECTORY": str(pipes)})


def test_the_learner_bound_counts_each_sequences_new_steps_once_per_replay_ratio():
    from bench.throughput import learner_bound_frames

    # lbc-bm: 64 sequences of 80 new steps (burn-in 40 not counted), 4 frames a step, each trained on twice
    assert learner_bound_frames(load_config("lbc-bm"), 4.0) == pytest.approx(4.0 * 64 * 80 * 4 / 2)   # 40,960
    # two replicas of 32 sequences make the same group step
    two = load_config("lbc-bm", ["learner.replicas=2", "learner.batch_size=32"])
    assert learner_bound_frames(two, 4.0) == pytest.approx(40_960.0)
    # impala: 32 sequences of 20 steps, ratio 1
    assert learner_bound_frames(load_config("impala"), 1.0) == pytest.approx(2_560.0)


def test_a_split_whose_rest_is_below_zero_says_the_system_was_still_starting():
    from bench.throughput import split_line

    line = split_line("an actor's loop", "its 16 games stepped once", {"games": 20.7, "inference": 36.3,
                                                                        "the rest": -12.0})
    assert "45.0 in all" in line and "still starting" in line
    assert "still starting" not in split_line("an actor's loop", "x", {"games": 20.0, "the rest": 1.0})


def test_the_bench_plays_the_presets_own_game_unless_told_and_names_a_bad_one():
    """Without --game each preset measures its own game (the launcher's --game gets a name it takes); a game
    the preset's kind does not have is a ValueError naming it, which main() turns into a usage error."""
    assert preset_config("cpu", None, [])[1] == "pong"
    cfg, game = preset_config("minatar", None, [])
    assert (cfg.env.kind, game) == ("minatar", "breakout")
    assert preset_config("catch", None, [])[1] == "catch"
    assert preset_config("cpu", "breakout", [])[0].env.game == "breakout"
    with pytest.raises(ValueError, match="env.game|MinAtar game"):
        preset_config("minatar", "pong", [])


def _dry_run(root: Path, *argv: str) -> list[list[str]]:
    """bench/gpu_checks.sh's commands for argv (DRY=1: printed, not run), each split as the shell would."""
    done = subprocess.run(["bash", str(root / "bench" / "gpu_checks.sh"), *argv], cwd=root, capture_output=True,
                          text=True, env={**os.environ, "DRY": "1"}, timeout=60)
    assert done.returncode == 0 and "no check" not in done.stderr, done.stderr
    return [shlex.split(line.removeprefix("DRY-RUN ")) for line in done.stdout.splitlines()
            if line.startswith("DRY-RUN ")]


def test_every_gpu_check_names_valid_settings_and_selects_tests():
    """bench/gpu_checks.sh runs on a lent GPU machine's few minutes: a stale setting or an empty test selection there
    costs a run. Its dry run prints every check's command: each bench.throughput command is parsed and its
    configuration validated here as the bench would, and each pytest selection collected."""
    root = Path(__file__).resolve().parents[2]
    script = (root / "bench" / "gpu_checks.sh").read_text()
    names = re.findall(r"^ {8}(\w+)\) ", script[script.index("check() {"):script.index("    esac")], re.MULTILINE)
    assert {"1", "4", "9", "t", "msl", "msl1", "mgl"} <= set(names)
    every = _dry_run(root, "runs", *names)
    for group in ("1", "2", "all"):   # the parts name checks that exist
        assert _dry_run(root, group)
    benches = [command[1:] for command in every if command[0] == "bench.throughput"]
    selections = [command[1:] for command in every if command[0] == "pytest"]
    assert (len(benches), len(selections)) == (len(names) - 2, 2)   # t and 9 run tests, every other check a system
    for argv in benches:
        args = _args(*argv)
        assert argument_problem(args) == "", argv
        cfg, _ = preset_config(args.preset, args.game, args.overrides)   # raises on a stale or invalid setting
        assert cfg.actor.device == "cuda"
    for selection in selections:
        done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                               *selection], cwd=root, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]   # 5: nothing selected
        assert re.search(r"^\d+(/\d+)? tests? collected", done.stdout, re.MULTILINE), done.stdout[-500:]


def test_a_lever_measured_in_turn_with_the_preset_is_not_fooled_by_a_steady_drift():
    calls = count()

    def drifting(seconds_a_step: float):   # every step of either arm costs 0.1% more than the one before
        return lambda: seconds_a_step * (1 + 0.001 * next(calls))

    preset, lever = in_turn([(drifting(0.010), 10), (drifting(0.008), 10)], seconds=1.0)
    assert lever / preset == pytest.approx(1.25, rel=0.01)   # the lever's steps are 0.8 of the preset's
    # one after the other, as the levers were measured before: the same drift reads as a smaller gain
    first = stage_figures(drifting(0.010), 10, 1.0)["samples_per_cpu_s"]
    then = stage_figures(drifting(0.008), 10, 1.0)["samples_per_cpu_s"]
    assert then / first < 1.2
