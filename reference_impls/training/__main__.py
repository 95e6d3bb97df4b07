"""``python -m reference_impls.training``: train a config in a run directory, resuming if it
holds a checkpoint. Prints the run's result as one JSON line on stdout (every rank).

Exit status (the message is on stderr):

- 0: done (early stopping, max_epochs or max_steps);
- 1: a checkpoint problem (damaged, or written for another model);
- 2: a bad config, argument or run directory (checked before the set-up);
- 3: training diverged: a loss or the weights became NaN or infinite (see the config's
  ``allow_non_finite_loss``); ``latest.pt`` keeps the last finite weights;
- 130: interrupted (Ctrl-C): where it stopped, and the command that resumes it.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import shlex
import sys
import tomllib
from collections.abc import Sequence

import torch
import torch.distributed

from reference_impls.training.checkpoint import CheckpointError, RunDirError
from reference_impls.training.config import ConfigError, load_config
from reference_impls.training.distributed import DistContext, init_from_env
from reference_impls.training.loop import Trainer, TrainingDivergedError, TrainingInterrupted

EXIT_DIVERGED = 3
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for a Ctrl-C'd command


def _parse_override(text: str) -> tuple[str, object]:
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise ConfigError(f"--set expects KEY=VALUE (e.g. max_epochs=3), got {text!r}")
    try:  # a TOML value: 3, 0.1, true, [32, 32], "adam"
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw  # a bare word: a string
    return key.strip(), value


def resume_command(args: argparse.Namespace, *, world_size: int) -> str:
    """The command line that continues this run from its run directory."""
    argv = ["--config", args.config, "--run-dir", args.run_dir]
    for text in args.set:
        argv += ["--set", text]
    if args.no_progress:
        argv.append("--no-progress")
    # "auto" continues from latest.pt when there is one and starts afresh otherwise; "never"
    # (what a first run may have asked for) would refuse the checkpoints it left.
    argv += ["--resume", "auto"]
    module = ["-m", "reference_impls.training", *argv]
    if world_size > 1:
        return "torchrun <the same torchrun options> " + shlex.join(module)
    return shlex.join([sys.executable, *module])


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
        return _main(args)
    except KeyboardInterrupt:  # before the trainer ran (it raises TrainingInterrupted)
        print("interrupted during set-up, before training started", file=sys.stderr)
        return EXIT_INTERRUPTED


def _main(args: argparse.Namespace) -> int:
    try:
        overrides = dict(_parse_override(text) for text in args.set)
        if args.no_progress:
            overrides["progress"] = False
        config = load_config(args.config, overrides)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    if config.device == "cuda" and not torch.cuda.is_available():
        # Before joining a process group, which would fail on it with an AssertionError.
        print(
            f"error: device is 'cuda' but this torch ({torch.__version__}) sees no CUDA device; "
            "use device = 'cpu' (or --set device=cpu)",
            file=sys.stderr,
        )
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
        return 2 if isinstance(exc, (ConfigError, RunDirError)) else 1
    except TrainingDivergedError as exc:
        print(f"[rank {dist.rank}] error: {exc}", file=sys.stderr)
        return EXIT_DIVERGED
    except TrainingInterrupted as exc:
        text = f"[rank {dist.rank}] {exc}"
        if dist.is_main and exc.started:
            text += "\nresume with:\n  " + resume_command(args, world_size=dist.world_size)
        print(text, file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        if created:
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
