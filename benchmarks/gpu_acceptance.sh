#!/usr/bin/env bash
# GPU acceptance of issue 11, in one command, on a machine with an NVIDIA GPU (an H100):
#
#     OUT=/path/to/results benchmarks/gpu_acceptance.sh            # every part
#     OUT=... PARTS="nvml drill" benchmarks/gpu_acceptance.sh      # some parts
#
# Parts (each writes one file under $OUT; summary.txt and environment.txt come with every run,
# so a run writes at most 8 files):
#   nvml        nvml_health.json     every GPU and its NVML health reading (the probe's --once)
#   gpu-tests   pytest_gpu.txt       python -m pytest -m gpu (the real-GPU tests)
#   demo        demo.json            hotswap demo hotswap|elastic|migration|shrink --json, GPUs visible
#   drill       gpu_drill.json       hotswap demo gpu --backing gpu --json (>= 1 GB on the GPU)
#   bench       bench_checkpoint.json  python benchmarks/bench_checkpoint.py --device cuda --state-gb 4 --json
#   full-suite  pytest_full.txt      python -m pytest -q, with the GPU visible
#
# Runs from the repository's source tree (PYTHONPATH=src), so nothing needs installing when
# torch (CUDA), nvidia-ml-py, pydantic, typer, rich, PyYAML, platformdirs, matplotlib, pytest and
# hypothesis import; with WHEELHOUSE=<dir of wheels> the missing ones are installed from it
# (pip install --no-index --find-links "$WHEELHOUSE"). The exit code is the number of parts
# that failed.
set -u

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${OUT:?set OUT to the directory for the results}"
PARTS="${PARTS:-nvml gpu-tests demo drill bench full-suite}"
PYTHON="${PYTHON:-python3}"
mkdir -p "$OUT"
export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"
export HOTSWAP_SHARED_CRDS="${HOTSWAP_SHARED_CRDS:-$ROOT/../shared/crds}"
export HOTSWAP_HOME="$(mktemp -d)"  # clusters of this run only
cd "$ROOT"

SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
failed=0

note() { echo "$*" | tee -a "$SUMMARY" >&2; }

# run NAME FILE COMMAND...: the command's stdout to FILE (stderr too for text files), timed.
run() {
    local name="$1" file="$2"
    shift 2
    note "== $name: $*"
    local started=$SECONDS code
    if [[ "$file" == *.json ]]; then
        "$@" > "$OUT/$file" 2>> "$OUT/$name.stderr.tmp"
    else
        "$@" > "$OUT/$file" 2>&1
    fi
    code=$?
    note "   exit $code after $((SECONDS - started)) s -> $file"
    if [[ -f "$OUT/$name.stderr.tmp" ]]; then
        tail -n 20 "$OUT/$name.stderr.tmp" | sed 's/^/   | /' >> "$SUMMARY"
        rm -f "$OUT/$name.stderr.tmp"
    fi
    [[ $code -eq 0 ]] || failed=$((failed + 1))
}

{
    echo "date: $(date -u +%FT%TZ)"
    echo "host: $(hostname)"
    nvidia-smi -L 2>&1 || echo "nvidia-smi: not found"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 || true
    "$PYTHON" - <<'EOF'
import importlib, platform
print("python", platform.python_version())
for name in ("torch", "jax", "pynvml", "pydantic", "typer", "rich", "yaml", "platformdirs", "matplotlib", "pytest", "hypothesis"):
    try:
        module = importlib.import_module(name)
        print(name, getattr(module, "__version__", "?"))
    except Exception as error:
        print(name, "MISSING", type(error).__name__)
try:
    import torch
    print("cuda", torch.cuda.is_available(), torch.version.cuda, [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])
except Exception as error:
    print("cuda ?", error)
EOF
    df -h "$HOTSWAP_HOME" | tail -1
} > "$OUT/environment.txt" 2>&1

missing=$("$PYTHON" -c '
import importlib.util
names = {"pydantic": "pydantic", "typer": "typer", "rich": "rich", "yaml": "PyYAML", "platformdirs": "platformdirs",
         "matplotlib": "matplotlib", "pytest": "pytest", "hypothesis": "hypothesis", "pynvml": "nvidia-ml-py",
         "jsonschema": "jsonschema", "kubernetes": "kubernetes", "kubernetes_validate": "kubernetes-validate",
         "importlinter": "import-linter"}
print(" ".join(p for m, p in names.items() if importlib.util.find_spec(m) is None))')
if [[ -n "$missing" ]]; then
    if [[ -n "${WHEELHOUSE:-}" ]]; then
        run install install.log "$PYTHON" -m pip install --no-index --find-links "$WHEELHOUSE" $missing
        rm -f "$OUT/install.log"
    else
        note "missing packages: $missing (set WHEELHOUSE to a directory of wheels to install them)"
    fi
fi

for part in $PARTS; do
    case "$part" in
        nvml) run nvml nvml_health.json "$PYTHON" -m hotswap.backends.local.gpu_probe --once ;;
        gpu-tests) run gpu-tests pytest_gpu.txt "$PYTHON" -m pytest -q -m gpu -p no:cacheprovider ;;
        demo)
            # The four drills with the GPU visible (auto: GPU-backed slices when enough are free).
            for scenario in hotswap elastic migration shrink; do
                run "demo-$scenario" "demo-$scenario.json" "$PYTHON" -m hotswap demo "$scenario" --json
            done
            "$PYTHON" - "$OUT" <<'EOF'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
merged = {}
for scenario in ("hotswap", "elastic", "migration", "shrink"):
    path = out / f"demo-{scenario}.json"
    try:
        merged[scenario] = json.loads(path.read_text())
    except (FileNotFoundError, ValueError) as error:
        merged[scenario] = {"error": str(error)}
    path.unlink(missing_ok=True)
(out / "demo.json").write_text(json.dumps(merged, indent=2))
EOF
            ;;
        drill) run drill gpu_drill.json "$PYTHON" -m hotswap demo gpu --backing gpu --json ;;
        bench) run bench bench_checkpoint.json "$PYTHON" benchmarks/bench_checkpoint.py --device cuda --state-gb 4 --json ;;
        full-suite) run full-suite pytest_full.txt "$PYTHON" -m pytest -q -p no:cacheprovider ;;
        *) note "unknown part $part"; failed=$((failed + 1)) ;;
    esac
done

note "== $failed part(s) failed"
rm -rf "$HOTSWAP_HOME"
exit "$failed"
