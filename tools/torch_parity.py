"""Which functions torch has both as ``torch.f`` and as ``Tensor.f``, and where fusegrad has them.

torch's names come from ``fusegrad/_torch_names.py`` (written by tools/gen_torch_names.py), so
this runs without torch. Names outside fusegrad's scope are left out (see :data:`OUT_OF_SCOPE`):
dtype and device names, quantization, sparse ops, storages, named tensors, short-time
Fourier transforms. In-place ``f_`` variants are methods only in torch's usage and are counted apart.

    python tools/torch_parity.py            # counts, then the names in one place and missing
    python tools/torch_parity.py --counts   # counts only
"""

from __future__ import annotations

import argparse
import sys
import textwrap

# Names torch has in both places that fusegrad does not aim at, with the reason.
OUT_OF_SCOPE: dict[str, str] = {
    **dict.fromkeys("bfloat16 bool cdouble cfloat chalf double float half int long short".split(),
                    "a dtype in torch, a cast method on Tensor"),
    **dict.fromkeys("cpu cuda xpu mtia device dtype layout get_device".split(),
                    "a device module or an attribute, not a function"),
    **dict.fromkeys("dequantize int_repr q_per_channel_axis q_per_channel_scales "
                    "q_per_channel_zero_points q_scale q_zero_point qscheme".split(), "quantization"),
    **dict.fromkeys("smm sspaddmm".split(), "sparse"),
    **dict.fromkeys("storage as_strided as_strided_scatter".split(), "storage and strides"),
    **dict.fromkeys("stft istft".split(), "short-time Fourier transforms"),
    **dict.fromkeys("hash_tensor is_distributed nonzero_static slice_inverse".split(),
                    "internal or distributed"),
}


def shared_names() -> list[str]:
    """Sorted names torch has both at top level and as Tensor methods, within scope."""
    from fusegrad._torch_names import TORCH_NAMES
    both = TORCH_NAMES["torch"] & TORCH_NAMES["torch.Tensor"]
    return sorted(n for n in both if not n.startswith("_") and not n.endswith("_")
                  and n not in OUT_OF_SCOPE)


def classify() -> dict[str, list[str]]:
    """The shared names by where fusegrad has them: 'both', 'torch only', 'Tensor only',
    'missing'."""
    from fusegrad.testing.supported_api import fusegrad_names
    top, methods = fusegrad_names("torch"), fusegrad_names("torch.Tensor")
    groups: dict[str, list[str]] = {"both": [], "torch only": [], "Tensor only": [], "missing": []}
    for name in shared_names():
        key = {(True, True): "both", (True, False): "torch only", (False, True): "Tensor only",
               (False, False): "missing"}[(name in top, name in methods)]
        groups[key].append(name)
    return groups


def inplace_gaps() -> list[str]:
    """torch ``Tensor.f_`` methods for shared names ``f`` that fusegrad's Tensor lacks."""
    from fusegrad._torch_names import TORCH_NAMES
    from fusegrad.testing.supported_api import fusegrad_names
    methods = fusegrad_names("torch.Tensor")
    return sorted(n + "_" for n in shared_names()
                  if n + "_" in TORCH_NAMES["torch.Tensor"] and n + "_" not in methods)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", action="store_true", help="print the counts only")
    args = parser.parse_args(argv)
    groups = classify()
    total = sum(len(v) for v in groups.values())
    one_place = len(groups["torch only"]) + len(groups["Tensor only"])
    print(f"{total} names: {len(groups['both'])} in both, {one_place} in one place "
          f"({len(groups['torch only'])} torch only, {len(groups['Tensor only'])} Tensor only), "
          f"{len(groups['missing'])} missing; {len(inplace_gaps())} in-place methods missing")
    if args.counts:
        return
    for key in ("torch only", "Tensor only", "missing"):
        print(f"\n{key} ({len(groups[key])}):")
        print(textwrap.fill(" ".join(groups[key]), 100, initial_indent="  ",
                            subsequent_indent="  "))
    print(f"\nin-place methods missing ({len(inplace_gaps())}):")
    print(textwrap.fill(" ".join(inplace_gaps()), 100, initial_indent="  ", subsequent_indent="  "))


if __name__ == "__main__":
    sys.exit(main())
