// Row-wise reductions and normalisations.
// reduce: output element i folds R inputs at OUT_BASE(i) + RED_OFF(r) with
//   COMBINE(acc, v) from INIT, then FINAL(acc).
// softmax: COUNT rows of AXIS elements, stride INNER; LOG selects log-softmax.
// softmax_rows: the same for contiguous rows (INNER == 1), one work-group of WG
//   work-items (a power of two) per row: neighbouring items read neighbouring
//   elements and combine their partial max and sum in local memory.
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

#ifdef ENTRY_softmax_rows
// Tree reduction of part[0..WG) with OP; every work-item gets the result.
#define ROW_REDUCE(part, lid, OP) do { \
        for (int half_ = WG / 2; half_ > 0; half_ >>= 1) { \
            barrier(CLK_LOCAL_MEM_FENCE); \
            if ((lid) < half_) (part)[lid] = OP((part)[lid], (part)[(lid) + half_]); \
        } \
        barrier(CLK_LOCAL_MEM_FENCE); \
    } while (0)
#define ROW_ADD(a, b) ((a) + (b))

__kernel void FN(softmax_rows)(__global const store_t* restrict x, __global store_t* restrict y) {
    __local float part[WG];
    const int lid = get_local_id(0);
    const int base = get_group_id(0) * AXIS;
    float m = -INFINITY;
    for (int j = lid; j < AXIS; j += WG) m = fmax(m, LD(x, base + j));
    part[lid] = m;
    ROW_REDUCE(part, lid, fmax);
    m = part[0];
    barrier(CLK_LOCAL_MEM_FENCE);  // all have read the max before part is reused
    float s = 0.0f;
#if LOG
    for (int j = lid; j < AXIS; j += WG) s += exp(LD(x, base + j) - m);
#else
    // one exp per element: y holds exp(x - m) until the sum is known (a work-item
    // rescales exactly the elements it wrote, so no barrier is needed between)
    for (int j = lid; j < AXIS; j += WG) {
        const float e = exp(LD(x, base + j) - m);
        ST(y, base + j, e);
        s += e;
    }
#endif
    part[lid] = s;
    ROW_REDUCE(part, lid, ROW_ADD);
    s = part[0];
#if LOG
    const float shift = m + log(s);
    for (int j = lid; j < AXIS; j += WG) ST(y, base + j, LD(x, base + j) - shift);
#else
    const float inv = 1.0f / s;
    for (int j = lid; j < AXIS; j += WG) ST(y, base + j, LD(y, base + j) * inv);
#endif
}
#undef ROW_REDUCE
#undef ROW_ADD
#endif  // ENTRY_softmax_rows

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
