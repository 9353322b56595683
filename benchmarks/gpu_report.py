"""The tables of `benchmarks/gpu_check.py`'s summary.md: the train step beside the PyTorch
peer, the kernel time by kind, the Multi30k run, the tests and the step variants."""

from __future__ import annotations


def markdown(summary: dict) -> str:
    """The summary's tables, each part that ran."""
    lines = [f'# gpu_check: {summary["device"]}, jax {summary["jax"]}', '']
    lines += _speed(summary)
    lines += _kernels(summary.get('kernels'))
    lines += _multi30k(summary.get('multi30k'))
    t = summary.get('tests')
    if t:
        lines += [f'Tests `pytest {t["args"]}`: exit code {t["exit_code"]}, {t["summary"]}', '']
        lines += [f'- failed: `{name}`' for name in t.get('failed', [])]
    v = summary.get('variants')
    if v:
        lines += [v.get('table') or f'Variants: failed: {v.get("error")}', '']
    return '\n'.join(lines)


def _speed(summary: dict) -> list[str]:
    """train_speed's rows, each as ours / torch.compile where the peer ran in the same call."""
    speed = summary.get('train_speed') or {}
    compiled = ((summary.get('peer') or {}).get('modes') or {}).get('compile') or {}
    torch_ms = compiled.get('ms_per_step')  # the PyTorch peer's, from the same call
    if not speed:
        return []
    lines = [
        '| attention | ms/step | MFU | tokens/s | XLA temporaries MiB | peak MiB '
        '| ours / torch.compile |',
        '|---|---|---|---|---|---|---|',
    ]
    for impl, r in speed.items():
        if 'error' in r:
            lines.append(f'| {impl} | failed: {r["error"]} | | | | | |')
            continue
        temp = '' if r['temp_bytes'] is None else f'{r["temp_bytes"] / 2**20:.0f}'
        peak = f'{r["peak_device_mib"]:.0f}' if 'peak_device_mib' in r else ''
        ratio = f'{r["ms_per_step"] / torch_ms:.2f}' if torch_ms else ''
        lines.append(
            f'| {impl} | {r["ms_per_step"]:.1f} | {r["mfu"]:.1%} | {r["tokens_per_s"]:,.0f} '
            f'| {temp} | {peak} | {ratio} |'
        )
    if torch_ms:
        lines.append(f'\nPyTorch peer (torch.compile, same shapes): {torch_ms:.1f} ms/step')
    return [*lines, '']


def _kernels(kernels: dict | None) -> list[str]:
    """Kernel time by kind and the top kernels of the profiled step."""
    if not kernels:
        return []
    if 'error' in kernels:
        return [f'Kernels: no table ({kernels["error"]})', '']
    lines = [f'Kernels ({kernels["device"]}, {kernels["ms_per_step"]:.2f} ms/step):', '']
    lines += ['| kind | ms/step | share |', '|---|---|---|']
    for k in kernels['kinds']:
        lines.append(f'| {k["kind"]} | {k["ms_per_step"]:.3f} | {k["share"]:.1%} |')
    lines += ['', '| kernel | kind | ms/step | share | calls/step |', '|---|---|---|---|---|']
    lines += [
        f'| `{t["name"][:90]}` | {t["kind"]} | {t["ms_per_step"]:.3f} | {t["share"]:.1%} '
        f'| {t["calls_per_step"]:g} |'
        for t in kernels['top']
    ]
    return [*lines, '']


def _multi30k(m: dict | None) -> list[str]:
    """The Multi30k run's speed, validation perplexity and BLEU."""
    if not m:
        return []
    v = m.get('validation', {})
    bleu = f'{v["tokenized_bleu"]:.2f}' if v else m.get('error', '')
    sacre = f'{v["sacrebleu"]:.2f}' if v else ''
    rate = f'{m["steps_per_s"]:.1f}' if 'steps_per_s' in m else ''
    ppl = m.get('final_metrics', {}).get('validation', {}).get('perplexity')
    ppl = '' if ppl is None else f'{ppl:.2f}'
    return [
        '| config | steps | train s | steps/s | validation ppl | validation BLEU | sacreBLEU |',
        '|---|---|---|---|---|---|---|',
        f'| {m["config"]} | {m["steps"]} | {m.get("train_s", 0):.0f} | {rate} | {ppl} | {bleu} '
        f'| {sacre} |',
        '',
    ]
