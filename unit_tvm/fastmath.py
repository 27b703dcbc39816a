"""Vectorizable float32 exp and erf as TIR expressions, and a rewrite that puts them in place of
TVM's calls.

On the llvm target TVM lowers tirx.exp / tirx.erf to the C library's expf / erff: one scalar call
per element, so a vectorized loop is taken apart lane by lane. In BERT that made the fused GELU of
the FFN's first dense cost 9x its int8 GEMM, and softmax as much as all the attention matmuls.
These versions use only arithmetic and bit reinterpretation, which LLVM vectorizes.

Accuracy in float32 (tests/test_cpu_default.py): exp within 1e-6 relative on [-87, 88],
saturating at exp(88) above and 0 below (never a subnormal); erf within 1e-6 absolute
everywhere (measured: exp 2e-7, erf 3.2e-7).
"""

import math

import tvm
import tvm_ffi
from tvm import tirx

_F32 = "float32"


def _c(v):
    return tirx.const(v, _F32)


def _let(name, value, body_fn):
    """body_fn(v) with v bound to value once (a shared subexpression, not a copied tree)."""
    v = tirx.Var(name, _F32)
    return tirx.Let(v, value, body_fn(v))


def _clamp(x, lo, hi):
    return tirx.max(tirx.min(x, _c(hi)), _c(lo))


def _horner(coefs, t):
    """coefs[0] + coefs[1] * t + ... in Horner form."""
    p = _c(coefs[-1])
    for coef in reversed(coefs[:-1]):
        p = p * t + _c(coef)
    return p


# e^r on [-ln2 / 2, ln2 / 2] to degree 5: a fit of our own (least squares reweighted toward
# minimax relative error, float64: 7.5e-8; evaluated in float32: 2.1e-7). The degree-7 Taylor
# series it replaces cost two more FMAs per vector in every SiLU and softmax.
_EXP_POLY = (1.0000000716979915, 0.9999996917624565, 0.49998894399908844, 0.16667575230497453,
             0.04191543313591732, 0.008297639463133877)
# 1.5 * 2^23: a float32 of magnitude below 2^22 plus this is rounded to an integer (to nearest,
# the FPU's mode), which the sum's low mantissa bits hold as two's complement
_ROUND = 12582912.0


# e^r to degree 3, the same kind of fit (float64: 7.5e-5 relative): for results rounded to bf16
# (8 significant bits: half a unit in the last place is 2e-3 relative)
_EXP_POLY_BF16 = (0.9999280507098912, 1.0001639212009015, 0.5049637065741578,
                  0.16567156613895037)


def _exp_clamped(xc, poly=_EXP_POLY):
    """e^xc for xc in [-87, 88]: 2^n * e^r with n = round(xc / ln2), |r| <= ln2 / 2. n comes
    from adding _ROUND (one FMA, no floor or float -> int conversion), 2^n from the sum's bits:
    its low bits are n, so the low byte of bits + 127, shifted by 23, is 2^n's exponent field
    (n + 127 in [1, 254])."""
    def scaled(t):
        n = t - _c(_ROUND)
        # ln2 split in two so that n * ln2_hi is exact (Cody-Waite reduction)
        r = xc - n * _c(0.693145751953125) - n * _c(1.4286068203094172e-06)
        # masked to the exponent field before the shift: no bit is shifted out of an int32,
        # which LLVM may treat as poison
        two_n = tirx.reinterpret(_F32, ((tirx.reinterpret("int32", t) + 127) & 255) << 23)
        return _let("r", r, lambda rv: _horner(poly, rv)) * two_n

    return _let("t", xc * _c(1.0 / math.log(2.0)) + _c(_ROUND), scaled)


def exp(x):
    """exp(x) for a float32 PrimExpr: exp(88) above 88 and exactly 0 below -87. The C library
    returns subnormals down to -103, and so did a clamp at -87 once divided (a masked softmax
    row: e^-87 / sum): x86 cores take a slow path on every subnormal operand, and a value below
    1.7e-38 is 0 to any int8 consumer."""
    return _let("xe", x, lambda xe: tirx.Select(
        xe < _c(-87.0), _c(0.0), _let("xc", _clamp(xe, -87.0, 88.0), _exp_clamped)))


# erf(x) = x * P(x^2) / Q(x^2) on [-4, 4], clamped outside (1 - erf(4) = 1.5e-8): a rational
# fit of our own (linearised least squares, reweighted toward minimax, in float64: 7e-8).
# Against Abramowitz & Stegun 7.1.26 (1 - t * poly(t) * exp(-x^2)) it needs no exp: 15 vector
# operations instead of ~30, one division either way, which matters in BERT's FFN, where GELU
# runs in the epilogue of an int8 dense with a 768-long reduction.
_ERF_P = (1.1283785641412016, 0.22045816775012603, 0.05331541102560945, 0.004571196819071344,
          0.0001622045051087252, -2.0137895138876034e-06, 1.9033525350732234e-08)
_ERF_Q = (1.0, 0.5287022609165921, 0.12350971796834473, 0.016116291542334783,
          0.0011653756649172905)
_ERF_CLAMP = 4.0


def exp_nonpositive_bf16(x):
    """exp(x) for a float32 PrimExpr x <= 0 (a softmax's shifted scores) whose result is then
    rounded to bf16: the degree-3 polynomial, exactly 0 below -87 (and at -inf); x > 0 is not
    handled (no upper clamp)."""
    return _let("xe", x, lambda xe: tirx.Select(
        xe < _c(-87.0), _c(0.0), _exp_clamped(xe, _EXP_POLY_BF16)))


def rounded_to_uint8(t):
    """float32 t rounded to nearest (ties to even, the FPU's mode) and clipped to [0, 255], as
    uint8: a max at 0, llvm.lrint (one convert: vcvtps2dq, frintx + fcvtzs) and an unsigned min
    at 255 that LLVM folds into the narrowing store (vpmovusdb). Above 2^31 lrint gives INT_MIN
    (x86) or saturates (ARM), which the unsigned min maps to 255; NaN becomes 0."""
    t = tirx.max(t, tirx.const(0.0, "float32"))
    rounded = tirx.call_llvm_pure_intrin("int32", "llvm.lrint", t).astype("uint32")
    return tirx.min(rounded, tirx.const(255, "uint32")).astype("uint8")


def erf(x):
    """erf(x) for a float32 PrimExpr (odd, rational on the clamped argument)."""
    return _let("xe", _clamp(x, -_ERF_CLAMP, _ERF_CLAMP), lambda xe: _let(
        "t", xe * xe, lambda t: xe * _horner(_ERF_P, t) / _horner(_ERF_Q, t)))


def sigmoid(x):
    """1 / (1 + exp(-x)) for a float32 PrimExpr, through the exp above: 1 at the top (exp's
    clamp), exactly 0 below -87, within 2e-7 absolute elsewhere. SiLU (x * sigmoid(x),
    EfficientNet's and YOLO's activation) and squeeze-excitation gates call it once per
    element. Below -87 the quotient would be a subnormal (1 / (1 + e^88) = 6e-39), and every
    product of one (a gated activation) another: x86 cores take a slow path on subnormal
    operands (a conv reading such a gated input: 88 -> 237 us on Zen 5)."""
    # e^-x needs no select of its own: below -87 this one answers, and above 87 the clamp's
    # e^-87 leaves 1 + e^-87 == 1
    return _let("xs", x, lambda xs: tirx.Select(
        xs < _c(-87.0), _c(0.0), _c(1.0) / (_c(1.0) + _let(
            "xc", _clamp(-xs, -87.0, 88.0), _exp_clamped))))


def tanh(x):
    """tanh(x) = 2 sigmoid(2x) - 1 for a float32 PrimExpr: within 3e-7 absolute, exactly -1 and
    1 at the ends (GELU's tanh form: GPT-2, ALBERT)."""
    return _c(2.0) * sigmoid(x * _c(2.0)) - _c(1.0)


def _small_power(base, exponent):
    """base ** exponent for a constant exponent 1, 2, 3 or 4 as products (GELU's tanh form
    cubes its input), 0.5 as a square root; None for any other exponent."""
    value = exponent.value
    if value == 0.5:
        return tirx.sqrt(base)
    if value not in (1.0, 2.0, 3.0, 4.0):
        return None

    def product(b):
        out = b
        for _ in range(int(value) - 1):
            out = out * b
        return out

    return _let("pb", base, product)


_REPLACE = {"tirx.exp": exp, "tirx.erf": erf, "tirx.sigmoid": sigmoid, "tirx.tanh": tanh}


def vectorizable(func):
    """func with every float32 tirx.exp / erf / sigmoid / tanh call replaced by the
    expressions above, and float32 tirx.pow by a constant 1, 2, 3, 4 or 0.5 with products or
    a square root: LLVM vectorizes those where it calls expf, tanhf or powf once per lane."""

    def on_call(call, m):
        name = getattr(call.op, "name", None)
        if str(call.ty) != _F32:
            return m.default_mutate(call)
        if name == "tirx.pow" and isinstance(call.args[1], tirx.FloatImm):
            power = _small_power(m.mutate(call.args[0]), call.args[1])
            return m.default_mutate(call) if power is None else power
        fn = _REPLACE.get(name)
        if fn is None:
            return m.default_mutate(call)
        return fn(m.mutate(call.args[0]))

    return tvm_ffi.structural_mutate(func, [(tvm.ir.expr.Call, on_call)])
