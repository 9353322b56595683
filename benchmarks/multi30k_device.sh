#!/usr/bin/env bash
# configs/multi30k.py:tiny and :tiny_fairseq (RECIPES), 3 seeds each (SEEDS), trained side by
# side on one GPU and scored by benchmarks/multi30k_sweep.py within one bounded call
# (DEADLINE_S, default 480 s).
#
# Run from the repository root on a machine with a GPU and no network, with two ignored folders
# beside the code: .m30k/ (the raw Multi30k files: train/val/test2016 .en/.de) and .whl/ (the
# wheels that machine's Python lacks: ml_collections, sacremoses and what sacremoses imports,
# joblib and tqdm; `pip download --no-deps -d .whl ml_collections==1.1.0 sacremoses==0.1.1
# joblib==1.6.0 tqdm==4.70.1`). Runs go to
# RUNS (default /tmp/m30k_sweep); the table (sweep.md, sweep.json) and a tarball of every log
# and validation table are copied to OUT when it is set.
set -uo pipefail

if compgen -G '.whl/*.whl' >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONUNBUFFERED=1
RUNS=${RUNS:-/tmp/m30k_sweep}

# RECIPES="tiny" trains one recipe alone (when six runs do not fit one call).
recipes=()
for name in ${RECIPES:-tiny tiny_fairseq}; do
  recipes+=(--recipe "$name=configs/multi30k.py:$name")
done

python3 benchmarks/multi30k_sweep.py --out "$RUNS" --seeds ${SEEDS:-0 1 2} "${recipes[@]}" \
  --set "data.manual_dir=$PWD/.m30k" --set eval.bleu_every=0 \
  --average_last 10 --beam_size 5 --alpha 1.0 1.4 --length_penalty gnmt fairseq \
  --deadline_s "${DEADLINE_S:-480}" --reserve_s "${RESERVE_S:-210}"
status=$?

if [ -n "${OUT:-}" ]; then
  cp "$RUNS"/sweep.md "$RUNS"/sweep.json "$OUT"/ 2>/dev/null
  (cd "$RUNS" && tar czf "$OUT"/logs.tar.gz ./*/*.log ./*/*.json 2>/dev/null)
fi
exit $status
