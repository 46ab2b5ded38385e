"""Hydra entry point of a launch of the probe's cells: the OPSD recipe's config with ``+probe.cells=[...]``.

    python -m recipe.probe.main_cells --config-path recipe/opsd/config --config-name opsd_trainer ... \\
        trainer.total_training_steps=8 trainer.save_freq=-1 trainer.resume_mode=disable \\
        '+probe.cells=[{loss:{clip_tau:null}},{teacher_context:unrelated,temperature:0.7}]'

Launched by the probe (``recipe.probe.probe.run_cells_steps``) through the launcher, which runs ``startup_checks``
too: the OPSD start-up checks (``recipe.opsd.startup``), then the cells and the launch they need
(``prepare_cells``). The run is ``recipe.opsd.main_opsd``'s with the cells' task runner
(``recipe.probe.trainer.CellsTaskRunner``); the cells: ``recipe.probe.cell_configs``.
"""

from __future__ import annotations

from pathlib import Path

import hydra

from recipe.async_rl.config import async_settings
from recipe.opsd.core.config import OPSDConfig
from recipe.opsd import startup as opsd_startup
from recipe.probe.cell_configs import cells_of, check_cells

OPSD_CONFIG_DIR = str(Path(__file__).resolve().parents[1] / "opsd" / "config")


def prepare_cells(config, opsd: OPSDConfig) -> list[OPSDConfig]:
    """Each of ``probe.cells``' blocks (``check_cells`` over the launch's ``opsd``), each objective checked against
    the launch as the launch's own is, and the launch they need: equal whole cells, the synchronous trainer, no
    checkpoint (a resume would not know the cell)."""
    cells = cells_of(config)
    configs = check_cells(opsd, cells)
    for cell in configs:
        opsd_startup.check_objective(config, cell)
    steps, n = config.trainer.get("total_training_steps"), len(cells)
    if not isinstance(steps, int) or steps % n:
        raise ValueError(f"probe.cells: trainer.total_training_steps ({steps}) must be a multiple of the {n} cells "
                         "(each cell trains total_training_steps / len(probe.cells) steps)")
    if async_settings(config, opsd=True) is not None:
        raise ValueError("probe.cells runs on the synchronous trainer: remove the async_training block")
    trainer = config.trainer
    if trainer.save_freq > 0 or trainer.resume_mode != "disable":
        raise ValueError(f"probe.cells: set trainer.save_freq=-1 and trainer.resume_mode=disable (got {trainer.save_freq}, "
                         f"{trainer.resume_mode}): a launch of cells saves no checkpoint and starts from the initial student")
    return configs


def startup_checks(config) -> opsd_startup.Startup:
    """The OPSD start-up checks, then ``prepare_cells``; raises ``StartupError`` with the line to print."""
    startup = opsd_startup.startup_checks(config)
    try:
        prepare_cells(config, startup.opsd)
    except ValueError as err:  # a config mistake: the message names the field
        raise opsd_startup.StartupError(str(err), file=opsd_startup.CONFIG) from None
    return startup


@hydra.main(config_path=OPSD_CONFIG_DIR, config_name="opsd_trainer", version_base=None)
def main(config):
    from recipe.opsd.main_opsd import run
    from recipe.probe.trainer import CellsTaskRunner

    run(config, runner=CellsTaskRunner, checks=startup_checks)


if __name__ == "__main__":
    main()
