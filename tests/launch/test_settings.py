"""recipe.launch.settings: one name per setting, one default, clear errors."""

import pytest

from recipe.launch.settings import Settings


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
        ({"DEVICE": "gpu", "CPU_DEMO": "toy"}, "CPU_DEMO / CPU_NUM_RANKS / CPU_ROLLOUT apply to DEVICE=cpu only"),
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
