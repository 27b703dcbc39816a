#!/usr/bin/env bash
# The int8 x86 measurements (the five models against every engine, Table I on VNNI) for this
# host's class and, on an AMX host, for the VNNI-only class emulated on it, in one command.
# Run from the repository root after `make run` (the bench extras); results go to $OUT (default
# x86_out), one database per class to $STATE (default ~/.cache/unit-tvm).
#
#   scripts/x86_session.sh plan              print the steps `all` runs on this host, and stop
#   scripts/x86_session.sh tune CLASS [TRIALS]   tune the five models' kernels for CLASS (amx |
#                                            vnni; vnni on an AMX host restricts it with --isa)
#   scripts/x86_session.sh bench CLASS RUN   bench-model the five models with CLASS's database,
#                                            no tuning, every int8 engine (RUN names the output)
#   scripts/x86_session.sh ops               Table I convs on VNNI against PyTorch int8
#   scripts/x86_session.sh all [TRIALS]      for each class this host has: tune, then bench
#                                            twice back to back; then ops
#
# An AMX host measures both classes (AMX, and VNNI-only through --isa avx512_core_vnni, which
# also sets ONEDNN_MAX_CPU_ISA for the oneDNN-based engines); a VNNI-only host measures its own
# class only, because AMX cannot be emulated. On a 2-vCPU Zen 4 VM (2026-11-26): tune with 24
# trials ~3 min for resnet18, bench-model of the five models ~10 min per run.
set -uo pipefail
MODELS=${X86_MODELS:-"resnet18 resnet50 mobilenet_v2 inception_v3 bert_base"}
STATE=${UNIT_TVM_X86_STATE:-$HOME/.cache/unit-tvm}
OUT=${OUT:-x86_out}
CLI=${UNIT_TVM_CLI:-.venv/bin/unit-tvm}
mkdir -p "$STATE" "$OUT"
export UNIT_TVM_QUIET=1 PYTHONUNBUFFERED=1

has_amx() { grep -qw amx_int8 /proc/cpuinfo; }

classes() { if has_amx; then echo "amx vnni"; else echo "vnni"; fi; }

# the CLI's global options for a class: on an AMX host "vnni" is the emulated one
isa_args() {
    if [ "$1" = vnni ] && has_amx; then echo "--isa avx512_core_vnni"; fi
}

database() { echo "$STATE/x86_$1.jsonl"; }

check_class() {
    case " $(classes) " in
        *" $1 "*) ;;
        *) echo "class '$1' is not measurable on this host (it has: $(classes))" >&2; exit 2 ;;
    esac
}

tune() {
    local cls=$1 trials=${2:-24} model
    check_class "$cls"
    for model in $MODELS; do
        # shellcheck disable=SC2046 - isa_args is empty or two words
        $CLI $(isa_args "$cls") profile "$model" --tune --trials "$trials" \
            --database "$(database "$cls")" 2>&1 | tee "$OUT/profile_${cls}_$model.txt" \
            | grep "end to end"
    done
}

bench() {
    local cls=$1 run=$2
    check_class "$cls"
    # shellcheck disable=SC2046,SC2086 - isa_args and MODELS are lists of words
    $CLI $(isa_args "$cls") bench-model $MODELS --no-tune --database "$(database "$cls")" \
        --skip "TVM fp32" --skip "TVM int8" --out "$OUT/bench_${cls}_$run" 2>&1 \
        | tee "$OUT/bench_${cls}_$run.log" | tail -25
}

ops() {
    # shellcheck disable=SC2046 - isa_args is empty or two words
    $CLI $(isa_args vnni) bench-op --only conv --no-tvm --trials 16 \
        --database "$STATE/x86_table1.jsonl" --out "$OUT/table1" 2>&1 \
        | tee "$OUT/table1.log" | tail -25
}

plan() {
    local cls
    for cls in $(classes); do
        echo "tune $cls (${1:-24} trials): $MODELS -> $(database "$cls")"
        echo "bench $cls run1; bench $cls run2"
    done
    echo "ops: Table I on VNNI ($(isa_args vnni))"
}

all() {
    local cls
    plan "${1:-24}"
    for cls in $(classes); do
        tune "$cls" "${1:-24}"
        bench "$cls" run1
        bench "$cls" run2
    done
    ops
}

case "${1:-}" in
    plan) plan "${2:-24}" ;;
    tune) tune "${2:?class: amx or vnni}" "${3:-24}" ;;
    bench) bench "${2:?class: amx or vnni}" "${3:-run1}" ;;
    ops) ops ;;
    all) all "${2:-24}" ;;
    *) sed -n '2,20p' "$0"; exit 2 ;;
esac
