import pytest
from omegaconf import OmegaConf

from recipe.launch.compose import missing


def test_missing_names_what_omegaconf_names_except_under_a_disabled_block():
    cfg = OmegaConf.create({
        "data": {"train_files": "???", "val_files": "v.parquet", "extra": ["a", "???", {"x": "???"}]},
        "reward": {"enable": False, "model": {"path": "???"}},  # verl leaves a disabled block's ??? unset
        "trainer": {"nnodes": 1, "logger": "???", "nested": {"deeper": {"leaf": "???"}}},
    })
    everything = sorted(OmegaConf.missing_keys(cfg))
    assert everything == ["data.extra[1]", "data.extra[2].x", "data.train_files", "reward.model.path",
                          "trainer.logger", "trainer.nested.deeper.leaf"]
    assert missing(cfg) == [key for key in everything if not key.startswith("reward.")]
    assert missing(OmegaConf.create({"a": 1, "b": [1, 2]})) == []


@pytest.mark.slow  # hydra compositions of the OPSD config (~10 s with the imports)
def test_values_applied_after_a_composition_give_the_config_composing_with_them_gives(tmp_path):
    """What a launch derives after its first composition (GPU count, token budgets, the checkpoint directory,
    the cluster it joins, the save it resumes), applied with ``with_values``: the same config as composing
    with them, which is what verl composes from the launch's override list."""
    from recipe.launch.compose import compose, with_values
    from recipe.launch.recipes import get_recipe

    recipe = get_recipe("opsd")
    first = ["+platform=cpu", "+demo=tiny", "trainer.total_training_steps=3", "data.max_response_length=64"]
    derived = ["trainer.n_gpus_per_node=2", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=4096",
               f"trainer.default_local_dir={tmp_path / 'a dir' / 'ckpt'}".replace(" ", "\\ "),
               "++ray_kwargs.ray_init.address=127.0.0.1:6379", "++ray_kwargs.ray_init.num_cpus=null",
               '++ray_kwargs.ray_init.runtime_env.env_vars.OPSD_X="1e-3"', "+opsd.new_key=7",
               "trainer.resume_mode=resume_path", f"trainer.resume_from_path={tmp_path}/global_step_2"]
    cfg = compose(recipe, first)
    applied = with_values(cfg, derived)
    assert OmegaConf.to_container(applied) == OmegaConf.to_container(compose(recipe, first + derived))
    assert OmegaConf.to_container(cfg) == OmegaConf.to_container(compose(recipe, first))  # the input is kept
    assert applied.ray_kwargs.ray_init.runtime_env.env_vars.OPSD_X == "1e-3"
    with pytest.raises(ValueError, match="adds trainer.nnodes"):
        with_values(cfg, ["+trainer.nnodes=2"])
