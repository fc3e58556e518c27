"""Every entry point answers --help, and bad configuration stops a service with the field named."""

import subprocess
import sys

import pytest

from tests.support import REPO


@pytest.mark.parametrize("module", ["actor_svc", "learner_svc", "replay_svc", "bandit_svc", "lbc.launch",
                                    "bench.throughput"])
def test_help(module):
    out = subprocess.run([sys.executable, "-m", module, "--help"], cwd=REPO, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and "usage:" in out.stdout and "--preset" in out.stdout


def test_invalid_configuration_stops_with_the_field_named():
    out = subprocess.run([sys.executable, "-m", "replay_svc", "--set", "replay.replay_ratio=-1"], cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "replay.replay_ratio" in out.stderr


def test_lbc_command_help():
    out = subprocess.run([sys.executable, "-m", "lbc.cli", "--help"], cwd=REPO, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and all(cmd in out.stdout for cmd in ("scale", "autoscale", "health"))


def test_deployment_replicas_get_distinct_seeds():
    from actor_svc.__main__ import actor_seed
    # every replica of a Deployment runs index 0: the pod name must separate them, reproducibly
    assert actor_seed(0, 0, "lbc-actor-7d9f-abcde") != actor_seed(0, 0, "lbc-actor-7d9f-fghij")
    assert actor_seed(0, 0, "lbc-actor-7d9f-abcde") == actor_seed(0, 0, "lbc-actor-7d9f-abcde")
    assert actor_seed(5, 1, None) == 5 + 9973


def test_scaling_without_a_cluster_says_so_in_one_line(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "KUBECONFIG": str(tmp_path / "missing")}
    out = subprocess.run([sys.executable, "-m", "lbc.cli", "scale", "actors", "2"], cwd=REPO, capture_output=True,
                         text=True, timeout=60, env=env)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert out.stderr.startswith("lbc scale: no usable Kubernetes configuration") and "--kubeconfig" in out.stderr


def test_autoscale_help_describes_it_with_defaults():
    out = subprocess.run([sys.executable, "-m", "lbc.cli", "autoscale", "--help"], cwd=REPO, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0 and "ScalePolicy(" not in out.stdout and "(default: 16)" in out.stdout


def test_config_show_prints_the_resolved_preset_with_overrides(capsys, monkeypatch):
    import json

    from lbc.cli import main

    monkeypatch.delenv("LBC_PRESET", raising=False)
    assert main(["config", "show", "--preset", "impala", "--set", "learner.batch_size=8"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["preset"] == "impala" and shown["learner"]["batch_size"] == 8     # the override over the preset
    assert shown["learner"]["optimiser"] == "rmsprop" and shown["net"]["core"] == "layernorm_lstm"   # preset, default
    assert main(["config", "show", "--section", "replay"]) == 0
    assert list(json.loads(capsys.readouterr().out)) == ["replay"]
    with pytest.raises(SystemExit, match="learner.batch_sise"):
        main(["config", "show", "--set", "learner.batch_sise=3"])
    with pytest.raises(SystemExit, match="did you mean impala"):
        main(["config", "show", "--preset", "impal"])


def test_the_launcher_the_bandit_and_replay_run_without_torch():
    """Importing torch costs about three seconds of CPU per process; the launcher (before any service starts),
    the bandit and replay need none of it, so configuration checks and the sequences' checks (every preset's
    bound on the values actors send among them) live in torch-free modules (docs/decisions.md 71)."""
    code = ("import sys; import lbc.launch, bandit_svc.__main__, replay_svc.__main__; "
            "from lbc.config import PRESETS, load_config; from lbc.sequences import value_bound; "
            "load_config('dice', ['env.game=pong']); [value_bound(load_config(p)) for p in PRESETS]; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stdout + out.stderr


def test_a_reader_that_goes_away_ends_the_command_without_a_traceback():
    # `lbc config show | head -1`: the read end closes before the command writes; it gets EPIPE on its first write
    proc = subprocess.Popen([sys.executable, "-m", "lbc.cli", "config", "show", "--preset", "impala"], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=60) == 1 and "Traceback" not in err and "BrokenPipe" not in err, err
