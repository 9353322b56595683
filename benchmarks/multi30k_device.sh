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
#
# Time plan (multi30k_sweep.py's docstring has the rule; the sweep prints its stop times
# first): trainings stop at DEADLINE_S - RESERVE_S; after them each run's validation needs
# about first + (S - 1) x later and the test split about first, S being the grid's 4 settings
# (2 alphas x 2 rules), first a run's first setting (load, compile, decode) and later each
# further one. On one H200 with six runs side by side (main 9f56641) first was 58-60 s with
# gnmt and a later setting 18-20 s (each new alpha or rule recompiled then; one program now
# serves every setting, so a later setting is a decode), so RESERVE_S >= 2 x 60 + 3 x 20 =
# 180 s scored the whole grid then; with less, each run's validation scores the first settings
# that fit and the test stage still runs. The R-Drop candidate's call and its plan:
# benchmarks/README.md "The candidates' device plan".
#
# Knobs for a smaller run (a CPU smoke): SETS, more KEY=VALUE settings for every run
# (e.g. "train.num_steps=40 train.checkpoint_every=10"); MAX_EXAMPLES, the sentences decoded
# per split (default 0: all); GRACE_S, the seconds a stopped training has to save and exit
# before SIGKILL (default 60).
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
sets=()
for setting in ${SETS:-}; do
  sets+=(--set "$setting")
done
echo "multi30k_device.sh: RECIPES=\"${RECIPES:-tiny tiny_fairseq}\" SEEDS=\"${SEEDS:-0 1 2}\"" \
  "DEADLINE_S=${DEADLINE_S:-480} RESERVE_S=${RESERVE_S:-210} SETS=\"${SETS:-}\"" \
  "MAX_EXAMPLES=${MAX_EXAMPLES:-0} GRACE_S=${GRACE_S:-60} RUNS=$RUNS"

python3 benchmarks/multi30k_sweep.py --out "$RUNS" --seeds ${SEEDS:-0 1 2} "${recipes[@]}" \
  --set "data.manual_dir=$PWD/.m30k" --set eval.bleu_every=0 "${sets[@]}" \
  --average_last 10 --beam_size 5 --alpha 1.0 1.4 --length_penalty gnmt fairseq \
  --max_examples "${MAX_EXAMPLES:-0}" \
  --deadline_s "${DEADLINE_S:-480}" --reserve_s "${RESERVE_S:-210}" --grace_s "${GRACE_S:-60}"
status=$?

if [ -n "${OUT:-}" ]; then
  cp "$RUNS"/sweep.md "$RUNS"/sweep.json "$OUT"/ 2>/dev/null
  (cd "$RUNS" && tar czf "$OUT"/logs.tar.gz ./*/*.log ./*/*.json 2>/dev/null)
fi
exit $status
