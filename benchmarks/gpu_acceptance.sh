#!/usr/bin/env bash
# Every GPU check of hotswap in one command, for a short slot on a GPU machine (an H100/H200
# with 16 cores: about 4-5 minutes wall):
#
#     benchmarks/gpu_acceptance.sh                          # results in ./gpu-acceptance/
#     OUT=/path/to/results benchmarks/gpu_acceptance.sh
#     PARTS="nvml drill bench-mttr" benchmarks/gpu_acceptance.sh   # some parts only
#
# Phase 1, in parallel (pass/fail checks; each with its own HOTSWAP_HOME):
#   gpu-tests            python -m pytest -m gpu (the real-GPU tests; among them the GPT example's DDP
#                        on NCCL, migrated mid-run, against its uninterrupted curve, bootstrap on lo)
#   nvml                 python -m hotswap.backends.local.gpu.probe --once
#   drill                hotswap demo gpu --backing gpu --json (>= 1 GB of state on the GPU)
#   demo-hotswap         hotswap demo hotswap --json            (GPU visible; auto backing)
#   demo-migration       hotswap demo migration --json
#   demo-elastic         hotswap demo elastic --fail-slice 0 --json (PyTorch, NCCL on GPU slices; rank 0 lost)
#   demo-elastic-jax     hotswap demo elastic --framework jax --fail-slice 0 --json
#   demo-migration-jax   hotswap demo migration --framework jax --json
#   demo-shrink          hotswap demo shrink --json             (an elastic low job shrinks for high)
# Phase 2, one at a time (measurements, nothing else running):
#   bench-mttr           python benchmarks/bench_mttr.py --json --runs 1 --repair-s -1 --import-runs 1
#                        (default, cold, cold with the zygote (no spare ready) and warm MTTR, with the
#                        phases of each restart; import torch cold/warm)
#   bench-checkpoint     python benchmarks/bench_checkpoint.py --device cuda --state-gb 2 --repeat 3 --json
#   bench-jax            python benchmarks/bench_jax.py --device gpu --json --size 512 --repeat 3 --mttr-runs 1
#
# Every part runs under its own timeout (a hang cannot eat the slot); phase 2 also stops when the
# whole run's budget (TOTAL_S, default 295 s) is spent. Files written under $OUT (at most 8):
# summary.txt, environment.txt, checks.json, benchmarks.json, pytest_gpu.txt, logs.txt.
# The run ends with one line per part: PASS/FAIL/SKIP, seconds taken, key figure.
#
# Runs from the source tree (PYTHONPATH=src). Wheels in <repo>/.whl (or $WHEELS) are installed
# first into /tmp/site (no index, no dependencies) and put on the path: packages the machine
# lacks (pydantic, platformdirs, ...). Without a GPU (torch.cuda unavailable) the GPU parts
# print "skipped: no GPU" at once; ON_CPU=1 runs them anyway on the CPU where a part can
# (to prove the plumbing and time it on a machine without a GPU). The exit code is the number
# of parts that failed.
set -u

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${OUT:-$PWD/gpu-acceptance}"
PYTHON="${PYTHON:-python3}"
TOTAL_S="${TOTAL_S:-295}"
PHASE1="gpu-tests nvml drill demo-hotswap demo-migration demo-elastic demo-elastic-jax demo-migration-jax demo-shrink"
PHASE2="bench-mttr bench-checkpoint bench-jax"  # the restart first: the issue's figure
PARTS="${PARTS:-$PHASE1 $PHASE2}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
WORK="$(mktemp -d -t hotswap-acceptance-XXXXXX)"
STARTED=$SECONDS
cd "$ROOT"

WHEELS="${WHEELS:-$ROOT/.whl}"
SITE=""
if compgen -G "$WHEELS/*.whl" > /dev/null; then
    SITE=/tmp/site
    "$PYTHON" -m pip install -q --upgrade --no-index --no-deps --no-compile --target "$SITE" "$WHEELS"/*.whl > "$WORK/install.err" 2>&1 \
        || echo "installing the wheels of $WHEELS failed: $(tail -n 3 "$WORK/install.err")" >&2
fi
export PYTHONPATH="$ROOT/src${SITE:+:$SITE}${PYTHONPATH:+:$PYTHONPATH}"
# The Kubernetes parts read the shared CRDs; no GPU part needs them.
[[ -d "$ROOT/../shared/crds" && -z "${HOTSWAP_SHARED_CRDS:-}" ]] && export HOTSWAP_SHARED_CRDS="$ROOT/../shared/crds"
export PYTHONUNBUFFERED=1

GPU=cpu
if "$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2> /dev/null; then GPU=gpu; fi
CPU_RUN="${ON_CPU:-0}"

{
    echo "date: $(date -u +%FT%TZ)"
    echo "host: $(hostname), $(nproc) CPUs"
    echo "commit: $(git -C "$ROOT" log -1 --format='%h %s' 2>/dev/null || echo '?')"
    # A copied tree may carry a stale .git: the hash of what runs (git hash-object of each file) says which tree it was.
    echo "tree: src+benchmarks $( (cd "$ROOT" && find src/hotswap benchmarks -name '*.py' -o -name '*.sh' | LC_ALL=C sort | xargs git hash-object 2>/dev/null | sha1sum | cut -c1-12) )"
    echo "gpu: $GPU (ON_CPU=$CPU_RUN)"
    nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv 2>&1 || echo "nvidia-smi: not found"
    "$PYTHON" - <<'EOF'
import importlib, platform
print("python", platform.python_version())
for name in ("torch", "jax", "orbax.checkpoint", "pynvml", "pydantic", "typer", "rich", "yaml", "platformdirs", "matplotlib", "pytest", "hypothesis"):
    try:
        module = importlib.import_module(name)
        print(name, getattr(module, "__version__", "?"), getattr(module, "__file__", ""))
    except Exception as error:
        print(name, "MISSING", type(error).__name__, error)
EOF
    [[ -n "$SITE" ]] && echo "wheels installed from $WHEELS into $SITE: $(ls "$WHEELS" | tr '\n' ' ')"
} > "$OUT/environment.txt" 2>&1

# The command of a part, given the device; empty: the part cannot run here.
command_of() {
    local device_torch=cuda device_jax=gpu
    [[ "$GPU" == gpu ]] || { device_torch=cpu; device_jax=cpu; }
    case "$1" in
        # Only the files that hold gpu tests: collecting the whole suite would need its every
        # dependency (kubernetes, ...), which a GPU machine may lack.
        # test_drills_on_gpu_backed_slices runs the drill and demo-migration parts again: left
        # out here (they run beside it), which keeps the slowest part of phase 1 under a minute.
        gpu-tests) echo "$PYTHON -m pytest -q -m gpu -p no:cacheprovider --durations=5 --deselect tests/test_gpu_real.py::test_drills_on_gpu_backed_slices[gpu] --deselect tests/test_gpu_real.py::test_drills_on_gpu_backed_slices[migration] $(grep -l 'mark\.gpu' tests/test_*.py | tr '\n' ' ')" ;;
        nvml) [[ "$GPU" == gpu ]] && echo "$PYTHON -m hotswap.backends.local.gpu.probe --once" ;;
        drill) [[ "$GPU" == gpu ]] && echo "$PYTHON -m hotswap demo gpu --backing gpu --json" ;;
        demo-hotswap) echo "$PYTHON -m hotswap demo hotswap --json" ;;
        demo-migration) echo "$PYTHON -m hotswap demo migration --json" ;;
        demo-elastic) echo "$PYTHON -m hotswap demo elastic --fail-slice 0 --json" ;;
        demo-elastic-jax) echo "$PYTHON -m hotswap demo elastic --framework jax --fail-slice 0 --json" ;;
        demo-migration-jax) echo "$PYTHON -m hotswap demo migration --framework jax --json" ;;
        demo-shrink) echo "$PYTHON -m hotswap demo shrink --json" ;;
        bench-checkpoint) echo "$PYTHON benchmarks/bench_checkpoint.py --device $device_torch --state-gb ${BENCH_GB:-2} --repeat 3 --json" ;;
        bench-jax) echo "$PYTHON benchmarks/bench_jax.py --device $device_jax --json --size 512 --repeat 3 --mttr-runs 1" ;;
        bench-mttr) echo "$PYTHON benchmarks/bench_mttr.py --json --runs 1 --repair-s -1 --import-runs 1" ;;
    esac
}

timeout_of() {
    case "$1" in
        gpu-tests) echo 210 ;;  # the GPT migration test trains three short runs
        demo-*|drill) echo 150 ;;
        nvml) echo 30 ;;
        bench-checkpoint) echo 110 ;;  # 2 GB, 8 measurements x (warm-up + 3): about 90 s on an H200
        bench-jax) echo 70 ;;
        bench-mttr) echo 85 ;;  # one failure per mode: cold ~10 s, zygote import ~4 s, cold with the zygote, warm
    esac
}

# start PART [LIMIT]: runs the part in the background; writes WORK/PART.{out,err,status}.
start() {
    local part="$1" limit="${2:-$(timeout_of "$1")}" cmd
    cmd="$(command_of "$part")"
    if [[ -z "$cmd" ]]; then
        echo "skipped no GPU" > "$WORK/$part.status"
        echo "-- $part: skipped: no GPU" >&2
        return
    fi
    if [[ "$GPU" != gpu && "$CPU_RUN" != 1 && "$part" != gpu-tests ]]; then
        echo "skipped no GPU (ON_CPU=1 runs it on the CPU)" > "$WORK/$part.status"
        echo "-- $part: skipped: no GPU" >&2
        return
    fi
    echo "-- $part: $cmd (timeout ${limit} s)" >&2
    mkdir -p "$WORK/home-$part"
    (
        began=$SECONDS
        HOTSWAP_HOME="$WORK/home-$part" timeout -k 10 "$limit" $cmd > "$WORK/$part.out" 2> "$WORK/$part.err" < /dev/null
        echo "$? $((SECONDS - began))" > "$WORK/$part.status"
        echo "-- $part: done after $((SECONDS - began)) s" >&2
    ) &
}

selected() { [[ " $PARTS " == *" $1 "* ]]; }

for part in $PHASE1; do selected "$part" && start "$part"; done
wait
for part in $PHASE2; do
    selected "$part" || continue
    left=$((TOTAL_S - (SECONDS - STARTED)))
    limit=$(timeout_of "$part")
    (( left < limit )) && limit=$left
    if (( limit < 15 )); then
        echo "skipped out of time (TOTAL_S=$TOTAL_S)" > "$WORK/$part.status"
        continue
    fi
    start "$part" "$limit"
    wait
done

ran=""
for part in $PHASE1 $PHASE2; do selected "$part" && ran="$ran $part"; done
{
    echo "hotswap GPU acceptance, $(date -u +%FT%TZ), $(hostname), gpu: $GPU, $((SECONDS - STARTED)) s wall"
    "$PYTHON" "$ROOT/benchmarks/acceptance_report.py" "$WORK" "$OUT" "$GPU" $ran
    failed=$?
    echo "== $failed part(s) failed; results in $OUT"
    exit "$failed"
} 2>&1 | tee "$OUT/summary.txt"
failed=${PIPESTATUS[0]}
rm -rf "$WORK"
exit "$failed"
