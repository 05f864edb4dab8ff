// Pooling over NCHW (1-D pooling runs with IH = OH = KH = 1).
// Instance defines: COUNT = N*C*OH*OW, IH IW OH OW, KH KW, SH SW, DH DW,
// PT PL (leading pads), PB PR (trailing pads, used for the divisor when
// COUNT_PAD), IS_MAX, ACTIVATE(v). SPATIAL for the global pools.

#ifdef ENTRY_pool
__kernel void FN(pool)(__global const store_t* restrict x, __global store_t* restrict y) {
    const int i = get_global_id(0);
    if (i >= COUNT) return;
    const int ow = i % OW;
    const int oh = (i / OW) % OH;
    const int nc = i / (OW * OH);
    const __global store_t* plane = x + nc * (IH * IW);
    const int hs = oh * SH - PT;
    const int ws = ow * SW - PL;
    float acc = IS_MAX ? -INFINITY : 0.0f;
    int taps = 0;
    int padded_taps = 0;
    for (int kh = 0; kh < KH; kh++) {
        const int ih = hs + kh * DH;
        const bool in_h = ih >= 0 && ih < IH;
        const bool pad_h = ih >= -PT && ih < IH + PB;
        for (int kw = 0; kw < KW; kw++) {
            const int iw = ws + kw * DW;
            if (in_h && iw >= 0 && iw < IW) {
                const float v = LD(plane, ih * IW + iw);
                acc = IS_MAX ? fmax(acc, v) : acc + v;
                taps++;
            }
            if (pad_h && iw >= -PL && iw < IW + PR) padded_taps++;
        }
    }
    float r = acc;
    if (!IS_MAX) r = acc / (float)(COUNT_PAD ? padded_taps : taps);
    ST(y, i, ACTIVATE(r));
}
#endif  // ENTRY_pool

// One work-item per (n, c) plane: mean or max over SPATIAL elements.
#ifdef ENTRY_global_pool
__kernel void FN(global_pool)(__global const store_t* restrict x, __global store_t* restrict y) {
    const int i = get_global_id(0);
    if (i >= COUNT) return;
    const __global store_t* plane = x + i * SPATIAL;
    float acc = IS_MAX ? -INFINITY : 0.0f;
    for (int s = 0; s < SPATIAL; s++) {
        const float v = LD(plane, s);
        acc = IS_MAX ? fmax(acc, v) : acc + v;
    }
    const float r = IS_MAX ? acc : acc / (float)SPATIAL;
    ST(y, i, ACTIVATE(r));
}
#endif  // ENTRY_global_pool
