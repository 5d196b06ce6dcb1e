#!/usr/bin/env bash
# On the GPU machine, from the project root, after .gpu/ (fbgemm-gpu parts) and .whl/ (TorchRec and its
# pure-Python needs) have arrived: the pipeline's stages at batch 65536 on FBGEMM's CUDA kernels, the learned
# sharders trained there and evaluated beside the heuristics and TorchRec's full planner.
# Usage: bash tools/gpu_b65536.sh BUDGET_SECONDS   (everything lands in $OUT/gpu_b65536.tgz, also when time runs out)
#        bash tools/gpu_b65536.sh data             (the data stages alone, on the host CPU: start it in the first
#        transfer call with `setsid nohup ... &` so that it runs while the parts arrive; the main run waits for it)
# Bringing the parts there: results/gpu/README.md. Smoke test on a CPU (tiny params, seconds):
#   OUT=/tmp/o DEVICE=cpu BATCH=64 PARAMS=tiny.yaml PY=.venv/bin/python SKIP_INSTALL=1 bash tools/gpu_b65536.sh 400
# TEST_TASKS=N: N test tasks per family instead of params.yaml's (the same in both calls); or FAMILY=N,... for each.
# ROUNDS: evaluate's interleaved rounds (1). HBM_GBPS: the GPU's memory bandwidth TorchRec's planners are told
#   (default: measured here by a device-to-device copy, recorded in $OUT; "none": TorchRec's default).
# UVM=1: also tools/gpu_uvm.py (UVM caching against the model of it) right after the install, while the data stages
#   still run on the host (UVM_S: its time cap, UVM_ARGS: its arguments).
# RESUME=1 (a second call on the same warm machine): straight to evaluate, which continues from its journal.
# TORCHREC_MODEL=1: also evaluate torchrec_model (our search rated by TorchRec's perf model) where TorchRec plans.
# The trainings run one after another: two torch fits side by side on the 16-core GPU host finished
# nothing in 6 minutes (the first attempt of 2026-11-26: results/gpu/README.md, History).
set -u
BUDGET=${1:-480}
DEVICE=${DEVICE:-cuda}; BATCH=${BATCH:-65536}; PARAMS=${PARAMS:-params.yaml}; PY=${PY:-python3}  # smoke test: cpu, tiny
T0=$(date +%s)
O=${OUT:-/tmp/out}; W=${WORK:-/tmp/gw}; G=${GO:-/tmp/go}; mkdir -p "$O" "$G"
log() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a "$G/timeline.txt"; }
left() { local s=$(( BUDGET - ( $(date +%s) - T0 ) - 25 )); echo $(( s > 1 ? s : 1 )); }  # timeout 0 would mean none
finish() {
  log "packing"
  cp -r "$W/metrics" "$W/plots" "$G/" 2>/dev/null
  mkdir -p "$G/models" && cp "$W"/models/*.pt "$W"/models/*.json "$G/models/" 2>/dev/null
  cp -r "$W/data/eval_journal" "$G/" 2>/dev/null
  mkdir -p "$G/measured" && cp -r "$W/data/costs" "$W/data/single_devices" "$G/measured/" 2>/dev/null  # the GPU's plan rows
  tar czf "$O/gpu_b65536.tgz" -C /tmp go
  exit 0
}
trap finish TERM

export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,memory.total --format=csv > "$G/nvidia-smi.csv" 2>&1

if [ -n "${TEST_TASKS:-}" ]; then  # the same params file in the data call and the main one
  $PY -c "import sys, yaml; p = yaml.safe_load(open(sys.argv[1])); spec = sys.argv[2]
families = p['tasks']['profiles'][p['tasks']['profile']]
if '=' in spec:  # FAMILY=N,...: those counts, every family named
    counts = {k: int(v) for k, v in (x.split('=') for x in spec.split(','))}
    missing = sorted(set(counts) ^ {f['name'] for f in families})
    if missing: sys.exit(f'TEST_TASKS: name every family of the profile, and only those: {missing}')
else:
    counts = {f['name']: int(spec) for f in families}
for f in families: f['num_test'] = counts[f['name']]
yaml.safe_dump(p, open(sys.argv[3], 'w'), sort_keys=False)" "$PARAMS" "$TEST_TASKS" "$G/params.yaml" || exit 1
  PARAMS=$G/params.yaml
fi
# the GPU's memory bandwidth for TorchRec's perf model: a device-to-device copy of 1 GiB (read + written), median of 20
if [ ! -f "$G/hbm_gbps" ]; then
  if [ -n "${HBM_GBPS:-}" ]; then echo "$HBM_GBPS" > "$G/hbm_gbps"
  elif [ "$DEVICE" = cuda ]; then $PY -c "import torch
n = 1 << 30; x = torch.empty(n, dtype=torch.uint8, device='cuda'); y = torch.empty_like(x); ms = []
for i in range(23):
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True); a.record(); y.copy_(x); b.record()
    torch.cuda.synchronize(); ms.append(a.elapsed_time(b))
print(round(2 * n / sorted(ms[3:])[10] / 1e6, 1))" > "$G/hbm_gbps" 2> "$G/hbm_gbps.log" || echo none > "$G/hbm_gbps"
  else echo none > "$G/hbm_gbps"; fi
fi
HBM=$(cat "$G/hbm_gbps"); [ "$HBM" = none ] && HBM=null
B=(--params "$PARAMS" --set data.synthetic.batch_size=$BATCH --set process.sample_batch=$BATCH --set backend.batch_size=$BATCH
   --set backend.hbm_gbps=$HBM)
C=(--set collect.rounds=1 --set collect_devices.rounds=1 --set collect_devices.samples=600)
E=(--set evaluate.rounds=${ROUNDS:-1} --set evaluate.train_tasks_per_family=2 --set evaluate.best_known.tasks_per_family=0
   --set evaluate.estimated_bins.tasks_per_family=0 --set orchestration.evaluate.planning_workers=8 ${EXTRA:-})
# EXTRA: more settings, words without spaces, e.g. EXTRA="--set evaluate.exhaustive.num_tasks=1"
run() { local out=$1; shift; $PY -m tools.gpu_run --root "$W" --out "$G/$out" "$@" "${B[@]}" "${C[@]}" "${E[@]}"; }
# one step on $DEVICE within SECONDS, its log in $G/STEP.log: within SECONDS STEP [more gpu_run arguments]
within() { local t=$1 step=$2; shift 2; timeout "$t" $PY -m tools.gpu_run --root "$W" --out "$G/$step" --device $DEVICE \
  --steps $step "${B[@]}" "${C[@]}" "${E[@]}" "$@" > "$G/$step.log" 2>&1; }

if [ "$BUDGET" = data ]; then
  log "data (CPU), alone"; rm -f "$G/data.rc"; run data --device cpu --steps data > "$G/data.log" 2>&1; echo $? > "$G/data.rc"
  log "data rc $(cat "$G/data.rc")"; exit 0
fi
# parts carried in earlier calls wait in /tmp/parts (a carried path is removed from the checkout by the next call)
if ls /tmp/parts/part.* >/dev/null 2>&1; then mkdir -p .gpu/p00 && mv /tmp/parts/part.* .gpu/p00/; fi
[ -n "${SKIP_INSTALL:-}" ] && INSTALL_CMD=true || INSTALL_CMD="bash .gpu/meta/install-on-device.sh"
if [ -n "${RESUME:-}" ]; then  # a second call on the same warm machine: installed, collected and trained already
  log "resuming evaluate"
else
rm -f "$G/installed"
# the install, then (UVM=1) the UVM caching check while the GPU is otherwise idle (the data stages run on the host)
( $INSTALL_CMD \
  && { [ -n "${SKIP_INSTALL:-}" ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl; } \
  && touch "$G/installed" && { [ -z "${UVM:-}" ] || timeout "${UVM_S:-90}" $PY -m tools.gpu_uvm --out "$G/uvm" --device $DEVICE \
       ${UVM_ARGS:-} > "$G/uvm.log" 2>&1; true; } ) \
  > "$G/install.log" 2>&1 &
INSTALL=$!
if [ -f "$G/data.log" ]; then  # started by an earlier call: wait for it (collect needs it, so no time is lost)
  log "waiting for the data stages started earlier"
  until [ -f "$G/data.rc" ]; do sleep 2; done
  [ "$(cat "$G/data.rc")" = 0 ] || { log "data failed"; tail -20 "$G/data.log"; finish; }
  log "data done: $(grep -h ' s$' "$G/data.log" | tr '\n' ' ')"
else
  log "data (CPU) while fbgemm-gpu installs"
  run data --device cpu --steps data > "$G/data.log" 2>&1 || { log "data failed"; tail -20 "$G/data.log"; finish; }
fi
wait $INSTALL; [ -f "$G/installed" ] || { log "install failed"; cat "$G/install.log"; finish; }
cat "$G/install.log"; [ -z "${UVM:-}" ] || log "uvm check: $(tail -c 300 "$G/uvm.log")"
log "collect"
# within the budget too: at 4 s a plan (the second attempt: results/gpu/README.md, History) collect alone outlasted a 600 s call
within "$(left)" collect || { log "collect failed or stopped"; tail -5 "$G/collect.log"; finish; }
# each training within its cap and the time left
for item in train_cost:${CAP_COST:-120} train_policy:${CAP_POLICY:-150} train_neuroshard:${CAP_NEURO:-120} \
            train_autoshard:${CAP_AUTO:-90}; do
  stage=${item%%:*}; cap=${item##*:}; t=$(left); [ "$t" -lt "$cap" ] || t=$cap
  case $stage in train_neuroshard|train_autoshard)  # the least needed: only with EVAL_MIN s kept for evaluate
    if [ $(( $(left) - cap )) -lt "${EVAL_MIN:-240}" ]; then log "$stage skipped"; continue; fi; esac
  log "$stage (at most $t s)"
  OMP_NUM_THREADS=${TRAIN_THREADS:-4} within "$t" $stage || log "$stage stopped (rc $?)"
done
log "trained: $(ls $W/models)"
fi  # RESUME
S=${HEURISTICS:-random,size_greedy,dim_greedy,lookup_greedy,size_lookup_greedy}
[ -f "$W/models/dreamshard.pt" ] && S=$S,dreamshard,dreamshard_cut
[ -f "$W/models/autoshard.pt" ] && S=$S,autoshard
[ -f "$W/models/neuroshard.pt" ] && S=$S,neuroshard
# TorchRec's planners as carried (.whl) with this torch: one task planned before evaluate counts on them; both are
# the peer (table-wise and full), told the backend's hosts and links, this GPU's memory bandwidth, per-rank batch
if timeout 60 $PY -c "import sys; from dreamshard.sharders import make_sharder; from dreamshard.plan import validate_plan
from dreamshard.tasks import read_tasks
task = read_tasks(sys.argv[1] + '/data/tasks/test.parquet', sys.argv[1] + '/data/tables.parquet')[0]
validate_plan(task, make_sharder('torchrec_full', batch_size=int(sys.argv[2])).shard(task)); print('torchrec_full plans', task.name)" \
   "$W" "$BATCH" > "$G/torchrec_check.log" 2>&1; then S=$S,torchrec,torchrec_full${TORCHREC_MODEL:+,torchrec_model}; fi
log "$(tail -1 "$G/torchrec_check.log")"
log "evaluate [$S] within $(left) s"
within "$(left)" evaluate --set "evaluate.sharders=[$S]" || log "evaluate stopped (rc $?)"
grep -E "^evaluate|regime|bound" "$G/evaluate.log" | tail -5
log "done"
finish
