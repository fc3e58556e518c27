import pytest

from lbc.config import PRESETS, load_config


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_validates(name):
    cfg = load_config(name)
    assert cfg.preset == name


def test_lbc_bm_has_paper_values():
    cfg = load_config("lbc-bm")
    assert [(p.gamma, p.reward_shaping) for p in cfg.policies] == [(0.997, "rs1"), (0.999, "rs2"), (0.99, "rs3")]
    assert (cfg.sequence.burn_in, cfg.sequence.length, cfg.learner.batch_size) == (40, 80, 64)
    assert (cfg.learner.v_loss_scale, cfg.learner.q_loss_scale, cfg.learner.pi_loss_scale) == (1.0, 5.0, 5.0)
    assert (cfg.learner.rho_bar, cfg.learner.c_bar, cfg.learner.clip_norm) == (1.05, 1.05, 50.0)
    assert cfg.learner.adam_betas == (0.9, 0.98) and cfg.learner.adam_eps == 1e-6
    assert (cfg.learner.push_every, cfg.actor.pull_every, cfg.replay.replay_ratio) == (25, 64, 2.0)
    assert (cfg.bandit.population, cfg.bandit.top_d, cfg.bandit.replace_every) == (7, 4, 50)
    assert cfg.behaviour.tau_accuracy == 0.2 and cfg.behaviour.omega_accuracy == 0.1


def test_cpu_keeps_lbcs_reward_shapes_with_a_discount_of_0_99():
    """docs/decisions.md 51: only the discounts differ from LBC Table 3, and only in `cpu`."""
    cfg = load_config("cpu")
    assert [(p.gamma, p.reward_shaping) for p in cfg.policies] == [(0.99, "rs1"), (0.99, "rs2"), (0.99, "rs3")]
    assert [p.gamma for p in load_config("lbc-reduce-h-psi").policies] == [0.997]


def test_cpu_bootstraps_from_a_target_network_and_the_printed_presets_do_not():
    """docs/decisions.md 53: `cpu` copies its network into a target every 250 learner steps; LBC's printed
    preset and its ablations bootstrap from the online network, as the paper describes."""
    assert load_config("cpu").learner.target_update_every == 250
    for preset in ("lbc-bm", "lbc-reduce-h-psi", "catch", "minatar"):
        assert load_config(preset).learner.target_update_every == 0, preset


def test_wider_actors_pull_as_often_a_frame_and_learn_the_same_per_frame():
    """docs/decisions.md 80 and 91: `impala`'s actors at 64 games and `cpu`'s at 32 pull parameters every 1,024
    agent steps, as 16 games every 64 passes did; batch, sequence lengths and replay ratio stay the sizing's."""
    for preset, games in (("impala", 64), ("cpu", 32)):
        cfg = load_config(preset)
        assert cfg.env.num_envs == games, preset
        assert cfg.env.num_envs * cfg.actor.pull_every == 16 * 64, preset
    cpu = load_config("cpu")
    assert (cpu.learner.batch_size, cpu.sequence.burn_in, cpu.sequence.length, cpu.replay.replay_ratio) == (
        16, 10, 20, 2.0)
    assert load_config("lbc-reduce-h").env.num_envs == 16   # only `cpu` changed (CPU_SIZING keeps 16)


def test_precedence_override_over_environment_over_preset(monkeypatch):
    monkeypatch.setenv("LBC_LEARNER__BATCH_SIZE", "8")
    monkeypatch.setenv("LBC_ENV__GAME", "breakout")
    cfg = load_config("cpu", ["learner.batch_size=4", "replay.min_sequences=4"])
    assert cfg.learner.batch_size == 4 and cfg.env.game == "breakout"
    assert cfg.sequence.length == PRESETS["cpu"]["sequence"]["length"]


def test_bad_input_is_named():
    with pytest.raises(Exception, match="learner.batchsize"):
        load_config("cpu", ["learner.batchsize=3"])
    with pytest.raises(Exception, match="unknown preset 'ipmala': did you mean impala or impala-cpu?"):
        load_config("ipmala")
    with pytest.raises(Exception, match="batch_size"):
        load_config("cpu", ["learner.batch_size=-1"])
    with pytest.raises(ValueError, match="key.path=value"):
        load_config("cpu", ["learner.batch_size"])
    with pytest.raises(Exception, match="rho_bar >= c_bar"):
        load_config("cpu", ["learner.rho_bar=0.5"])
    with pytest.raises(Exception, match="cuda_graphs needs a GPU learner"):
        load_config("cpu", ["learner.cuda_graphs=true", "learner.device=cpu"])
    with pytest.raises(Exception, match="cuda_graphs needs a GPU learner"):
        load_config("lbc-bm", ["learner.cuda_graphs=true", "learner.compile=true"])
    for overrides in (["actor.device=cpu"], ["actor.inference=remote", "inference.device=cpu"]):
        with pytest.raises(Exception, match="actor.cuda_graphs needs the acting pass on a GPU"):
            load_config("lbc-bm", ["actor.cuda_graphs=true", *overrides])
    # with central inference the service's device counts, not the actors' (their own network acts nowhere)
    assert load_config("lbc-bm", ["actor.cuda_graphs=true", "actor.inference=remote"]).actor.cuda_graphs


def test_ngu_and_agent57_settings_are_checked():
    with pytest.raises(ValueError, match="one policy"):
        load_config("ngu", {"policies": [{"gamma": 0.99, "reward_shaping": "identity"}] * 2})
    with pytest.raises(ValueError, match="sliding_window_ucb"):
        load_config("ngu", ["behaviour.controlled=true"])
    with pytest.raises(ValueError, match="needs ngu.enabled"):
        load_config("cpu", ["bandit.algorithm=sliding_window_ucb"])
    with pytest.raises(ValueError, match="aux_steps"):
        load_config("ngu", ["ngu.aux_steps=30"])
    cfg = load_config("agent57")
    assert cfg.ngu.enabled and cfg.behaviour.controlled and cfg.ngu.window == 160


def test_deep_merge_merges_sections_and_replaces_the_rest():
    from lbc.presets import deep_merge

    base = {"a": {"x": 1, "y": {"z": 2}}, "l": [1, 2], "k": 0}
    layer = {"a": {"y": {"w": 3}}, "l": [9], "n": {"m": 1}}
    merged = deep_merge(base, layer)
    assert merged == {"a": {"x": 1, "y": {"z": 2, "w": 3}}, "l": [9], "k": 0, "n": {"m": 1}}
    assert base == {"a": {"x": 1, "y": {"z": 2}}, "l": [1, 2], "k": 0}   # the inputs are left as they were
    merged["a"]["y"]["z"] = 5
    merged["n"]["m"] = 7
    assert base["a"]["y"]["z"] == 2 and layer["n"]["m"] == 1


def test_presets_are_algorithms_over_sizings():
    """The Catch preset is LBC on the cpu sizing with the Catch sizing laid over it by the same merge the tests
    use; `cpu` is LBC on the cpu sizing with LBC_CPU_TRAINING (decision 48); the paper and cpu presets of
    LBC differ only in what those two layers hold."""
    from lbc.presets import CATCH_SIZING, CPU_SIZING, LBC, LBC_CPU_TRAINING, PAPER_SIZING, deep_merge

    catch = load_config("catch").model_dump()
    laid = load_config("lbc-random", deep_merge(CATCH_SIZING, {"bandit": {"learn": True},
                                                               "behaviour": {"tau_range": [0.0, 10.0],
                                                                             "tau_accuracy": 1.0}}))
    assert {k: v for k, v in catch.items() if k != "preset"} == {k: v for k, v in laid.model_dump().items()
                                                                 if k != "preset"}
    paper, cpu = load_config("paper").model_dump(), load_config("cpu").model_dump()
    sized = set(PAPER_SIZING) | set(CPU_SIZING) | set(LBC_CPU_TRAINING)
    assert {k: v for k, v in paper.items() if k not in sized | {"preset"}} == \
        {k: v for k, v in cpu.items() if k not in sized | {"preset"}}
    assert [p["reward_shaping"] for p in paper["policies"]] == [p["reward_shaping"] for p in cpu["policies"]]
    assert paper["learner"]["learning_rate"] == LBC["learner"]["learning_rate"]
    assert cpu["learner"]["learning_rate"] == LBC_CPU_TRAINING["learner"]["learning_rate"]
    assert cpu["learner"]["target_policy"] == "behaviour_temperature" and cpu["net"]["centre_frames"]
