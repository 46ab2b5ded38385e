"""Hydra entry point of the GRPO baseline on verl's async trainers (one-step-off, fully-async).

    bash recipe/grpo_baseline/run_grpo.sh +experiment=async_one_step_off     # the launcher starts this module

The config is the GRPO baseline's (``recipe/grpo_baseline/config/grpo_trainer.yaml``) with an
``async_training`` block (the presets ``async_one_step_off`` / ``async_fully``, which also say why verl's
decoupled PPO and not its bypass mode). Apart from the policy-version bookkeeping of
``recipe.async_rl.trainers`` the run is verl's own ``OneStepOffRayTrainer`` / ``FullyAsyncTrainer``.
Without an ``async_training`` block it refuses to run (the synchronous GRPO run is ``verl.trainer.main_ppo``).
"""

from __future__ import annotations

import sys

import hydra
import ray

from recipe.async_rl.config import AsyncConfigError, apply_derived, async_settings


class GRPOOneStepOffRunner:
    """Task runner: verl's workers for GRPO on separate pools, ``VersionedOneStepOffTrainer``."""

    def run(self, config):
        from omegaconf import OmegaConf

        from verl.experimental.separation.utils import create_role_worker_mapping
        from verl.trainer.ppo.utils import need_critic, need_reference_policy
        from verl.utils.config import validate_config

        from recipe.async_rl.trainers import VersionedOneStepOffTrainer, run_one_step_off

        OmegaConf.resolve(config)
        role_worker_mapping, _ = create_role_worker_mapping(config)
        validate_config(config=config, use_reference_policy=need_reference_policy(config),
                        use_critic=need_critic(config))
        run_one_step_off(config, trainer_cls=VersionedOneStepOffTrainer, role_worker_mapping=role_worker_mapping)


def run(config) -> None:
    """Check the async block, derive its values (printed), start the task runner of its mode."""
    from verl.trainer.main_ppo import run_ppo

    settings = async_settings(config, opsd=False)
    if settings is None:
        raise AsyncConfigError("no async_training.mode: add +experiment=async_one_step_off or async_fully "
                               "(the synchronous GRPO run is python -m verl.trainer.main_ppo)")
    print("\n".join(apply_derived(config, settings)), flush=True)
    if settings.mode == "one_step_off":
        run_ppo(config, task_runner_class=ray.remote(num_cpus=1)(GRPOOneStepOffRunner))
        return
    from verl.experimental.reward_loop import migrate_legacy_reward_impl

    from recipe.async_rl.trainers import AsyncTaskRunner

    run_ppo(migrate_legacy_reward_impl(config), task_runner_class=ray.remote(num_cpus=1)(AsyncTaskRunner))


@hydra.main(config_path="../grpo_baseline/config", config_name="grpo_trainer", version_base=None)
def main(config):
    try:
        run(config)
    except AsyncConfigError as err:
        print(err.line, file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
