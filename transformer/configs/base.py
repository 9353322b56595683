r"""The paper's base model on WMT14 English -> German (Vaswani et al., 2017, Table 3).

Command:

  python train.py --config configs/base.py --workdir runs/base
  python -m transformer.evaluate --workdir runs/base --average_last 5 --split test

Hardware: the paper trained 100k steps on 8 P100 GPUs in 12 hours (0.4 s/step) and reports
27.3 tokenized BLEU on newstest2014 (25.8 on newstest2013). Data: TFDS
`wmt14_translate/de-en` (train = the TFDS train split, validation = newstest2013, test =
newstest2014), trained English -> German with a joint ~37000-piece BPE SentencePiece model.
Each step holds ~25000 source + ~25000 target tokens: 104 packed rows of 256 tokens
(26624 target slots), split over the local devices (and `train.grad_accum_steps`).
"""

import ml_collections
from ml_collections import config_dict

from transformer.data import config as data_config


def get_config() -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()

    # Maps one to one onto transformer.model.TransformerConfig (vocab_size comes from data).
    config.model = model = ml_collections.ConfigDict()
    model.d_model = 512  # D (Table 3, base)
    model.num_heads = 8  # N
    model.head_dim = config_dict.placeholder(int)  # H = d_k = d_v; None = d_model // num_heads
    model.d_ff = 2048  # F, inner FFN width
    model.num_encoder_layers = 6
    model.num_decoder_layers = 6
    model.dropout_rate = 0.1  # P_drop on sub-layer outputs and embedding sums (Sec. 5.4)
    model.attention_dropout_rate = 0.0  # on attention probabilities (not in the paper)
    model.relu_dropout_rate = 0.0  # after the FFN ReLU (not in the paper)
    model.share_embeddings = 'all'  # source, target, pre-softmax share one matrix (Sec. 3.4)
    model.pre_layer_norm = False  # post-LN as in the paper; True = pre-LN (t2t's later default)
    model.layer_norm_epsilon = 1e-6
    model.attention_impl = 'auto'  # cuDNN's fused attention on a GPU, 'einsum' elsewhere
    model.embedding_grad = 'auto'  # the embedding's gradient: 'scatter', 'one_hot', ... (measured)
    model.dtype = 'float32'  # computation dtype; 'bfloat16' on GPU/TPU and AVX512-BF16 CPUs
    model.param_dtype = 'float32'

    # Every key the pipeline reads, with its comment, is in transformer/data/config.py.
    config.data = data = data_config.default_config()
    data.dataset = 'wmt14_translate/de-en'  # TFDS name, 'multi30k', 'synthetic' or 'folder'
    data.source_lang = 'en'  # translate from ...
    data.target_lang = 'de'  # ... to
    data.eval_split = 'validation'  # newstest2013 for wmt14
    data.test_split = 'test'  # newstest2014 for wmt14
    data.vocab_size = 37000  # joint source-target BPE vocabulary (Sec. 5.1)
    data.vocab_model_type = 'bpe'
    data.vocab_sample_size = 2_000_000  # sentences sampled to train SentencePiece
    data.max_len = 256  # packed row length (tokens)
    data.long_examples = 'drop'  # training pairs over max_len; evaluation keeps everything

    config.opt = opt = ml_collections.ConfigDict()
    opt.schedule = 'rsqrt'  # d^-0.5 * min(step^-0.5, step * warmup^-1.5) (Sec. 5.3)
    opt.warmup_steps = 4000
    opt.lr_scale = 1.0  # constant factor on the schedule (the lr itself for 'constant')
    opt.cooldown_steps = 0  # linear decay to 0 over the last N of train.num_steps; 0 = none
    opt.b1 = 0.9  # Adam beta1 (Sec. 5.3)
    opt.b2 = 0.98  # Adam beta2
    opt.eps = 1e-9  # Adam epsilon
    opt.clip_grad_norm = 0.0  # global-norm clipping; 0 = off (the paper does not clip)

    config.train = train = ml_collections.ConfigDict()
    train.seed = 0  # parameters, dropout and data order
    train.num_steps = 100_000  # Sec. 5.2: 100k steps for the base model
    train.batch_size = 104  # global packed rows per step (~25k target tokens, Sec. 5.1)
    train.grad_accum_steps = 1  # micro-batches per step, to reach the budget on fewer devices
    train.label_smoothing = 0.1  # epsilon_ls (Sec. 5.4)
    train.loss_chunk_tokens = 0  # >0: the loss in chunks of N tokens, no [B, T, V] logits
    # PRNG of the dropout masks: 'threefry' (jax's default), 'rbg' / 'unsafe_rbg' (XLA's
    # RngBitGenerator, as t5x and MaxText use) or 'philox4x32'; each deterministic per seed and
    # step, so resuming stays exact. threefry measured cheapest on CPU (step_overhead.py) and
    # on an H200 (base, bfloat16: 40.8 ms/step, rbg 41.3).
    train.dropout_prng = 'threefry'
    train.parallelism = 'sharding'  # 'sharding' (jit + NamedSharding) or 'pmap' (replicated)
    train.model_parallelism = 1  # size of the mesh's 'model' axis in 'sharding' mode
    train.fsdp = False  # also shard parameters + Adam moments over 'data' (ZeRO-3 style)
    train.prefetch = 2  # batches packed and placed ahead on a background thread (0 = off)
    train.log_every = 100  # steps between console / metrics lines
    train.eval_every = 2000  # steps between validation loss (0 = only at the end)
    # The paper writes a checkpoint every 10 minutes (Sec. 6.1): 1500 steps at 0.4 s/step.
    train.checkpoint_every = 1500
    train.keep_checkpoints = 5  # kept on disk; >= eval.average_last
    train.async_checkpointing = True  # write checkpoints while training continues
    train.distributed = False  # join a multi-process run with jax.distributed.initialize()
    # Passed to jax.distributed.initialize; None = the cluster's auto-detection.
    train.coordinator_address = config_dict.placeholder(str)  # e.g. 'localhost:12355'
    train.num_processes = config_dict.placeholder(int)
    train.process_id = config_dict.placeholder(int)
    train.init_timeout_s = 60  # a process that cannot reach the coordinator stops after this
    # Stop after this many validation BLEU evaluations (eval.bleu_every) without a new best;
    # 0 = off. The best checkpoint is kept in WORKDIR/best either way
    # (transformer/training/best.py).
    train.early_stop_patience = 0

    config.eval = ev = ml_collections.ConfigDict()
    ev.beam_size = 4  # Sec. 6.1
    ev.alpha = 0.6  # GNMT length penalty ((5 + len) / 6)^alpha (Sec. 6.1)
    ev.extra_length = 50  # maximum output length = input length + 50 (Sec. 6.1)
    ev.average_last = 5  # average the last 5 checkpoints (Sec. 6.1)
    ev.batch_size = 64  # sentences per decoding / validation batch
    ev.bleu_every = 0  # steps between validation BLEU during training (0 = off)
    ev.bleu_max_examples = 0  # validation sentences decoded for that BLEU (0 = all)
    ev.best_metric = 'sacrebleu'  # 'sacrebleu' | 'tokenized_bleu' | 'chrf': picks WORKDIR/best
    ev.compound_split = True  # tokenized BLEU with t2t's ##AT## hyphen splitting (WMT14 EN-DE)
    ev.lowercase_tokenized = False  # tokenized BLEU on lowercased, punct-normalised text
    return config
