#!/usr/bin/env bash
# Everything the GPU part needs, on a lent GPU machine (Python 3.12 with PyTorch, nvcc, no
# registry), in few calls. Run from the repository root there; results go to $OUT (or ./gpu_out).
#
#   scripts/gpu_session.sh stage            copy .gpu/a (first half of TVM) to the machine
#   scripts/gpu_session.sh setup            add .gpu/b, install TVM, check the GPU
#   scripts/gpu_session.sh test             pytest of the tests that need a GPU (JUnit XML +
#                                           log; GPU_ALL_TESTS=1: the compile-only ones too)
#   scripts/gpu_session.sh bench DTYPE [TRIALS]   bench-gpu Table I (float16 | int8)
#   scripts/gpu_session.sh models [ARGS]    bench-model --target cuda on the four zoo models
#                                           (GPU_MODELS="resnet18 bert_base" for fewer per call)
#   scripts/gpu_session.sh ablation [TRIALS] [--quick]  reproduce fig11-gpu (the GPU ablation,
#                                           Table I, fp16; --quick: its first four layers)
#   scripts/gpu_session.sh profile MODEL [ARGS]  time each kernel of unit-tvm's build of MODEL
#   scripts/gpu_session.sh configs [SAMPLE]  ResNet-18's convs, BERT's matmuls and Table I
#                                           under the named
#                                           configs of unit_tvm.bench.gpu_configs and SAMPLE
#                                           (default 40) more per layer from the tuning space:
#                                           the default rule's evidence (GPU_STUDY_LAYERS)
#   scripts/gpu_session.sh all [SECONDS]    one lease's plan in one call of SECONDS (default
#                                           540): setup, configs, test, models resnet18
#                                           bert_base, ablation (4 layers), bench float16, each
#                                           cut to the time left (GPU_SAMPLE, GPU_MODELS,
#                                           GPU_ROUNDS, GPU_TRIALS, GPU_NO_ABLATION=1,
#                                           GPU_NO_CONFIGS=1 change them; GPU_TUNE_TRIALS=N
#                                           adds GPU_TUNED_MODELS, default resnet18, tuned
#                                           with N trials per layer, under tuned/); everything under
#                                           $OUT packed into $OUT/gpu_all.tgz (a call returns
#                                           at most 8 files)
#
# .gpu/a and .gpu/b come from scripts/gpu_pack.sh on a machine with PyPI: TVM's wheel is larger
# than one transfer, so its compiler library travels in two halves (stage, then setup, while the
# machine is still held). Tuning records go to $STATE/gpu_db.jsonl and are copied to $OUT.
#
# Seen on an H100 (2026-11-23): machine start ~30 s, stage <1 s, setup ~40 s, test ~4 min,
# bench float16 with 16 trials ~25 s per layer, bench-model --no-tune ~1.5-2.5 min per model
# with two TVM builds on the device's CPU (unit-tvm int8 is a third since: split the models over
# two calls with GPU_MODELS). A call lasts at most 10 minutes and the machine goes
# back 30 s after a call: stage, then immediately setup + test, then one bench per call.
# Seen on an H200 (2026-11-26), 15 minutes of device time in all: start ~30 s, setup 12 s,
# test 75 s (pytest-xdist, 8 workers: used when the machine has it), `reproduce fig11-gpu
# --quick --trials 4` 46 s, models resnet18 104 s, profile resnet18 26 s, bench float16 with 8
# trials ~15 s per layer. Later that day, on an H200: test 155 s (248 items), models resnet18 and
# resnet50 about 5 minutes together, bench float16 with 4 trials 220 s for all 16 layers. With
# .gpu/ in .git/info/exclude, name .gpu/a in the stage call's `carry` and .gpu/b in the next
# call's (each call then sends only its half), and put all the steps of one lease in that
# second command.
set -uo pipefail
STATE=${UNIT_TVM_GPU_STATE:-/root/unit_tvm_gpu}
OUT=${OUT:-gpu_out}
PY=${PYTHON:-python3}
mkdir -p "$STATE" "$OUT"
export UNIT_TVM_DATABASE=$STATE/gpu_db.jsonl PYTHONUNBUFFERED=1

link_extensions() {
    # the two extension points install as unit_tvm.intrinsics / unit_tvm.schedules (setup.py);
    # a later call's copy of the working tree drops these links, so every step makes them
    ln -sfn ../intrinsics unit_tvm/intrinsics
    ln -sfn ../schedules unit_tvm/schedules
}

stage() { cp .gpu/a/* "$STATE/" && ls -la "$STATE"; }

setup() {
    set -e
    cp .gpu/b/* "$STATE/"
    local site
    site=$($PY -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    $PY -m pip install -q --no-index --no-deps "$STATE"/apache_tvm_ffi-*.whl \
        "$STATE"/xgboost_cpu-*.whl
    tar -xJf "$STATE/tvm_rest.tar.xz" -C "$site"
    cat "$STATE"/compiler.xz.* | xz -d -T0 > "$site/tvm/lib/libtvm_compiler.so"
    set +e
    nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv
    # the host CPU too: an AMX one could measure issue 16's AMX class (pinned to 2 cores)
    grep -m1 "model name" /proc/cpuinfo
    echo "cpu flags: $(grep -o -w -E 'amx_int8|amx_bf16|avx512_vnni' /proc/cpuinfo | sort -u \
        | tr '\n' ' ')"
    $PY -c 'import tvm, unit_tvm; d = tvm.cuda(0); print("tvm", tvm.__version__, "gpu",
d.exist, d.device_name, d.compute_version, "SMs", d.multi_processor_count)'
}

run_tests() {
    # the tests that need the GPU (-m gpu; the compile-only ones run in CI), or every GPU test
    # with GPU_ALL_TESTS=1
    local workers=() select=(-m gpu)
    $PY -c "import xdist" 2>/dev/null && workers=(-n "$(( $(nproc) > 12 ? 12 : 8 ))")
    [[ -z ${GPU_ALL_TESTS:-} ]] || select=()
    $PY -m pytest -q -p no:cacheprovider ${workers[@]+"${workers[@]}"} \
        ${select[@]+"${select[@]}"} tests/test_gpu.py tests/test_gpu_model.py \
        tests/test_cli.py -k "gpu" \
        --junitxml "$OUT/gpu_tests.xml" 2>&1 | tee "$OUT/gpu_tests.log" | tail -40
}

bench() {
    local dtype=$1 trials=${2:-24}
    $PY -m unit_tvm.cli bench-gpu --dtype "$dtype" --trials "$trials" --out "$OUT" 2>&1 \
        | tee "$OUT/bench_gpu_$dtype.log" | grep -v "it/s\]" | tail -30
    cp "$UNIT_TVM_DATABASE" "$OUT/gpu_db.jsonl" 2>/dev/null || true
}

ablation() {
    # the configs are tuned from the database bench float16 filled, when it ran first; more
    # arguments go to `reproduce` (--quick: Table I's first four layers)
    $PY -m unit_tvm.cli reproduce fig11-gpu --trials "${1:-16}" "${@:2}" --out "$OUT" 2>&1 \
        | tee "$OUT/fig11_gpu.log" | grep -v "it/s\]" | tail -20
}

models() {
    # shellcheck disable=SC2086 # the model names split on spaces
    $PY -m unit_tvm.cli bench-model ${GPU_MODELS:-resnet18 resnet50 mobilenet_v2 bert_base} \
        --target cuda --out "$OUT" "$@" 2>&1 | tee "$OUT/bench_model_gpu.log" | grep -v "it/s\]" | tail -40
    cp "$UNIT_TVM_DATABASE" "$OUT/gpu_db.jsonl" 2>/dev/null || true
}

configs() {
    # ResNet-18's convs and BERT's matmuls (what the models run), then Table I
    # (GPU_STUDY_LAYERS to choose)
    local layers
    for layers in ${GPU_STUDY_LAYERS:-resnet18 bert table1}; do
        $PY -m unit_tvm.bench.gpu_configs --layers "$layers" --sample "${1:-40}" --out "$OUT" \
            2>&1 | tee "$OUT/gpu_configs_$layers.log" | tail -25
    done
}

profile() {
    $PY -m unit_tvm.bench.gpu_profile "$@" --out "$OUT" 2>&1 | tee -a "$OUT/gpu_profile.log" \
        | grep -v "it/s\]" | tail -30
}

within() {
    # within DEADLINE STEP...: run the step with the seconds left before DEADLINE (epoch s),
    # keeping 20 s for packing; skipped when under 30 s are left
    local deadline=$1 left
    shift
    left=$(( deadline - $(date +%s) - 20 ))
    if (( left < 30 )); then echo "== skipped (time): $*"; return 0; fi
    echo "== $* (at most ${left}s)"
    timeout "$left" "$@"
}

all() {
    # sized for 15 minutes of device time: one call after `stage`, in the order that the
    # issue's targets need (tests, then models, then kernels)
    local deadline=$(( $(date +%s) + ${1:-540} ))
    setup > "$OUT/setup.log" 2>&1 || { tail -20 "$OUT/setup.log"; return 1; }
    tail -3 "$OUT/setup.log"
    [[ -n ${GPU_NO_CONFIGS:-} ]] || within "$deadline" "$0" configs "${GPU_SAMPLE:-24}"
    within "$deadline" "$0" test
    GPU_MODELS=${GPU_MODELS:-resnet18 bert_base} within "$deadline" "$0" models --no-tune \
        --rounds "${GPU_ROUNDS:-10}"
    # tuned: each conv and dense layer searched (the default and its neighbours first)
    [[ -z ${GPU_TUNE_TRIALS:-} ]] || OUT="$OUT/tuned" GPU_MODELS=${GPU_TUNED_MODELS:-resnet18} \
        within "$deadline" "$0" models --trials "$GPU_TUNE_TRIALS" --rounds "${GPU_ROUNDS:-10}"
    [[ -n ${GPU_NO_ABLATION:-} ]] || within "$deadline" "$0" ablation 4 --quick
    within "$deadline" "$0" bench float16 "${GPU_TRIALS:-8}"
    (cd "$OUT" && tar czf /tmp/gpu_all.tgz --exclude=gpu_all.tgz . \
        && find . -mindepth 1 -delete && mv /tmp/gpu_all.tgz .)
    ls -la "$OUT"
}

[[ ${1:-all} == stage ]] || link_extensions
case "${1:-all}" in
    stage) stage ;;
    setup) setup ;;
    test) run_tests ;;
    bench) bench "${2:-float16}" "${3:-24}" ;;
    models) shift; models "$@" ;;
    ablation) shift; ablation "${1:-16}" "${@:2}" ;;
    profile) shift; profile "$@" ;;
    configs) configs "${2:-40}" ;;
    all) all "${2:-540}" ;;
    *) echo "usage: $0 stage|setup|test|bench DTYPE [TRIALS]|ablation [TRIALS]|profile MODEL|configs [SAMPLE]|models [ARGS]|all [SECONDS]" >&2
       exit 2 ;;
esac
