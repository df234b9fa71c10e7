// What the two paged-attention files share: attention.cc (decode, and the sub-block kernels) and
// prefill_attention.cc (the causal prefill driver). Internal to those two files.
#pragma once

#include <cstdint>

#include "kv_dtype.h"

namespace plk {

constexpr int kAttnSub = 64;                       // cache positions per online-softmax step
constexpr int64_t kAttnBytesPerThread = 128 * 1024;  // K/V bytes per thread below which one thread runs

// Empty online-softmax states: acc 0, max -inf, sum 0, for `rows` rows of d + 2 floats.
void attn_reset_states(float* acc, int64_t rows, int64_t d);

// The online-softmax update of `rows` query rows q [rows, d] against n <= kAttnSub contiguous cache
// rows starting at element `row` of k_cache / v_cache (type kt, read in place or widened): acc
// [rows, d + 2] holds each row's weighted values, running max and running sum. avx: the AVX2 kernel
// (d a multiple of 8), else the portable one.
void attn_sub_block(bool avx, KvDtype kt, const float* q, int64_t rows, int64_t d, float scale, const void* k_cache,
                    const void* v_cache, int64_t row, int n, float* acc);

}  // namespace plk
