// Row-wise reductions and normalisations.
// reduce: output element i folds R inputs at OUT_BASE(i) + RED_OFF(r) with
//   COMBINE(acc, v) from INIT, then FINAL(acc).
// softmax: COUNT rows of AXIS elements, stride INNER; LOG selects log-softmax.
// layernorm: COUNT rows of NORM contiguous elements; SCALE_OFF(j)/BIAS_OFF(j)
//   broadcast the affine parameters; HAS_BIAS, HAS_MEAN, HAS_INVSTD select the
//   optional tensors; EPS.

#ifdef ENTRY_reduce
__kernel void FN(reduce)(__global const store_t* restrict x, __global store_t* restrict y) {
    const int i = get_global_id(0);
    if (i >= COUNT) return;
    const int base = OUT_BASE(i);
    float acc = INIT;
    for (int r = 0; r < R; r++) {
        const float v = LD(x, base + RED_OFF(r));
        acc = COMBINE(acc, v);
    }
    const float out = FINAL(acc);
    ST(y, i, ACTIVATE(out));
}
#endif  // ENTRY_reduce

#ifdef ENTRY_softmax
__kernel void FN(softmax)(__global const store_t* restrict x, __global store_t* restrict y) {
    const int row = get_global_id(0);
    if (row >= COUNT) return;
    const int base = (row / INNER) * (AXIS * INNER) + row % INNER;
    float m = -INFINITY;
    for (int j = 0; j < AXIS; j++) m = fmax(m, LD(x, base + j * INNER));
    float s = 0.0f;
    for (int j = 0; j < AXIS; j++) s += exp(LD(x, base + j * INNER) - m);
#if LOG
    const float shift = m + log(s);
    for (int j = 0; j < AXIS; j++) ST(y, base + j * INNER, LD(x, base + j * INNER) - shift);
#else
    const float inv = 1.0f / s;
    for (int j = 0; j < AXIS; j++) ST(y, base + j * INNER, exp(LD(x, base + j * INNER) - m) * inv);
#endif
}
#endif  // ENTRY_softmax

#ifdef ENTRY_layernorm
__kernel void FN(layernorm)(__global const store_t* restrict x, __global const store_t* restrict scale,
#if HAS_BIAS
                            __global const store_t* restrict bias,
#endif
#if HAS_MEAN
                            __global store_t* restrict mean_out,
#endif
#if HAS_INVSTD
                            __global store_t* restrict invstd_out,
#endif
                            __global store_t* restrict y) {
    const int row = get_global_id(0);
    if (row >= COUNT) return;
    const __global store_t* p = x + row * NORM;
    float s = 0.0f;
    for (int j = 0; j < NORM; j++) s += LD(p, j);
    const float mean = s / (float)NORM;
    float q = 0.0f;
    for (int j = 0; j < NORM; j++) {
        const float d = LD(p, j) - mean;
        q += d * d;
    }
    const float inv = 1.0f / sqrt(q / (float)NORM + EPS);
    for (int j = 0; j < NORM; j++) {
        float v = (LD(p, j) - mean) * inv * LD(scale, SCALE_OFF(j));
#if HAS_BIAS
        v += LD(bias, BIAS_OFF(j));
#endif
        ST(y, row * NORM + j, ACTIVATE(v));
    }
#if HAS_MEAN
    ST(mean_out, row, mean);
#endif
#if HAS_INVSTD
    ST(invstd_out, row, inv);
#endif
}
#endif  // ENTRY_layernorm
