"""configs/multi30k.py:tiny_fairseq is ``tiny`` with fairseq's choices, each one key away."""

from transformer import schema
from transformer.configs import multi30k


def _flat(variant: str) -> dict:
    plain = schema.to_dict(schema.parse(multi30k.get_config(variant)))
    return {f'{s}.{k}': v for s, section in plain.items() for k, v in section.items()}


def test_tiny_fairseq_changes_only_what_fairseq_does_otherwise():
    tiny, fairseq = _flat('tiny'), _flat('tiny_fairseq')
    changed = {key: value for key, value in fairseq.items() if tiny[key] != value}
    assert changed == {
        'data.pretokenize': 'moses',
        'data.vocab_normalization': 'nmt_nfkc_cf',
        'eval.best_metric': 'tokenized_bleu',
        'eval.length_penalty': 'fairseq',
        'eval.alpha': 1.0,
        'opt.eps': 1e-8,
        'opt.clip_grad_norm': 25.0,
        'model.layer_norm_epsilon': 1e-5,
        'opt.schedule': 'inverse_sqrt',
        'opt.warmup_init_lr': 1e-7,
        'opt.lr_scale': 5e-3,
        'train.checkpoint_every': 62,
    }
    assert fairseq['eval.average_last'] == 10 <= fairseq['train.keep_checkpoints']
