// SKETCHSGD_WIDE: a function compiled twice, for baseline x86-64 and for AVX2 with FMA, the
// one to run chosen when the library loads (GCC's target_clones). For loops that are bound by
// vector width; no AVX-512 clone: on the Zen 4 we measure on it ran slower than AVX2 (its
// 512-bit operations issue as two halves). Put it on
// the loop bodies, not around OpenMP regions: their outlined bodies would not be cloned.
#pragma once

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define SKETCHSGD_WIDE __attribute__((target_clones("default", "arch=x86-64-v3")))
#else
#define SKETCHSGD_WIDE
#endif
