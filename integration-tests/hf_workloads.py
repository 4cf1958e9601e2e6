"""A Hugging Face Trainer run on Train workers (imported by name; no pytest here).

A one-layer BERT built from a config and synthetic token ids: nothing is downloaded.
"""

from __future__ import annotations

import os
from typing import Any

import torch

VOCAB = 32
SEQ = 8


def hf_scaled_loss(config: dict[str, Any]) -> None:
    """A HF Trainer fit of ``config["max_steps"]`` steps, logging every step.

    The Trainer writes under ``config["hf_dir"]``. Its training loss is the model's times ``config["loss_scale"]``, so that a
    ``ThresholdPruner`` rejects a trial by its config alone. Resumes from
    ``train.get_checkpoint()`` like the README's example.
    """
    os.environ["HF_HUB_OFFLINE"] = "1"
    import transformers

    from lumos import train
    from lumos.train.huggingface.transformers import ReportCallback, prepare_trainer

    scale = float(config["loss_scale"])

    class ScaledTrainer(transformers.Trainer):  # type: ignore[misc]
        def compute_loss(self, model: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
            return scale * super().compute_loss(model, inputs, *args, **kwargs)

    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(
        transformers.BertConfig(
            vocab_size=VOCAB,
            hidden_size=16,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=32,
            max_position_embeddings=SEQ,
        )
    )
    ids = torch.randint(0, VOCAB, (32, SEQ), generator=torch.Generator().manual_seed(0))
    data = [{"input_ids": row, "labels": torch.tensor(int(row[0] % 2))} for row in ids]
    args = transformers.TrainingArguments(
        # the Trainer's own folder, outside the run's storage (lumos uploads from it)
        output_dir=os.path.join(config["hf_dir"], train.get_context().get_trial_name() or "run"),
        use_cpu=True,
        max_steps=int(config["max_steps"]),
        per_device_train_batch_size=4,
        logging_steps=1,
        save_strategy="steps",
        save_steps=int(config["save_steps"]),
        report_to="none",
        disable_tqdm=True,
        ddp_find_unused_parameters=False,
    )
    trainer = ScaledTrainer(
        model=model, args=args, train_dataset=data, callbacks=[ReportCallback()]
    )
    trainer = prepare_trainer(trainer)
    if (ckpt := train.get_checkpoint()) is None:
        trainer.train()
        return
    with ckpt.as_directory() as d:
        trainer.train(resume_from_checkpoint=os.path.join(d, ReportCallback.CHECKPOINT_NAME))
