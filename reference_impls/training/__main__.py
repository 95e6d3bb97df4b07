"""``python -m reference_impls.training``: train a config in a run directory, resuming if it
holds a checkpoint. Prints the run's result as one JSON line on stdout (every rank).

Exit status: 0 done; 1 a checkpoint problem (message on stderr); 2 a bad config or argument.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import tomllib
from collections.abc import Sequence

from reference_impls.training.checkpoint import CheckpointError
from reference_impls.training.config import ConfigError, load_config
from reference_impls.training.distributed import DistContext, init_from_env
from reference_impls.training.loop import Trainer


def _parse_override(text: str) -> tuple[str, object]:
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise ConfigError(f"--set expects KEY=VALUE (e.g. max_epochs=3), got {text!r}")
    try:  # a TOML value: 3, 0.1, true, [32, 32], "adam"
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw  # a bare word: a string
    return key.strip(), value


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m reference_impls.training", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--config", required=True, help="a .toml or .json TrainConfig file")
    parser.add_argument(
        "--run-dir", required=True, help="checkpoints, metrics.jsonl and result.json go here"
    )
    parser.add_argument(
        "--resume",
        choices=("auto", "never", "require"),
        default="auto",
        help="auto (default): continue from the run directory's latest.pt when there is one; "
        "never: refuse a directory that holds checkpoints; require: fail without one",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config value (dotted key, TOML value), e.g. --set model.dropout=0.1",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    args = parser.parse_args(argv)

    try:
        overrides = dict(_parse_override(text) for text in args.set)
        if args.no_progress:
            overrides["progress"] = False
        config = load_config(args.config, overrides)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    created = init_from_env(config.device)
    dist = DistContext.current()
    logging.basicConfig(
        format=f"[rank {dist.rank}] %(levelname)s %(name)s: %(message)s", level=logging.INFO
    )
    try:
        result = Trainer(config, args.run_dir, dist=dist).run(resume=args.resume)
    except (CheckpointError, ConfigError) as exc:
        print(f"[rank {dist.rank}] error: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, ConfigError) else 1
    finally:
        if created:
            import torch.distributed  # noqa: PLC0415

            torch.distributed.destroy_process_group()
    data = {
        k: repr(v) if isinstance(v, float) and not math.isfinite(v) else v
        for k, v in result.to_dict().items()
    }
    # One write per line: the ranks under torchrun share one stdout.
    sys.stdout.write(json.dumps(data) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
