r"""The PyTorch peer of the project's training step, timed on the same shapes: the layers a GPU
user would write instead, so that a GPU figure reads as ours / torch.compile.

  python benchmarks/torch_peer.py --config configs/base.py --modes eager,compile \
      --out /tmp/peer.json                                  # a GPU (torch.compile ~45 s)
  python benchmarks/torch_peer.py --smoke --modes eager,compile   # tiny shapes, CPU, seconds

The model is the config's: its rows x max_len target slots (the same number of source slots),
joint vocabulary, d_model, heads, key/value heads, head_dim, d_ff, encoder and decoder layers,
the feed-forward's activation (model.ffn: ReLU, swish, exact GELU), the attention's biases
(model.attention_bias), dropout on the embedding sums and the sub-layers' outputs, on the
attention probabilities and on the FFN's hidden layer (model's three rates), LayerNorm with
model.layer_norm_epsilon, post-LN (or pre-LN with model.pre_layer_norm, final norms included),
one embedding shared by source, target and the output projection scaled by sqrt(d_model)
(Sec. 3.4), with model.logits_bias a fixed bias on the logits (MarianMT's), label-smoothed
cross-entropy (Sec. 5.4) and Adam (beta2 0.98, eps 1e-9; fused), in bfloat16 autocast on a GPU.
A config whose model the peer does not build (another feed-forward, norm or embedding sharing:
`BUILDS`), or a numeric setting's value it does not build (the declarations of
transformer/model/settings.py, `model.peer_refusal`), is refused in one line, so a time is
never one of a different model's. Attention is `F.scaled_dot_product_attention` (flash; causal
by flag; grouped key/value heads by ``enable_gqa``, query head i reading key head i // (N/K)).
The rows are whole sequences, with no packing mask: that favours the peer, whose attention
skips no segment work and reads no mask. Modes: ``eager`` and ``compile`` (`torch.compile` of
the whole step).

Prints one JSON line per mode (ms/step: median of ``--rounds`` rounds of ``--steps`` steps)
and writes them to ``--out``. Without torch it prints one line saying so and writes
{"error": ...}: the project does not need torch; benchmarks/gpu_check.py and
benchmarks/step_variants.py run this file in a process of its own (``--peer``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

SMOKE = {'rows': 4, 'length': 16, 'vocab': 500, 'd_model': 64, 'heads': 4, 'd_ff': 128}
SMOKE |= {'kv_heads': 4}
SMOKE |= {'encoder_layers': 1, 'decoder_layers': 1, 'dropout': 0.1, 'label_smoothing': 0.1}
SMOKE |= {'pre_ln': False, 'head_dim': 16, 'epsilon': 1e-6}
SMOKE |= {'attention_dropout': 0.0, 'relu_dropout': 0.0}
SMOKE |= {'ffn': 'relu', 'attention_bias': False, 'logits_bias': False}
# The values of the model's variant fields (transformer/model/variants.py) the peer builds;
# any other, a registered one included, is refused, and so is every value of a variant field
# missing here (a part added to the registry is refused until the peer builds it).
BUILDS = {
    'ffn': ('relu', 'swish', 'gelu'),
    'norm': ('layer_norm',),
    'pre_layer_norm': (False, True),
    'layernorm_embedding': (False,),
    'share_embeddings': ('all',),
    'logits_bias': (False, True),
    'positions': ('sinusoidal',),
}
# The feed-forward's activation of each ``model.ffn`` value above, a torch.nn module:
# transformer/model/feed_forward.py's (nn.GELU's default is the exact erf form, as ours).
ACTIVATIONS = {'relu': 'ReLU', 'swish': 'SiLU', 'gelu': 'GELU'}


class Refused(SystemExit):
    """A config whose model the peer does not build: one line, naming the field."""


def refusal(model) -> str | None:
    """One line for the first of ``model``'s (the config's model section) variant fields, or
    numeric settings (their declarations: `transformer.model.peer_refusal`), that the peer
    does not build; None where it builds them all."""
    from transformer.model import peer_refusal, variants

    for key in filter(None, variants.FIELDS.values()):
        value, built = model[key], BUILDS.get(key, ())
        if value not in built:
            return (
                f'model.{key}={value!r} is not built by the PyTorch peer (it builds '
                f"{' or '.join(map(repr, built))}): its time would be a different model's."
            )
    refused = peer_refusal(model)
    return f"{refused}: its time would be a different model's." if refused else None


def config_shapes(name: str, settings: list[str] = ()) -> dict:
    """The step's shapes and settings from a project config (``KEY=VALUE`` overrides)."""
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from transformer import configs, schema

    config = configs.load(name)
    config.model.update(schema.default_config().model.to_dict() | config.model.to_dict())
    for setting in settings:  # as step_variants.py reads --set
        key, value = setting.split('=', 1)
        for cast in (int, float, {'True': True, 'False': False}.__getitem__, str):
            try:
                value = cast(value)
                break
            except (ValueError, KeyError):
                pass
        config.update_from_flattened_dict({key: value})
    from transformer.model import settings

    m = config.model
    refused = refusal(m)
    if refused:
        raise Refused(refused)
    return {
        'rows': config.train.batch_size,
        'length': config.data.max_len,
        'vocab': config.data.vocab_size,
        'd_model': m.d_model,
        'heads': m.num_heads,
        'kv_heads': settings.num_kv_heads(m),
        'd_ff': m.d_ff,
        'encoder_layers': m.num_encoder_layers,
        'decoder_layers': m.num_decoder_layers,
        'dropout': m.dropout_rate,
        'label_smoothing': config.train.label_smoothing,
        'pre_ln': bool(m.pre_layer_norm),
        'head_dim': settings.head_dim(m),
        'epsilon': m.layer_norm_epsilon,
        'attention_dropout': m.attention_dropout_rate,
        'relu_dropout': m.relu_dropout_rate,
        'ffn': m.ffn,
        'attention_bias': bool(m.attention_bias),
        'logits_bias': bool(m.logits_bias),
    }


def param_count(shapes: dict) -> int:
    """The parameters `build` makes, counted without torch: per attention q [D, N*H], k, v
    [D, K*H] and out [N*H, D], biased with model.attention_bias; per FFN two biased linears; per
    sub-layer (and with pre-LN per stack) a LayerNorm's scale and bias; one [V, D] embedding and,
    with model.logits_bias, a [V] bias on the logits."""
    d, f = shapes['d_model'], shapes['d_ff']
    heads, kv_heads, hd = shapes['heads'], shapes['kv_heads'], shapes['head_dim']
    attention = 2 * d * (heads + kv_heads) * hd
    if shapes['attention_bias']:  # q [N*H], k and v [K*H], out [D]
        attention += (heads + 2 * kv_heads) * hd + d
    ffn = d * f + f + f * d + d
    encoder = attention + ffn + 2 * 2 * d
    decoder = 2 * attention + ffn + 3 * 2 * d
    final = 2 * 2 * d if shapes['pre_ln'] else 0
    layers = shapes['encoder_layers'] * encoder + shapes['decoder_layers'] * decoder
    logits_bias = shapes['vocab'] if shapes['logits_bias'] else 0
    return layers + final + shapes['vocab'] * d + logits_bias


def build(torch, shapes: dict):
    """The peer model: an `nn.Module` taking (source ids, target input ids) -> logits."""
    nn, F = torch.nn, torch.nn.functional
    d, heads, p = shapes['d_model'], shapes['heads'], shapes['dropout']
    hd, eps, kv_heads = shapes['head_dim'], shapes['epsilon'], shapes['kv_heads']
    bias = shapes['attention_bias']

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.q = nn.Linear(d, heads * hd, bias=bias)
            self.k, self.v = (nn.Linear(d, kv_heads * hd, bias=bias) for _ in range(2))
            self.o = nn.Linear(heads * hd, d, bias=bias)

        def forward(self, x, y, causal):
            b, t, _ = x.shape

            def split(z, n):
                return z.view(b, -1, n, hd).transpose(1, 2)

            a = F.scaled_dot_product_attention(
                split(self.q(x), heads),
                split(self.k(y), kv_heads),
                split(self.v(y), kv_heads),
                dropout_p=shapes['attention_dropout'] if self.training else 0.0,
                is_causal=causal,
                enable_gqa=kv_heads != heads,
            )
            return self.o(a.transpose(1, 2).reshape(b, t, heads * hd))

    class Layer(nn.Module):
        def __init__(self, cross: bool):
            super().__init__()
            self.parts = nn.ModuleList([Attention()] + ([Attention()] if cross else []))
            activation = getattr(nn, ACTIVATIONS[shapes['ffn']])()
            hidden = (nn.Linear(d, shapes['d_ff']), activation, nn.Dropout(shapes['relu_dropout']))
            self.ffn = nn.Sequential(*hidden, nn.Linear(shapes['d_ff'], d))
            self.norms = nn.ModuleList(nn.LayerNorm(d, eps) for _ in range(len(self.parts) + 1))

        def forward(self, x, memory=None):
            subs = [lambda h: self.parts[0](h, h, memory is not None)]
            if memory is not None:
                subs.append(lambda h: self.parts[1](h, memory, False))
            subs.append(self.ffn)
            for sub, norm in zip(subs, self.norms, strict=True):
                if shapes['pre_ln']:
                    x = x + F.dropout(sub(norm(x)), p, self.training)
                else:
                    x = norm(x + F.dropout(sub(x), p, self.training))
            return x

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.embedding = nn.Embedding(shapes['vocab'], d)
            nn.init.normal_(self.embedding.weight, std=d**-0.5)
            self.encoder = nn.ModuleList(Layer(False) for _ in range(shapes['encoder_layers']))
            self.decoder = nn.ModuleList(Layer(True) for _ in range(shapes['decoder_layers']))
            # Pre-LN leaves the residual stream un-normalised; a final norm closes each stack.
            final = (nn.LayerNorm(d, eps) for _ in range(2)) if shapes['pre_ln'] else ()
            self.final_norms = nn.ModuleList(final)
            position = torch.arange(shapes['length'])[:, None]
            angle = position / torch.pow(10000, torch.arange(0, d, 2) / d)
            self.register_buffer('positions', torch.cat([angle.sin(), angle.cos()], -1), False)
            if shapes['logits_bias']:  # fixed, as opt.train_logits_bias's default keeps it
                zeros = torch.zeros(shapes['vocab'])
                self.logits_bias = nn.Parameter(zeros, requires_grad=False)

        def embed(self, ids):
            x = self.embedding(ids) * math.sqrt(d) + self.positions[: ids.shape[1]]
            return F.dropout(x, p, self.training)

        def forward(self, source, target_in):
            s, t = self.embed(source), self.embed(target_in)
            for layer in self.encoder:
                s = layer(s)
            if shapes['pre_ln']:
                s = self.final_norms[0](s)
            for layer in self.decoder:
                t = layer(t, s)
            if shapes['pre_ln']:
                t = self.final_norms[1](t)
            logits = t @ self.embedding.weight.T
            return logits + self.logits_bias if shapes['logits_bias'] else logits

    return Model()


def time_mode(torch, shapes: dict, mode: str, device, args) -> dict:
    """ms/step of one mode: ``--warmup`` steps (compilation for 'compile'), then rounds."""
    F = torch.nn.functional
    gen = torch.Generator().manual_seed(0)
    rows, length, vocab = shapes['rows'], shapes['length'], shapes['vocab']
    source = torch.randint(3, vocab, (rows, length), generator=gen).to(device)
    target = torch.randint(3, vocab, (rows, length + 1), generator=gen).to(device)
    torch.manual_seed(0)
    model = build(torch, shapes).to(device).train()
    fused = device.type == 'cuda'
    opt = torch.optim.Adam(model.parameters(), 1e-4, betas=(0.9, 0.98), eps=1e-9, fused=fused)

    def step():
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == 'cuda'):
            logits = model(source, target[:, :-1]).float()
            loss = F.cross_entropy(
                logits.reshape(-1, vocab),
                target[:, 1:].reshape(-1),
                label_smoothing=shapes['label_smoothing'],
            )
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    sync = torch.cuda.synchronize if device.type == 'cuda' else (lambda: None)
    fn = torch.compile(step) if mode == 'compile' else step
    start = time.perf_counter()
    for _ in range(args.warmup):
        loss = fn()
    sync()
    warmup_s = time.perf_counter() - start
    rounds = []
    for _ in range(args.rounds):
        start = time.perf_counter()
        for _ in range(args.steps):
            loss = fn()
        sync()
        rounds.append((time.perf_counter() - start) / args.steps * 1e3)
    ms = statistics.median(rounds)
    name = torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'
    return {
        'impl': f'torch_{mode}',
        'torch': torch.__version__,
        'device': name,
        'ms_per_step': ms,
        'rounds_ms': rounds,
        'warmup_s': warmup_s,
        'slots_per_step': rows * length,
        'loss': float(loss.detach()),
    }


def run_child(config: str, settings: list[str], modes: str, timeout_s: float) -> dict:
    """This file in a process of its own (its GPU memory freed when it ends): the report, or
    {'error': line} where it fails or runs past ``timeout_s``."""
    script = os.path.abspath(__file__)
    with tempfile.TemporaryDirectory(prefix='torch-peer-') as scratch:
        out = os.path.join(scratch, 'peer.json')
        cmd = [sys.executable, script, f'--config={config}', f'--modes={modes}', f'--out={out}']
        cmd += [f'--set={setting}' for setting in settings]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return {'error': f'the PyTorch peer ran past {timeout_s:.0f} s'}
        if done.returncode or not os.path.exists(out):
            said = [line for line in (done.stderr or done.stdout).splitlines() if line.strip()]
            return {'error': said[-1].strip() if said else f'exit code {done.returncode}'}
        return json.loads(pathlib.Path(out).read_text())


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add('--config', default='configs/base.py', help='the project config whose shapes to run')
    add('--set', action='append', default=[], help='KEY=VALUE on the config')
    add('--smoke', action='store_true', help='tiny shapes on the CPU (checks this file)')
    add('--modes', default='eager,compile', help="comma-separated: 'eager', 'compile'")
    add('--steps', type=int, default=20, help='timed steps per round')
    add('--rounds', type=int, default=3, help='rounds (the median is reported)')
    add('--warmup', type=int, default=3, help='untimed steps first (compilation)')
    add('--out', default=None, help='JSON file of the results')
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    modes = [m for m in args.modes.split(',') if m]
    unknown = sorted(set(modes) - {'eager', 'compile'})
    if unknown:
        raise SystemExit(f"--modes takes 'eager' and 'compile', not {', '.join(unknown)}.")
    shapes = SMOKE if args.smoke else config_shapes(args.config, args.set)  # or Refused
    try:
        import torch
    except ImportError:
        report = {'error': 'torch is not installed: no PyTorch peer (pip install torch)'}
        print(report['error'], flush=True)
    else:
        device = torch.device('cuda' if torch.cuda.is_available() and not args.smoke else 'cpu')
        torch.backends.cuda.matmul.allow_tf32 = True
        report = {'shapes': shapes, 'modes': {}}
        for mode in modes:
            result = time_mode(torch, shapes, mode, device, args)
            print(json.dumps(result), flush=True)
            report['modes'][mode] = result
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(report, indent=2))
    return report


if __name__ == '__main__':
    main()
