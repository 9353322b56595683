#!/usr/bin/env bash
# Fine-tuning end to end (docs/pretrained.md): a MarianMT trained by Hugging Face's code on half A
# of Multi30k (benchmarks/hf_marian_pretrain.py) converted, evaluated on test2016, fine-tuned with
# configs/multi30k.py:finetune on half B and evaluated again; beside it the same model trained
# from scratch on half B for the same steps (the base Multi30k schedule, its own vocabulary).
#   bash benchmarks/marian_finetune.sh HF_DIR DATA_DIR OUT_DIR
# HF_DIR: the MarianMT directory; DATA_DIR: hf_marian_pretrain.py's --data_out (train_a, train_b,
# validation, test2016); OUT_DIR: the three run directories and the logs.
set -euo pipefail
HF=$1 DATA=$2 OUT=$3
STEPS=${STEPS:-1000}
DATA_FLAGS="--config.data.dataset=folder --config.data.folder=$DATA --config.data.train_split=train_b"
mkdir -p "$OUT"
time python -m transformer.convert --from_hf "$HF" --workdir "$OUT/converted" \
  --config configs/multi30k.py:finetune $DATA_FLAGS
time python -m transformer.evaluate --workdir "$OUT/converted" --split test2016 \
  --output "$OUT/converted.test2016.txt"
time python train.py --config configs/multi30k.py:finetune --workdir "$OUT/finetuned" \
  --config.train.init_from="$HF" --config.train.num_steps="$STEPS" $DATA_FLAGS
time python -m transformer.evaluate --workdir "$OUT/finetuned" --split test2016 \
  --output "$OUT/finetuned.test2016.txt"
# The converted model's settings, random parameters, a vocabulary of half B.
MODEL=$(python - "$OUT/converted/config.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))['model']
keys = ('d_model', 'num_heads', 'd_ff', 'num_encoder_layers', 'num_decoder_layers', 'ffn',
        'attention_bias', 'logits_bias', 'layer_norm_epsilon')
print(' '.join(f'--config.model.{k}={m[k]}' for k in keys))
PY
)
time python train.py --config configs/multi30k.py --workdir "$OUT/scratch" \
  --config.train.num_steps="$STEPS" $DATA_FLAGS $MODEL
time python -m transformer.evaluate --workdir "$OUT/scratch" --split test2016 \
  --output "$OUT/scratch.test2016.txt"
