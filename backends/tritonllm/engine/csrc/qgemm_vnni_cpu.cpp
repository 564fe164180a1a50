// The int8-activation tiles compiled for AVX-512 VNNI + VL (int8_tiles.h: the same source as AVX2's, vpdpbusd for
// maddubs + madd). qgemm.h comes before the target pragma, so its inline helpers stay AVX2 code in this file too;
// only int8_tiles.h's functions (internal linkage) and the entry below are AVX-512, and int8_tiles (qgemm_cpu.cpp)
// calls them only on a CPU that has it.
#include <type_traits>
#include "qgemm.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni")
#include "int8_tiles.h"

namespace tk_qgemm {
X8Tiles int8_tiles_vnni(Codes c, Scales s) { return tiles_of<true>(c, s); }
}  // namespace tk_qgemm
#pragma GCC pop_options
