#!/usr/bin/env bash
# The one command for a machine with an NVIDIA GPU (as root): trains a small
# model fed by a slow DataLoader, attaches stall to it, samples nvidia-smi
# meanwhile, and prints stall's verdict next to what nvidia-smi saw; then the
# CUDA cases (train_cuda.py): a job that synchronizes every step (GPU-bound)
# and one that launches tiny kernels (launch-bound), each under `stall run`,
# whose probes on PyTorch's own libcudart are what is checked.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-$here/out}
mkdir -p "$out"
secs=${SECONDS_TO_TRACE:-30}

python3 -u "$here/train_dataloader.py" --seconds $((secs + 10)) >"$out/train.out" 2>"$out/train.err" &
train=$!
for _ in $(seq 600); do
    grep -q '^PID ' "$out/train.out" 2>/dev/null && break
    kill -0 $train 2>/dev/null || { cat "$out/train.err"; exit 1; }
    sleep 0.5
done
pid=$(awk '/^PID /{print $2; exit}' "$out/train.out")

nvidia-smi --query-gpu=timestamp,index,utilization.gpu,memory.used --format=csv,noheader,nounits -lms 200 >"$out/nvidia-smi.csv" &
smi=$!
"$here/stall" attach --pid "$pid" --duration "$secs" --json "$out/stall.jsonl" -q >"$out/stall.txt" 2>"$out/stall.err" || true
kill $smi 2>/dev/null || true
wait $train || true

echo "== stall (attached to pid $pid for ${secs}s)"
cat "$out/stall.err"
sed -n '/^verdict:/,$p' "$out/stall.txt"
python3 - "$out" <<'PY'
import csv, json, sys
out = sys.argv[1]
rows = [r for r in csv.reader(open(f"{out}/nvidia-smi.csv")) if len(r) >= 4]
by = {}
for r in rows:
    by.setdefault(r[1].strip(), []).append(float(r[2]))
summary = [json.loads(l) for l in open(f"{out}/stall.jsonl")][-1]
print("== nvidia-smi vs stall")
for idx, u in sorted(by.items()):
    idle = sum(1 for x in u if x <= 5) / len(u)
    print(f"GPU{idx}: nvidia-smi mean util {sum(u)/len(u):.0f}%, idle {idle:.0%} ({len(u)} samples)")
for g in summary["gpus"]:
    print(f"GPU{g['index']}: stall mean util {g['util_mean_pct']:.0f}%, idle {g['idle_fraction']:.0%} ({g['samples']} samples, max gap {g['max_gap_s']:.1f}s)")
trainers = [p for p in summary["processes"] if p["role"] == "trainer"]
print("stall trainer(s):", [(p["pid"], p["comm"]) for p in trainers], "verdict:", summary["verdict"]["kind"])
PY

# The CUDA cases: stall starts each job, so it sees PyTorch load libcudart.
cuda_secs=${CUDA_SECONDS:-20}
for mode in sync launch; do
    nvidia-smi --query-gpu=timestamp,index,utilization.gpu,memory.used --format=csv,noheader,nounits -lms 200 >"$out/nvidia-smi-$mode.csv" &
    smi=$!
    "$here/stall" run --json "$out/stall-$mode.jsonl" -q -- python3 -u "$here/train_cuda.py" "$mode" --seconds "$cuda_secs" \
        >"$out/stall-$mode.txt" 2>"$out/stall-$mode.err" || true
    kill $smi 2>/dev/null || true
    echo "== CUDA case: $mode"
    grep -m1 'GPU library probes' "$out/stall-$mode.txt" "$out/stall-$mode.err" || echo "(no probe line)"
    sed -n '/^verdict:/,/^$/p' "$out/stall-$mode.txt"
    python3 - "$out" "$mode" <<'PY'
import csv, json, sys
out, mode = sys.argv[1], sys.argv[2]
rows = [r for r in csv.reader(open(f"{out}/nvidia-smi-{mode}.csv")) if len(r) >= 4]
u = [float(r[2]) for r in rows]
if u:
    print(f"nvidia-smi mean util {sum(u)/len(u):.0f}% over {len(u)} samples")
summary = [json.loads(l) for l in open(f"{out}/stall-{mode}.jsonl")][-1]
v = summary["verdict"]
print("stall verdict:", v["kind"], "|", summary.get("gpu_probes"))
for p in summary["processes"]:
    for t in p["threads"]:
        if t.get("gpu_calls"):
            print(f"  tid {t['tid']} ({t['comm']}): {t['gpu_calls']}")
PY
done
