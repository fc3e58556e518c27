"""`lbc report` on small fixed run folders, TensorBoard files read back with tensorboard's own reader,
and `lbc play` writing an mp4 of a real game (Atari, MinAtar) that decodes to the frames it played."""

import json
import re

import numpy as np
import pytest
from PIL import Image

from lbc.cli import build_parser, main
from lbc.config import load_config
from lbc.report import frames_at_version, load_run
from lbc.tensorboard import TensorBoardLog, region_value
from tests.support import run_folder_with_checkpoint


def _write_run(folder, preset, game, returns, evals):
    """A run folder as the launcher writes it: one progress record per 100k frames, version = record index."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(load_config(preset, [f"env.game={game}"]).model_dump_json())
    with (folder / "metrics.jsonl").open("w") as f:
        for i, ret in enumerate(returns):
            f.write(json.dumps({"time": 1000.0 + 10 * i, "frames": 100_000.0 * i, "version": float(i),
                                "mean_return_100": ret, "learner_steps": 10.0 * i}) + "\n")
        f.write('{"time": 1')   # a record cut short by a kill is skipped
    with (folder / "eval.jsonl").open("w") as f:
        for version, mean in evals:
            f.write(json.dumps({"version": version, "mean": mean, "std": 1.0, "episodes": 8, "policy": "greedy",
                                "epsilon": 0.01, "noop_max": 30, "sticky_actions": False}) + "\n")


def test_evaluations_sit_at_the_frames_their_version_was_published(tmp_path):
    _write_run(tmp_path / "a", "cpu", "breakout", [1.0, 2.0, 3.0, 4.0], [(0, 1.5), (2, 5.0), (9, 7.0)])
    run = load_run(tmp_path / "a")
    assert [e["frames"] for e in run.evals] == [0.0, 200_000.0]   # version 9 was never published in this log
    assert run.final_eval["mean"] == 5.0 and run.frames == 300_000.0
    assert frames_at_version(run.metrics, 1.5) == 200_000.0


def test_report_writes_plot_and_summary_with_aggregates(tmp_path, capsys):
    _write_run(tmp_path / "cpu-breakout", "cpu", "breakout", [1.5, 3.0, 6.0, 9.0], [(0, 1.5), (3, 12.0)])
    _write_run(tmp_path / "cpu-pong", "cpu", "pong", [-21.0, -20.0, -15.0, -5.0], [(0, -21.0), (3, 0.0)])
    _write_run(tmp_path / "impala-breakout", "impala", "breakout", [1.0, 1.5, 2.0, 2.0], [(1, 2.0)])
    runs = [str(tmp_path / n) for n in ("cpu-breakout", "cpu-pong", "impala-breakout")]
    assert main(["report", *runs, "--out", str(tmp_path / "out"), "--name", "r"]) == 0
    png, md = tmp_path / "out" / "r.png", (tmp_path / "out" / "r.md").read_text()
    image = np.asarray(Image.open(png).convert("RGB"))
    assert image.shape[0] >= 600 and image.shape[1] >= 1000          # two games: two rows of two panels
    colours = {tuple(c) for c in image.reshape(-1, 3)[::7]}
    assert (31, 119, 180) in colours and (255, 127, 14) in colours     # the first two runs' lines (C0, C1)
    assert "| cpu-breakout | cpu | breakout | 0.30M |" in md and "12.00 ± 1.00" in md
    # cpu over two games: HNS of the final scores, breakout (12 - 1.7) / 28.8 and pong (0 + 20.7) / 35.3
    expected_mean = 100 * ((12 - 1.7) / 28.8 + 20.7 / 35.3) / 2
    assert f"| {expected_mean:.1f}% |" in md and "## cpu: aggregates" in md and "## impala" not in md
    assert "IQM of HNS over 1 run(s) x 2 game(s)" in md
    assert "r.md" in capsys.readouterr().out


def test_a_minatar_run_is_named_by_its_game_and_reported_without_atari_no_ops(tmp_path):
    """MinAtar is evaluated as it is played, with its own sticky actions (0.1 in the preset): the protocol
    says so, also for evaluations logged before the evaluator recorded the probability it played with."""
    _write_run(tmp_path / "m", "minatar", "space_invaders", [1.0, 2.0], [(1, 3.0)])
    assert load_run(tmp_path / "m").game == "minatar-space_invaders"
    _write_run(tmp_path / "a", "cpu", "pong", [1.0, 2.0], [(1, 3.0)])
    assert main(["report", str(tmp_path / "m"), str(tmp_path / "a"), "--out", str(tmp_path), "--name", "r"]) == 0
    lines = (tmp_path / "r.md").read_text().splitlines()
    rows = {line.split(" | ")[0]: line for line in lines if line.startswith("| ")}
    row = rows["| m"]
    assert "| minatar-space_invaders |" in row and "no-ops" not in row and "greedy eps 0.01, 8 episodes" in row
    assert "sticky 0.1 |" in row and "no-ops 30, sticky no |" in rows["| a"]


def test_report_refuses_a_folder_without_metrics(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit, match="no metrics.jsonl"):
        main(["report", str(tmp_path / "empty")])


def test_tensorboard_files_read_back(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    log = TensorBoardLog(tmp_path / "tb")
    for i in range(3):
        log.write({"frames": 1000.0 * i, "mean_return_100": -20.0 + i, "eval_score": None if i == 0 else 5.0 * i,
                   "fps": 900.0, "losses": {"1/v": 0.5 / (i + 1), "2/pi": -0.1},
                   "bandit_top": {"tau_1": "[9.0,9.2)", "mixture": "=j3"}})
    log.close()
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"train/return100", "eval/score", "speed/frames_per_s", "loss/v/policy_1", "loss/pi/policy_2",
            "bandit/tau_1", "bandit/mixture"} <= tags
    assert [(e.step, e.value) for e in acc.Scalars("train/return100")] == [(0, -20.0), (1000, -19.0), (2000, -18.0)]
    assert [e.step for e in acc.Scalars("eval/score")] == [1000, 2000]
    assert acc.Scalars("bandit/tau_1")[0].value == pytest.approx(9.1)
    assert region_value("=j3") == 3.0 and region_value("odd") is None


def test_play_writes_a_video_of_the_frames_played(tmp_path, capsys):
    """A checkpoint (a fresh agent) plays real Breakout; the mp4 decodes to the frames played."""
    import imageio.v2 as imageio

    run = tmp_path / "run"
    run_folder_with_checkpoint(run, load_config("cpu", ["env.game=breakout", f"run_dir={run}"]), step=7, version=3)
    video = tmp_path / "out.mp4"
    args = build_parser().parse_args(["play", str(run), "--episodes", "1", "--video", str(video),
                                      "--max-frames", "600", "--version", "3"])
    from lbc.play import play_cli

    assert play_cli(args) == 0
    out = capsys.readouterr().out
    assert "version 3, learner step 7" in out and re.search(r"episode 1: score \d+", out)
    written = int(re.search(r"\((\d+) frames\)", out).group(1))
    # iterate: list() would ask the reader's length first, which is infinite for a stream
    frames = [frame for frame in imageio.get_reader(str(video), format="ffmpeg").iter_data()]
    assert len(frames) == written and 100 < written <= 600 + 30   # the cap, plus up to 30 no-ops
    assert frames[0].shape == (210, 160, 3) and frames[-1].std() > 0
    with pytest.raises(SystemExit, match="versions kept: \\[3\\]"):
        play_cli(build_parser().parse_args(["play", str(run), "--version", "99"]))


def test_play_draws_each_game_afresh(tmp_path, capsys):
    """Several games are several games: the policy's draws go on from game to game (reseeded per game, two
    games of the deterministic emulator were the same game, step for step). Fixed seeds: no flake."""
    run = tmp_path / "run"
    run_folder_with_checkpoint(run, load_config("cpu", ["env.game=breakout", f"run_dir={run}"]), step=7, version=3)
    from lbc.play import play_cli

    assert play_cli(build_parser().parse_args(["play", str(run), "--episodes", "3", "--max-frames", "3000",
                                               "--policy", "sample"])) == 0
    steps = [int(n) for n in re.findall(r"episode \d: score \d+ \((\d+) agent steps\)", capsys.readouterr().out)]
    assert len(steps) == 3 and len(set(steps)) == 3


def test_play_shows_a_minatar_board_and_takes_a_policy(tmp_path, capsys):
    """MinAtar runs play on the package's own game; the mp4 holds one board picture per agent step, each
    channel in its colour. --policy overrides the run's evaluation policy; Catch runs print scores only."""
    import imageio.v2 as imageio

    run = tmp_path / "run"
    run_folder_with_checkpoint(run, load_config("minatar", ["env.game=breakout", f"run_dir={run}"]), step=2, version=1)
    video = tmp_path / "board.mp4"
    args = build_parser().parse_args(["play", str(run), "--video", str(video), "--max-frames", "40",
                                      "--policy", "sample"])
    from lbc.play import board_image, play_cli

    assert play_cli(args) == 0
    out = capsys.readouterr().out
    assert "playing minatar-breakout" in out and "policy sample" in out
    steps = int(re.search(r"episode 1: score \d+ \((\d+) agent steps\)", out).group(1))
    frames = [frame for frame in imageio.get_reader(str(video), format="ffmpeg").iter_data()]
    assert len(frames) == steps == int(re.search(r"\((\d+) frames\)", out).group(1)) and 0 < steps <= 40
    assert frames[0].shape == (160, 160, 3) and frames[0].std() > 0
    board = np.zeros((4, 10, 10), np.uint8)
    board[1, 2, 3] = 255
    image = board_image(board, scale=2)
    assert image.shape == (20, 20, 3) and image[4:6, 6:8].any() and not image[:4].any()

    catch = tmp_path / "catch"
    run_folder_with_checkpoint(catch, load_config("catch", [f"run_dir={catch}"]), step=1, version=1)
    with pytest.raises(SystemExit, match="--video is for Atari and MinAtar"):
        play_cli(build_parser().parse_args(["play", str(catch), "--video", str(tmp_path / "c.mp4")]))
    assert play_cli(build_parser().parse_args(["play", str(catch), "--episodes", "2"])) == 0
    assert "over 2 episode(s)" in capsys.readouterr().out


def test_evaluate_scores_a_checkpoint_at_the_frames_it_was_written(tmp_path, capsys):
    """`lbc evaluate` (make curve's last step) plays the evaluator's games on the newest checkpoint and appends
    one record in the evaluator's form; `lbc report` places it at the frames the checkpoint was written at,
    after the periodic evaluations, as the final one."""
    import os

    from lbc.evaluate import frames_when_written

    run = tmp_path / "run"
    cfg = load_config("catch", [f"run_dir={run}"])
    run_folder_with_checkpoint(run, cfg, step=40, version=8)
    checkpoint = next((run / "checkpoints").glob("ckpt-*.pt"))
    os.utime(checkpoint, (1025.0, 1025.0))
    with (run / "metrics.jsonl").open("w") as f:   # a record every 10 s; the checkpoint came at 1025 s
        for i in range(5):
            f.write(json.dumps({"time": 1000.0 + 10 * i, "frames": 1000.0 * i, "version": float(2 * i),
                                "mean_return_100": 0.0, "learner_steps": 10.0 * i}) + "\n")
    with (run / "eval.jsonl").open("w") as f:
        f.write(json.dumps({"version": 2, "mean": -0.5, "std": 0.1, "episodes": 32}) + "\n")
    assert frames_when_written(run / "metrics.jsonl", 1025.0) == 2000.0
    assert frames_when_written(run / "metrics.jsonl", 999.0) is None
    assert frames_when_written(tmp_path / "missing.jsonl", 1025.0) is None

    assert main(["evaluate", str(run)]) == 0
    out = capsys.readouterr().out
    assert "version 8, learner step 40, 2,000 frames" in out and "over 32 games" in out
    records = [json.loads(line) for line in (run / "eval.jsonl").read_text().splitlines()]
    final = records[-1]
    assert len(records) == 2 and final["checkpoint"] == checkpoint.name and final["run_frames"] == 2000.0
    assert final["version"] == 8 and final["learner_step"] == 40 and final["episodes"] == 32
    assert len(final["scores"]) == 32 and set(final["scores"]) <= {-1.0, 1.0}   # Catch: a catch or a miss
    assert final["policy"] == "greedy" and final["noop_max"] == cfg.env.noop_max
    assert final["mean"] == pytest.approx(np.mean(final["scores"]))
    report_run = load_run(run)
    assert [e["frames"] for e in report_run.evals] == [1000.0, 2000.0]
    assert report_run.final_eval["checkpoint"] == checkpoint.name

    assert main(["evaluate", str(run), "--episodes", "3", "--no-record"]) == 0
    assert "over 3 games" in capsys.readouterr().out
    assert len((run / "eval.jsonl").read_text().splitlines()) == 2
    with pytest.raises(SystemExit, match="at least 1"):
        main(["evaluate", str(run), "--episodes", "0"])


def test_dead_torso_units_get_their_own_panel(tmp_path):
    _write_run(tmp_path / "plain", "cpu", "pong", [-21.0, -20.5], [(0, -21.0)])
    _write_run(tmp_path / "probed", "cpu", "pong", [-21.0, -20.5], [(0, -21.0)])
    with (tmp_path / "probed" / "metrics.jsonl").open("a") as f:   # after the cut record: a fresh line
        f.write("\n")
        for i, dead in enumerate([0.1, 0.5, 1.0]):
            f.write(json.dumps({"time": 2000.0 + i, "frames": 300_000.0 + 1e5 * i, "mean_return_100": -21.0,
                                "dead_units": {"convs.1": dead, "convs.3": dead / 2, "fc.1": 0.9}}) + "\n")
    widths = {}
    for name in ("plain", "probed"):
        assert main(["report", str(tmp_path / name), "--out", str(tmp_path / "out"), "--name", name]) == 0
        widths[name] = np.asarray(Image.open(tmp_path / "out" / f"{name}.png")).shape[1]
    assert widths["probed"] == widths["plain"] * 3 // 2   # a third panel beside the two
