"""The int8 dot products' two instruction sets (csrc/int8_tiles.h): AVX-512 VNNI where the CPU has it, AVX2
otherwise. Both must give bit for bit the same results, and no AVX-512 instruction may sit anywhere but in the VNNI
tiles: the extension is one file, loaded on CPUs without AVX-512 too (SIGILL)."""
from __future__ import annotations

import re
import shutil
import subprocess

import pytest
import torch

from tritonllm.engine import cpu_kernels
from tritonllm.engine.quant import Int4Weight, Int8Weight

from test_quant import _block_layouts, _int8_groups

ext = cpu_kernels.load() if cpu_kernels.cpu_supported() else None
native = pytest.mark.skipif(ext is None, reason="native CPU kernels unavailable (not x86 AVX2)")


def _has_vnni() -> bool:
    with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
        flags = f.read()
    return " avx512_vnni" in flags and " avx512vl" in flags


vnni = pytest.mark.skipif(ext is None or not _has_vnni(), reason="this CPU lacks AVX-512 VNNI + VL: only AVX2 runs")

# An EVEX-only instruction or register: zmm, xmm / ymm 16-31, mask registers, VNNI, ternary logic, EVEX moves.
EVEX = re.compile(r"zmm|[xy]mm(1[6-9]|2\d|3[01])\b|\{%k|%k[0-7]|vpdpbus|vpternlog|vmovdq[au](8|16|32|64)\b|kmov")
VNNI_TILE = re.compile(r"^void tk_qgemm::\(anonymous namespace\)::(q8x8|q4x8|nbit_x8)_tile<true,")


@native
def test_avx512_instructions_sit_only_in_the_vnni_tiles():
    """Every function of the built extension holding an AVX-512 (EVEX) instruction is a VNNI tile (int8_tiles.h,
    internal linkage, called only where the CPU has VNNI): a helper the linker merged from the VNNI translation unit
    would run AVX-512 on AVX2 CPUs (the mutant: qgemm.h included after the target pragma)."""
    if shutil.which("objdump") is None:
        pytest.skip("objdump (binutils) not installed: cannot read the extension's instructions")
    so = ext.__file__
    listing = subprocess.run(["objdump", "-d", "-C", "--no-show-raw-insn", so], capture_output=True, text=True,
                             check=True).stdout
    evex_functions, function = set(), None
    for line in listing.splitlines():
        head = re.match(r"^[0-9a-f]+ <(.*)>:$", line)
        if head:
            function = head.group(1)
        elif function and EVEX.search(line):
            evex_functions.add(function)
    assert evex_functions, "no VNNI tile found in the extension: was qgemm_vnni_cpu.cpp built?"
    strays = sorted(f for f in evex_functions if not VNNI_TILE.match(f))
    assert not strays, f"AVX-512 instructions outside the VNNI tiles: {strays[:5]}"
    assert any("q4x8_tile<true" in f for f in evex_functions) and any("nbit_x8_tile<true" in f for f in evex_functions)


@native
def test_cpu_isa_names_and_refusals():
    start = ext.cpu_isa()
    try:
        assert ext.cpu_isa("avx2") == "avx2" and ext.cpu_isa() == "avx2"
        assert ext.cpu_isa("auto") == ("avx512_vnni" if _has_vnni() else "avx2")
        with pytest.raises(RuntimeError, match="auto, avx2 or avx512_vnni expected"):
            ext.cpu_isa("avx512")
        if not _has_vnni():
            with pytest.raises(RuntimeError, match="lacks AVX-512 VNNI"):
                ext.cpu_isa("avx512_vnni")
    finally:
        ext.cpu_isa(start)


@vnni
@pytest.mark.parametrize("kind", ["int8", "int8_g64_zeros", "int4", "int4_f16", "int8_f16_zeros", "int8_half_blocks",
                                  "int5_f16_zero16", "int5_f16_zeros", "int6_half_blocks", "int4_kscales",
                                  "int5_kscales", "int6_kscales"])
def test_vnni_tiles_equal_the_avx2_tiles_bit_for_bit(kind):
    """Every int8-activation layout (int8 codes per row, per block with zero shares, per half block; int4; packed 5- /
    6-bit; fp32, fp16 and factored K-quant scales) at decode to prefill rows: the same int32 sums, the same floats."""
    torch.manual_seed(5)
    n, k = 37, 512
    w = torch.randn(n, k) * 0.05
    layouts = {"int8": lambda: Int8Weight(w, ext), "int4": lambda: Int4Weight(w, 32, False, ext),
               "int8_g64_zeros": lambda: _int8_groups(w, 64, True), **_block_layouts(w)}
    q = layouts[kind]()
    q.use_kernels(ext, int8_activations=True)
    start = ext.cpu_isa()
    try:
        for rows in (1, 3, 4, 5, 16, cpu_kernels.TILE_MAX_ROWS + 1):
            x, b = torch.randn(rows, k) * 3, torch.randn(n)
            ext.cpu_isa("avx2")
            y2 = q.matmul(x, b)
            ext.cpu_isa("avx512_vnni")
            yv = q.matmul(x, b)
            assert torch.equal(y2, yv), (kind, rows, float((y2 - yv).abs().max()))
    finally:
        ext.cpu_isa(start)
