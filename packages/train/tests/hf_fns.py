"""Training functions for ``test_hf_transformers.py``: a tiny BERT under a HF Trainer.

Shipped to the workers by value (``cloudpickle.register_pickle_by_value``). Nothing is
downloaded: the model is built from a config, the data are synthetic token ids.
"""

from __future__ import annotations

import json
import os
import signal
from typing import Any

import torch

from lumos import train

VOCAB = 64
SEQ = 8


def tiny_model() -> Any:
    """A one-layer BERT classifier (a few thousand weights), seeded."""
    import transformers

    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=VOCAB,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=SEQ,
        num_labels=2,
    )
    return transformers.BertForSequenceClassification(config)


def token_data(n: int, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """``n`` examples; the label is whether the first token is in the upper half."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (n, SEQ), generator=gen)
    return [
        {
            "input_ids": row,
            "attention_mask": torch.ones(SEQ, dtype=torch.long),
            "labels": torch.tensor(int(row[0] >= VOCAB // 2)),
        }
        for row in ids
    ]


def hf_fit(config: dict[str, Any]) -> None:
    """Fit the tiny model with a HF Trainer, ``ReportCallback`` and ``prepare_trainer``.

    Resumes from ``train.get_checkpoint()``. Writes ``<out>/attempt<a>_rank<r>.json``
    (the Trainer's world size / rank and the step it resumed at). ``die_at``: on
    attempt 0, rank 1 SIGKILLs itself when it begins that global step.
    """
    os.environ["HF_HUB_OFFLINE"] = "1"  # nothing to download: fail rather than fetch
    import transformers

    from lumos.train.huggingface.transformers import ReportCallback, prepare_trainer

    ctx = train.get_context()
    rank, attempt = ctx.get_world_rank(), ctx.get_attempt()
    die_at = config.get("die_at")

    class Die(transformers.TrainerCallback):  # type: ignore[misc]
        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if attempt == 0 and rank == 1 and state.global_step == die_at:
                os.kill(os.getpid(), signal.SIGKILL)

    args = transformers.TrainingArguments(
        output_dir=os.path.join(config["out"], "hf"),
        use_cpu=True,
        max_steps=int(config["max_steps"]),
        per_device_train_batch_size=4,
        per_device_eval_batch_size=8,
        learning_rate=1e-2,
        logging_steps=1,
        eval_strategy="steps",
        eval_steps=int(config["save_steps"]),
        save_strategy="steps",
        save_steps=int(config["save_steps"]),
        report_to="none",
        disable_tqdm=True,
        seed=0,
        dataloader_num_workers=0,
        ddp_find_unused_parameters=False,
    )
    trainer = transformers.Trainer(
        model=tiny_model(),
        args=args,
        train_dataset=token_data(64),
        eval_dataset=token_data(16, seed=1),
        callbacks=[ReportCallback(), Die()],
    )
    trainer = prepare_trainer(trainer)
    ckpt = train.get_checkpoint()
    resumed = None
    if ckpt is None:
        trainer.train()
    else:
        with ckpt.as_directory() as d:
            folder = os.path.join(d, ReportCallback.CHECKPOINT_NAME)
            with open(os.path.join(folder, "trainer_state.json")) as f:
                resumed = json.load(f)["global_step"]
            trainer.train(resume_from_checkpoint=folder)
    with open(os.path.join(config["out"], f"attempt{attempt}_rank{rank}.json"), "w") as f:
        json.dump(
            {
                "world_size": trainer.args.world_size,
                "process_index": trainer.args.process_index,
                "resumed_at": resumed,
                "global_step": trainer.state.global_step,
                "class": type(trainer).__name__,
            },
            f,
        )


def hf_outside_group(config: dict[str, Any]) -> None:
    """TrainingArguments made without lumos's env vars: prepare_trainer must refuse them."""
    import transformers

    from lumos.train.huggingface.transformers import prepare_trainer

    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        os.environ.pop(name, None)
    args = transformers.TrainingArguments(
        output_dir=os.path.join(config["out"], "hf"), use_cpu=True, report_to="none"
    )
    prepare_trainer(transformers.Trainer(model=tiny_model(), args=args))


def hf_fsdp_on_cpu(config: dict[str, Any]) -> None:
    """A Trainer asked for FSDP on CPU workers: prepare_trainer must say it would not shard."""
    import transformers

    from lumos.train.huggingface.transformers import prepare_trainer

    args = transformers.TrainingArguments(
        output_dir=os.path.join(config["out"], "hf"),
        use_cpu=True,
        report_to="none",
        fsdp=True,
        fsdp_config={"version": 2},
    )
    trainer = transformers.Trainer(model=tiny_model(), args=args)
    with open(
        os.path.join(config["out"], f"plugin-{train.get_context().get_world_rank()}"), "w"
    ) as f:
        f.write(repr(getattr(trainer.accelerator.state, "fsdp_plugin", None)))
    prepare_trainer(trainer)
