"""recipe.launch.config: the environment's settings (one name per setting, one default, clear errors), the override
list (each key once, replacements recorded), hydra composition (unset values, values applied after a composition)."""

import pytest
from omegaconf import OmegaConf

from recipe.launch.config import Override, OverrideList, Settings, missing


def settings(tmp_path, gpus=0, **environ):
    return Settings.from_environ(environ, cwd=tmp_path, detect_gpu=lambda: gpus)


def test_device_defaults_to_what_nvidia_smi_lists(tmp_path):
    assert settings(tmp_path).device == "cpu"
    assert settings(tmp_path, gpus=2).device == "gpu"
    assert settings(tmp_path, gpus=2, DEVICE="cpu").device == "cpu"


def test_paths_are_absolute_and_hub_ids_stay(tmp_path):
    (tmp_path / "local_model").mkdir()
    s = settings(tmp_path, MODEL_PATH="local_model", TRAIN_FILES="data/train.parquet", CKPT_DIR="ckpt",
                 OPSD_CACHE="cache")
    assert s.model_path == str(tmp_path / "local_model")
    assert s.train_files == str(tmp_path / "data" / "train.parquet")
    assert s.ckpt_dir == str(tmp_path / "ckpt") and s.cache_dir == str(tmp_path / "cache")
    assert settings(tmp_path, MODEL_PATH="Qwen/Qwen3-1.7B").model_path == "Qwen/Qwen3-1.7B"


def test_vllm_venv_defaults_to_the_cache(tmp_path):
    assert settings(tmp_path, OPSD_CACHE="/c", CPU_ROLLOUT="vllm").vllm_venv_dir == "/c/venv_vllm_cpu"
    assert settings(tmp_path, CPU_ROLLOUT="vllm", VLLM_VENV="v").vllm_venv_dir == str(tmp_path / "v")
    assert settings(tmp_path).cpu_rollout == "hf"


def test_cpu_demo_default_depends_on_what_is_given(tmp_path):
    assert settings(tmp_path).demo == "toy"  # the no-argument run
    assert settings(tmp_path, MODEL_PATH="/m").demo == "tiny"  # a given model on the CPU: tiny run sizes
    assert settings(tmp_path, TRAIN_FILES="/t.parquet", CPU_DEMO="toy").demo == "toy"
    assert settings(tmp_path, gpus=1).demo is None


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"DEVICE": "tpu"}, "DEVICE='tpu' is not one of"),
        ({"STEPS": "0"}, "STEPS='0' must be a positive integer"),
        ({"STEPS": "ten"}, "STEPS='ten'"),
        ({"DEVICE": "cpu", "NGPUS": "2"}, "NGPUS applies to DEVICE=gpu only"),
        ({"DEVICE": "cpu", "NNODES": "2"}, r"NNODES on a CPU needs a Ray cluster \(RAY_ADDRESS"),
        ({"DEVICE": "gpu", "RAY_ADDRESS": "auto"}, r"RAY_ADDRESS='auto' is not host:port"),
        ({"DEVICE": "gpu", "RAY_ADDRESS": "ray://h:10001"}, r"not a Ray Client or dashboard URL"),
        ({"DEVICE": "gpu", "CPU_DEMO": "toy"}, "CPU_DEMO / CPU_NUM_RANKS / CPU_THREADS / CPU_ROLLOUT apply to DEVICE=cpu"),
        ({"DEVICE": "gpu", "CPU_THREADS": "2"}, "CPU_THREADS / CPU_ROLLOUT apply to DEVICE=cpu only"),
        ({"DEVICE": "cpu", "CPU_THREADS": "0"}, "CPU_THREADS='0' must be a positive integer"),
        ({"DEVICE": "gpu", "CPU_ROLLOUT": "vllm"}, "CPU_ROLLOUT apply to DEVICE=cpu only"),
        ({"DEVICE": "cpu", "CPU_ROLLOUT": "sglang"}, r"CPU_ROLLOUT='sglang' is not one of \['hf', 'vllm'\]"),
        ({"DEVICE": "cpu", "VLLM_VENV": "/v"}, "VLLM_VENV applies to CPU_ROLLOUT=vllm only"),
        ({"OPSD_DEVICE": "gpu"}, r"OPSD_DEVICE \(use DEVICE\)"),
        ({"ROLLOUT_NAME": "sglang"}, r"ROLLOUT_NAME \(use actor_rollout_ref.rollout.name=<engine>\)"),
        ({"CACHE_DIR": "/c"}, r"CACHE_DIR \(use OPSD_CACHE\)"),
    ],
)
def test_bad_or_retired_settings_are_named(tmp_path, environ, message):
    with pytest.raises(ValueError, match=message):
        settings(tmp_path, **environ)


@pytest.mark.parametrize(
    ("text", "prefix", "key", "value"),
    [
        ("a.b=1", "", "a.b", "1"),
        ("+model=qwen3_4b", "+", "model", "qwen3_4b"),
        ("++x.y=[1,2]", "++", "x.y", "[1,2]"),
        ("~trainer.logger", "~", "trainer.logger", None),
        ("path=s3://a=b", "", "path", "s3://a=b"),
    ],
)
def test_parse_round_trips(text, prefix, key, value):
    item = Override.parse(text)
    assert (item.prefix, item.key, item.value) == (prefix, key, value)
    assert str(item) == text


@pytest.mark.parametrize("text", ["novalue", "=1", "+"])
def test_parse_rejects_non_overrides(text):
    with pytest.raises(ValueError, match="not a hydra override"):
        Override.parse(text)


def test_one_entry_per_key_last_source_wins_and_is_recorded():
    overrides = OverrideList()
    overrides.add(["trainer.total_training_steps=4", "data.seed=42"], source="demo")
    overrides.add(["+platform=cpu"], source="DEVICE=cpu")
    overrides.add(["trainer.total_training_steps=9", "data.seed=42"], source="command line")
    assert overrides.as_list() == ["+platform=cpu", "trainer.total_training_steps=9", "data.seed=42"]
    # the same value twice is no replacement; a different one is
    assert overrides.replaced == [("trainer.total_training_steps", "4", "demo", "9", "command line")]
    assert overrides.get("trainer.total_training_steps") == "9"
    assert overrides.source("trainer.total_training_steps") == "command line"
    assert "data.seed" in overrides and "data.max_length" not in overrides


def test_group_selections_keep_their_order_ahead_of_values():
    overrides = OverrideList().add(["x=1", "+model=a", "+experiment=[b,c]", "+demo=toy"], source="s")
    assert overrides.as_list() == ["+model=a", "+experiment=[b,c]", "+demo=toy", "x=1"]


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
    from recipe.launch.config import compose, get_recipe, with_values

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
