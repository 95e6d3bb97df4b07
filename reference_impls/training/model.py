"""The model, optimizer and learning-rate schedule a config describes."""

from __future__ import annotations

import torch
from torch import nn

from reference_impls.training.config import ModelConfig, OptimizerConfig, SchedulerConfig

__all__ = ["build_model", "build_optimizer", "build_scheduler"]


def build_model(config: ModelConfig) -> nn.Sequential:
    """``Linear -> ReLU -> Dropout`` per hidden layer, then a ``Linear`` head.

    Parameter names (``layers.0.weight``, ...) are the checkpoint's ``model`` keys.
    Initialization draws from torch's global RNG: seed it first for a reproducible model.
    """
    layers: list[nn.Module] = []
    width = config.in_features
    for hidden in config.hidden:
        layers += [nn.Linear(width, hidden), nn.ReLU()]
        if config.dropout > 0:
            layers.append(nn.Dropout(config.dropout))
        width = hidden
    layers.append(nn.Linear(width, config.out_features))
    model = nn.Sequential()
    model.add_module("layers", nn.Sequential(*layers))
    return model


def build_optimizer(config: OptimizerConfig, model: nn.Module) -> torch.optim.Optimizer:
    params = model.parameters()
    if config.name == "sgd":
        return torch.optim.SGD(
            params, lr=config.lr, momentum=config.momentum, weight_decay=config.weight_decay
        )
    if config.name == "adam":
        return torch.optim.Adam(params, lr=config.lr, weight_decay=config.weight_decay)
    return torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)


def build_scheduler(
    config: SchedulerConfig, optimizer: torch.optim.Optimizer, *, planned_steps: int
) -> torch.optim.lr_scheduler.LRScheduler:
    """Stepped once per optimizer step. Built-in schedulers only: their state_dicts hold plain
    numbers (a LambdaLR's lambda would not survive ``torch.load(weights_only=True)``)."""
    if config.name == "step":
        return torch.optim.lr_scheduler.StepLR(
            optimizer, step_size=config.step_size, gamma=config.gamma
        )
    if config.name == "cosine":
        return torch.optim.lr_scheduler.CosineAnnealingLR(
            optimizer, T_max=max(1, planned_steps), eta_min=config.min_lr
        )
    # constant: a scheduler all the same, so every run saves and restores one.
    return torch.optim.lr_scheduler.ConstantLR(optimizer, factor=1.0, total_iters=0)
