"""Choosing the real-model task: the format-SFT SmolLM2's greedy accuracy on candidate tasks.

Each candidate is measured on its selection problems -- the first ``--problems`` of its training split,
never its held-out problems -- and the candidate whose accuracy lies in [20%, 60%] closest to 40% is
printed; ``recipe.toy.real_demo.REAL_TASK`` is set to it by hand (docs/results/real_model.md)::

    python -m recipe.experiments.real_task --problems 64
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from recipe.common import cli
from recipe.toy.task import TaskConfig, make_records

# Sums in the sentence wording. The format SFT's problems are sums of two numbers up to 19: every candidate keeps
# out of them by construction (operands from 20, or three operands), so no held-out problem is an SFT problem.
CANDIDATES = {
    "two numbers 20-99": TaskConfig(num_operands=2, digits=1, min_operand=20, max_operand=99, n_train=1024,
                                    n_heldout=256, seed=0, wording="sentence"),
    "two numbers 20-49": TaskConfig(num_operands=2, digits=1, min_operand=20, max_operand=49, n_train=192,
                                    n_heldout=256, seed=0, wording="sentence"),
    "two numbers 50-99": TaskConfig(num_operands=2, digits=1, min_operand=50, max_operand=99, n_train=768,
                                    n_heldout=256, seed=0, wording="sentence"),
    "three numbers 1-19": TaskConfig(num_operands=3, digits=1, max_operand=19, n_train=1024, n_heldout=256, seed=0,
                                     wording="sentence"),
}
TARGET, LOW, HIGH = 0.40, 0.20, 0.60


def choose(accuracies: dict[str, float]) -> str | None:
    """The candidate inside [LOW, HIGH] closest to TARGET (None if none is inside)."""
    inside = {name: acc for name, acc in accuracies.items() if LOW <= acc <= HIGH}
    return min(inside, key=lambda name: abs(inside[name] - TARGET)) if inside else None


def main(argv: list[str] | None = None) -> int:
    from recipe.launch.config import Settings
    from recipe.models.smollm2 import fetch_smollm2
    from recipe.toy.data import heldout_jsonl_rows
    from recipe.toy.real_demo import RealStudent, build_real_student, evaluate_real

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--problems", type=int, default=64, help="selection problems per candidate")
    cli.add_debug_argument(parser)
    args = parser.parse_args(argv)
    import os

    cache = Path(Settings.from_environ(os.environ).cache_dir).expanduser()
    student = build_real_student(fetch_smollm2(cache_dir=cache), RealStudent(), cache=cache)
    accuracies, rows = {}, []
    for name, task in CANDIDATES.items():
        out = cache / "real_task_selection" / name.replace(" ", "_")
        out.mkdir(parents=True, exist_ok=True)
        benchmark = out / "selection.jsonl"
        selection = heldout_jsonl_rows(make_records(task)["train"][: args.problems])
        benchmark.write_text("".join(json.dumps(row) + "\n" for row in selection))
        metrics = evaluate_real(student, out / "eval", benchmark=benchmark)
        accuracies[name] = metrics["greedy"]
        rows.append(f"| {name} | {100 * metrics['greedy']:.1f} | {100 * metrics['boxed_rate']:.1f} | "
                    f"{metrics['mean_length']:.1f} | {metrics['n_problems']} |")
        print(rows[-1], flush=True)
    print("\n| candidate | greedy (%) | boxed (%) | mean length | selection problems |\n|---|---|---|---|---|")
    print("\n".join(rows))
    chosen = choose(accuracies)
    print(f"\nchosen: {chosen}" if chosen else f"\nno candidate in [{LOW:.0%}, {HIGH:.0%}]")
    return 0


if __name__ == "__main__":
    raise SystemExit(cli.run(main))
