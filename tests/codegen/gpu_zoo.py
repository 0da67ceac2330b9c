"""Programs whose kernels the GPU path is checked on: every kernel family, every dtype."""

from __future__ import annotations

import numpy as np

import fusegrad as fg
import fusegrad.nn.functional as F

FLOATS = ["float32", "float64", "float16", "bfloat16"]
INTS = ["int8", "int16", "int32", "int64", "uint8"]


def tensor(shape, dtype="float32", seed=0, low=-4, high=4):
    rng = np.random.default_rng(seed)
    dt = getattr(fg, dtype)
    if dtype == "bool":
        return fg.tensor(rng.random(shape) < 0.5)
    if dtype in INTS:
        lo = 0 if dtype == "uint8" else low
        return fg.tensor(rng.integers(lo, high + 1, size=shape)).to(dt)
    return fg.tensor(rng.uniform(low, high, size=shape).astype(np.float32)).to(dt)


def _float_chain(a, b):
    return ((a * b + a).abs().sqrt() - (a - b).tanh() * 0.5, fg.maximum(a, b), a / (b.abs() + 1),
            (a > b), a.exp().log1p(), a // 0.7, a % 1.5)


def _int_chain(a, b):
    return (a * b + a - b, fg.maximum(a, b), fg.minimum(a, b), a // 3, a % 3, a.abs(), a == b,
            a.to(fg.float32) * 0.5)


ZOO = {}
for _dt in FLOATS:
    ZOO[f"elementwise_{_dt}"] = (_float_chain, [tensor((4, 1, 6), _dt, 1),
                                                tensor((5, 1), _dt, 2)])
for _dt in INTS:
    ZOO[f"elementwise_{_dt}"] = (_int_chain, [tensor((4, 1, 6), _dt, 1), tensor((5, 1), _dt, 2)])
ZOO["elementwise_bool"] = (lambda a, b: ((a & b) | ~a, a ^ b, a.to(fg.int32) + 1),
                           [tensor((3, 7), "bool", 1), tensor((7,), "bool", 2)])
for _src in ["float32", "float64", "float16", "bfloat16", "int32", "uint8"]:
    ZOO[f"casts_from_{_src}"] = (
        lambda a: tuple(a.to(getattr(fg, d)) for d in FLOATS + INTS + ["bool"]),
        [tensor((3, 11), _src, 3, -300, 300)])
ZOO["views_pad_concat"] = (
    lambda a, b: (F.pad(a.t() * 2, (1, 2, 0, 1)), fg.cat([a, b * 3], 0), a.reshape(4, 6) + 1,
                  a[:, ::2] - fg.arange(2)),
    [tensor((6, 4), "float32", 4), tensor((2, 4), "float32", 5)])
for _axes in [(0,), (1,), (2,), (0, 2), (0, 1, 2)]:
    ZOO[f"sum_axes_{''.join(map(str, _axes))}"] = (
        lambda a, axes=_axes: (a * 2).sum(axes), [tensor((5, 6, 7), "float32", 6)])
ZOO["max_min_axis1"] = (lambda a: (a.amax(1), a.amin(1)), [tensor((5, 40, 3), "float32", 7)])
ZOO["sum_int32_last"] = (lambda a: a.sum(-1), [tensor((6, 50), "int32", 8)])
ZOO["sum_float16_last"] = (lambda a: a.sum(-1), [tensor((6, 300), "float16", 9)])
ZOO["softmax"] = (lambda a: F.softmax(a, -1), [tensor((9, 300), "float32", 10)])
ZOO["log_softmax"] = (lambda a: F.log_softmax(a, -1), [tensor((9, 33), "float32", 11)])
ZOO["layer_norm"] = (lambda a, w, b: F.layer_norm(a, (96,), w, b),
                     [tensor((7, 96), "float32", 12), tensor((96,), "float32", 13),
                      tensor((96,), "float32", 14)])
ZOO["cross_entropy"] = (lambda a, t: F.cross_entropy(a, t),
                        [tensor((8, 10), "float32", 15),
                         fg.tensor(np.arange(8) % 10)])
ZOO["matmul_epilogue"] = (lambda x, w, b, r: (x @ w + b).relu() + r,
                          [tensor((20, 35), "float32", 16), tensor((35, 18), "float32", 17),
                           tensor((18,), "float32", 18), tensor((20, 18), "float32", 19)])
ZOO["matmul_batched_transposed"] = (lambda x, w: x @ w.mT,
                                    [tensor((3, 17, 9), "float32", 20),
                                     tensor((1, 12, 9), "float32", 21)])
ZOO["matmul_float16"] = (lambda x, w: (x @ w).tanh(),
                         [tensor((9, 40), "float16", 22, -1, 1), tensor((40, 7), "float16", 23,
                                                                        -1, 1)])


def mlp_loss(x, w1, b1, w2, b2, target):
    h = F.gelu(x @ w1 + b1)
    return F.cross_entropy(h @ w2 + b2, target)


def mlp_args():
    return [tensor((16, 24), "float32", 30, -1, 1), tensor((24, 32), "float32", 31, -0.3, 0.3),
            tensor((32,), "float32", 32, -0.1, 0.1), tensor((32, 10), "float32", 33, -0.3, 0.3),
            tensor((10,), "float32", 34, -0.1, 0.1), fg.tensor(np.arange(16) % 10)]

_SPECIALS = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 1e10, -1e10, 0.5, 2.5, -2.5, 65504,
                      70000, 3e38, 1e-8, -1e-45], dtype=np.float32)
ZOO["casts_specials"] = (lambda a: tuple(a.to(getattr(fg, d)) for d in FLOATS + INTS + ["bool"]),
                         [fg.tensor(_SPECIALS)])
ZOO["float_special_values"] = (
    lambda a: (a.floor(), a.round(), a.sign(), a // 2, a % 2, fg.maximum(a, -a), a.amax(),
               a.to(fg.float16).to(fg.float32), a.pow(3), a.abs().pow(0.5), a.exp2()),
    [fg.tensor(_SPECIALS)])
ZOO["row_any_all_bool"] = (lambda a: ((a > 0).any(-1), (a > 0).all(-1)),
                           [tensor((5, 70), "float32", 40)])
ZOO["softmax_float64"] = (lambda a: F.softmax(a, -1), [tensor((4, 100), "float64", 41)])
ZOO["amax_int8_last"] = (lambda a: (a.amax(-1), a.amin(-1), a.sum(-1)),
                         [tensor((6, 45), "int8", 42, -100, 100)])
ZOO["layer_norm_bfloat16"] = (lambda a: F.layer_norm(a, (64,)), [tensor((3, 64), "bfloat16", 43)])
ZOO["int_pow"] = (lambda a, b, c: (a ** 9, a ** 2, b ** c),
                  [tensor((4, 6), "int64", 44, -5, 5), tensor((4, 6), "uint8", 45, 0, 7),
                   tensor((4, 6), "uint8", 46, 0, 5)])
# Elementwise kernels large enough for 4 elements a thread (16-byte loads and stores of the
# unit-stride 4-byte buffers; broadcast and transposed operands read per element).
ZOO["elementwise_vec4"] = (lambda a, b, c, t: ((a * b + c).relu() - t[:, ::2], a.exp()),
                           [tensor((64, 128), "float32", 47), tensor((128,), "float32", 48),
                            tensor((64, 1), "float32", 49), tensor((64, 256), "float32", 50)])
ZOO["transpose_tiles"] = (lambda a, t: ((a * 2).relu() - t.t(), t.t().exp()),
                          [tensor((64, 128), "float32", 53), tensor((128, 64), "float32", 54)])
ZOO["elementwise_vec4_mixed"] = (lambda i, h: (i * 3 + 1, h * 2, (i > 0) & (h > 0)),
                                 [tensor((32, 256), "int32", 51), tensor((32, 256), "float16", 52)])
