#!/usr/bin/env bash
# Pack the pinned TVM stack for a GPU machine that has Python 3.12 (with PyTorch, numpy, tqdm)
# but no package registry, in two halves that each fit a 64 MiB transfer.
#
#   scripts/gpu_pack.sh [DIR]     (default .gpu; run here, where PyPI is reachable)
#
# DIR/a holds the first part of libtvm_compiler.so (xz), DIR/b the rest of it, the TVM Python
# package without that library, and the apache-tvm-ffi and xgboost-cpu wheels for CPython 3.12.
# scripts/gpu_session.sh stages DIR/a on the GPU machine, then assembles everything from DIR/b.
set -euo pipefail
DIR=$(realpath -m "${1:-.gpu}")
TVM=apache-tvm==0.27.0.post1
FFI=apache-tvm-ffi==0.1.14.post1
XGB=xgboost-cpu==3.2.0
PY=${PYTHON:-python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
rm -rf "$DIR" && mkdir -p "$DIR/a" "$DIR/b"
$PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$work/whl" "$TVM" "$FFI" "$XGB"
cp "$work"/whl/apache_tvm_ffi-*.whl "$work"/whl/xgboost_cpu-*.whl "$DIR/b/"
mkdir "$work/tvm" && (cd "$work/tvm" && unzip -q "$work"/whl/apache_tvm-*.whl)
# the compiler library is most of the wheel; xz -9e brings 250 MB to about 60 MB
xz -9e -T0 -c "$work/tvm/tvm/lib/libtvm_compiler.so" > "$work/compiler.xz"
split -b 34M -d "$work/compiler.xz" "$work/compiler.xz."
mv "$work/compiler.xz.00" "$DIR/a/" && mv "$work"/compiler.xz.0[1-9] "$DIR/b/"
(cd "$work/tvm" && tar --exclude=tvm/lib/libtvm_compiler.so --exclude=tvm/3rdparty \
    -cJf "$DIR/b/tvm_rest.tar.xz" tvm apache_tvm-*.dist-info)
du -sh "$DIR/a" "$DIR/b"
