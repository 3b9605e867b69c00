"""TRL's GRPOTrainer configured as posttrain's GSPO (sequence-level importance sampling, GSPO's clip band,
no KL, constant learning rate, AdamW, dropout and gradient checkpointing off): one place for both TRL
benchmarks (bench_trainer_gspo.py, bench_rl_iteration.py). Not a benchmark itself (no `bench_` prefix)."""

from __future__ import annotations

from typing import Any


def gspo_grpo_config(
    output_dir: str,
    *,
    samples: int,
    minibatches: int,
    group: int,
    max_steps: int,
    lr: float,
    eps_low: float,
    eps_high: float,
    max_tokens: int,
    bf16: bool,
    **extra: Any,
):
    """GRPOConfig for `samples` rollouts per generation split into `minibatches` optimizer steps."""
    import torch
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=output_dir,
        per_device_train_batch_size=samples // minibatches,
        steps_per_generation=minibatches,
        gradient_accumulation_steps=1,
        num_generations=group,
        num_iterations=1,
        max_steps=max_steps,
        learning_rate=lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        max_grad_norm=1.0,
        weight_decay=0.0,
        optim="adamw_torch",
        importance_sampling_level="sequence",
        loss_type="grpo",
        epsilon=eps_low,
        epsilon_high=eps_high,
        beta=0.0,
        temperature=1.0,
        max_completion_length=max_tokens,
        shuffle_dataset=False,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        use_cpu=not torch.cuda.is_available(),
        bf16=bf16,
        gradient_checkpointing=False,  # GRPOConfig's default is True; posttrain's is off
        disable_dropout=True,
        seed=42,
        dataloader_num_workers=0,
        disable_tqdm=True,
        **extra,
    )
