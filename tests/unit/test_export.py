"""`lbc export`: the ONNX file run by onnxruntime and the TorchScript file run by torch.jit give the
PyTorch network's outputs on real game frames, step after step with the recurrent state fed back."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from lbc.cli import main
from lbc.config import load_config
from lbc.envs import env_spec, make_envs
from lbc.export import ActingStep, input_names
from lbc.nets import build_agent, policy_net
from lbc.run_folder import find_checkpoint
from tests.support import run_folder_with_checkpoint

pytestmark = pytest.mark.slow   # each export traces the network: ~10 s


def _trajectory(cfg, steps: int, envs: int = 3) -> list[dict[str, np.ndarray]]:
    """Real frames with the inputs an actor would pass: random actions, the rewards and episode starts
    they led to (one environment marked as starting at step 5, so the reset path is taken)."""
    env = make_envs(cfg.env, envs, seed=1)
    rng = np.random.default_rng(0)
    obs = env.reset(seed=1)
    prev_action, prev_reward, reset = np.zeros(envs, np.int64), np.zeros(envs, np.float32), np.ones(envs, bool)
    out = []
    for t in range(steps):
        out.append({"obs": obs, "prev_action": prev_action, "prev_reward": prev_reward, "reset": reset})
        action = rng.integers(0, env.spec.num_actions, envs)
        result = env.step(action)
        obs, prev_action, prev_reward = result.obs, action.astype(np.int64), result.reward.astype(np.float32)
        reset = result.done | (np.arange(envs) == 0) & (t == 4)
    env.close()
    return out


def _fresh_run(tmp_path, preset: str, overrides: list[str]):
    run = tmp_path / "run"
    cfg = load_config(preset, [*overrides, f"run_dir={run}"])
    run_folder_with_checkpoint(run, cfg, step=11, version=4)
    _, state = find_checkpoint(run, None, "export")
    spec = env_spec(cfg.env)
    agent = build_agent(cfg, spec.obs_shape, spec.num_actions).eval()
    agent.load_state_dict(state["model"])
    return run, cfg, ActingStep(policy_net(agent)).eval()


def _compare(run_step, reference: ActingStep, cfg, steps: int = 12, atol: float = 1e-4) -> None:
    net = reference.net
    h, c = (np.zeros((3, net.lstm_size), np.float32) for _ in range(2))
    extra_rng = np.random.default_rng(2)
    for inputs in _trajectory(cfg, steps):
        feed = {**inputs, "h": h, "c": c}
        if net.extra_inputs:
            feed["extra"] = extra_rng.random((3, net.extra_inputs), dtype=np.float32)
        got = run_step(feed)
        with torch.no_grad():
            want = [w.numpy() for w in reference(*(torch.from_numpy(feed[name]) for name in input_names(net)))]
        for name, g, w in zip(("adv", "value", "h_out", "c_out"), got, want, strict=True):
            assert g.shape == w.shape, name
            np.testing.assert_allclose(g, w, atol=atol, rtol=1e-4, err_msg=name)
        h, c = want[2], want[3]


@pytest.mark.parametrize("preset,overrides", [
    ("cpu", ["env.game=breakout", "net.centre_frames=true"]),
    ("impala-cpu", ["env.game=pong"]),                          # feed-forward core: state passes through
    ("ngu", ["env.kind=catch", "net.torso=mlp", "net.hidden=32", "net.lstm=32"]),   # the extra inputs
])
def test_onnx_runs_in_onnxruntime_as_the_network(tmp_path, capsys, preset, overrides):
    import onnxruntime

    run, cfg, reference = _fresh_run(tmp_path, preset, overrides)
    assert main(["export", str(run), "--format", "onnx"]) == 0
    path = run / "export" / "policy-v4.onnx"
    assert f"wrote {path}" in capsys.readouterr().out
    assert sorted(p.name for p in path.parent.iterdir()) == ["policy-v4.json", "policy-v4.onnx"]   # weights inside
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    assert names == input_names(reference.net)
    meta = json.loads(path.with_suffix(".json").read_text())
    assert list(meta["inputs"]) == names and list(meta["outputs"]) == [o.name for o in session.get_outputs()]
    assert meta["parameter_version"] == 4 and meta["learner_step"] == 11 and meta["format"] == "onnx"
    assert meta["inputs"]["obs"]["shape"] == ["B", *env_spec(cfg.env).obs_shape]
    _compare(lambda feed: session.run(None, feed), reference, cfg)


def test_torchscript_runs_in_torch_jit_as_the_network(tmp_path):
    run, cfg, reference = _fresh_run(tmp_path, "cpu", ["env.game=breakout"])
    out = tmp_path / "policy.pt"
    assert main(["export", str(run), "--format", "torchscript", "--out", str(out), "--version", "4"]) == 0
    loaded = torch.jit.load(str(out))
    assert json.loads(out.with_suffix(".json").read_text())["behaviour"]["evaluation_policy"] == "greedy"

    def run_step(feed):
        with torch.no_grad():
            return [o.numpy() for o in loaded(*(torch.from_numpy(feed[n]) for n in input_names(reference.net)))]

    _compare(run_step, reference, cfg)


def test_export_names_a_missing_version(tmp_path):
    run, _, _ = _fresh_run(tmp_path, "cpu", ["env.game=breakout"])
    with pytest.raises(SystemExit, match="no checkpoint of version 9 .* versions kept: \\[4\\]"):
        main(["export", str(run), "--version", "9"])

