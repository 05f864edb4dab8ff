// Convolutions over NCHW (1-D convolutions run with IH = OH = KH = 1).
//
// conv2d: direct convolution, register-blocked: a work-item computes TCO
// output channels (inside one group) x TP consecutive output columns, so each
// input vector feeds TCO multiply-adds per element and each weight feeds TP.
// Instance defines: CIN IH IW COUT OH OW KH KW SH SW DH DW PT PL GROUPS CIN_G
// COUT_G, TCO TP, CO_TILES (= ceil(COUT_G / TCO)), HAS_BIAS, HAS_RES (a
// residual R laid out like Y, added before the epilogue), ACTIVATE(v).
// NDRange: (ceil(OW/TP), OH, N * GROUPS * CO_TILES). Weights in ONNX layout
// [COUT][CIN_G][KH][KW].
//
// depthwise_rows (CIN_G == 1): one work-item per output row; the columns
// LO <= ow < HI, whose windows lie inside the input row, run without bounds
// checks, so the compiler sees straight-line loops (PoCL: ~5x the tiled
// kernel on depthwise layers). NDRange: (OH, N * COUT).
//
// conv_transpose: one output element per work-item, gathering the inputs
// that scatter into it. Weights in ONNX layout [CIN][COUT_G][KH][KW].

#define PVLOAD_1(t) (t)[0]
#define PVLOAD_2(t) vload2(0, (t))
#define PVLOAD_4(t) vload4(0, (t))
#define PVLOAD_8(t) vload8(0, (t))
#define PVLOAD_16(t) vload16(0, (t))
#define PVLOAD(w, t) CAT2(PVLOAD_, w)(t)
#define PVSTORE_1(v, t) ((t)[0] = (v))
#define PVSTORE_2(v, t) vstore2((v), 0, (t))
#define PVSTORE_4(v, t) vstore4((v), 0, (t))
#define PVSTORE_8(v, t) vstore8((v), 0, (t))
#define PVSTORE_16(v, t) vstore16((v), 0, (t))
#define PVSTORE(w, v, t) CAT2(PVSTORE_, w)(v, t)

// Every convolution kernel takes X, W, [bias], [R], Y.
#if HAS_BIAS
#define OPT_BIAS __global const store_t* restrict bias,
#else
#define OPT_BIAS
#endif
#if HAS_RES
#define OPT_RES __global const store_t* restrict R,
#else
#define OPT_RES
#endif
#define CONV_PARAMS __global const store_t* restrict X, __global const store_t* restrict W, OPT_BIAS OPT_RES \
    __global store_t* restrict Y

#ifdef ENTRY_conv2d
// PADDED: the lowering padded the input so that every read of every tile is
// in bounds; TP outputs then come from one vector load (stride 1) or one
// double-width load and its even lanes (stride 2).
#if PADDED && SW == 1 && TP > 1
#define LOAD_PADDED(p) LDVEC(TP, (p), 0)
#elif PADDED && SW == 2 && TP == 8
#define LOAD_PADDED(p) LDV16((p), 0).even
#elif PADDED && SW == 2 && TP == 4
#define LOAD_PADDED(p) LDV8((p), 0).even
#else
#define LOAD_PADDED(p) FN(gather)(p)
#endif
inline VEC(TP) FN(gather)(const __global store_t* p) {
    float xt[TP];
#pragma unroll
    for (int q = 0; q < TP; q++) xt[q] = LD(p, q * SW);
    return PVLOAD(TP, xt);
}

__kernel void FN(conv2d)(CONV_PARAMS) {
    const int ow0 = get_global_id(0) * TP;
    const int oh = get_global_id(1);
    const int z = get_global_id(2);
    if (ow0 >= OW || oh >= OH) return;
    const int tile = z % CO_TILES;
    const int g = (z / CO_TILES) % GROUPS;
    const int n = z / (CO_TILES * GROUPS);
    int wrow[TCO];
    VEC(TP) acc[TCO];
#pragma unroll
    for (int t = 0; t < TCO; t++) {
        const int cog = min(tile * TCO + t, COUT_G - 1);  // tail channels: computed, never stored
        wrow[t] = (g * COUT_G + cog) * (CIN_G * KH * KW);
        acc[t] = (VEC(TP))(0.0f);
    }
    const __global store_t* xg = X + (n * CIN + g * CIN_G) * (IH * IW);
    const int iw0 = ow0 * SW - PL;
    const int ih0 = oh * SH - PT;
    for (int ci = 0; ci < CIN_G; ci++) {
        const __global store_t* xc = xg + ci * (IH * IW);
        for (int kh = 0; kh < KH; kh++) {
            const int ih = ih0 + kh * DH;
#if !PADDED
            if (ih < 0 || ih >= IH) continue;
#endif
            const __global store_t* xr = xc + ih * IW;
            for (int kw = 0; kw < KW; kw++) {
                const int iw = iw0 + kw * DW;
                VEC(TP) xv;
#if PADDED
                xv = LOAD_PADDED(xr + iw);
#else
                if (SW == 1 && TP > 1 && iw >= 0 && iw + TP <= IW) {
                    xv = LDVEC(TP, xr + iw, 0);
                } else {
                    float xt[TP];
#pragma unroll
                    for (int p = 0; p < TP; p++) {
                        const int q = iw + p * SW;
                        xt[p] = (q >= 0 && q < IW) ? LD(xr, q) : 0.0f;
                    }
                    xv = PVLOAD(TP, xt);
                }
#endif
                const int woff = (ci * KH + kh) * KW + kw;
#pragma unroll
                for (int t = 0; t < TCO; t++)
                    acc[t] = fma((VEC(TP))(LD(W, wrow[t] + woff)), xv, acc[t]);
            }
        }
    }
#pragma unroll
    for (int t = 0; t < TCO; t++) {
        const int cog = tile * TCO + t;
        if (cog >= COUT_G) break;
        const int co = g * COUT_G + cog;
        float r[TP];
        PVSTORE(TP, acc[t], r);
#if HAS_BIAS
        const float bv = LD(bias, co);
#else
        const float bv = 0.0f;
#endif
        const int row = ((n * COUT + co) * OH + oh) * OW;
#pragma unroll
        for (int p = 0; p < TP; p++) {
            if (ow0 + p < OW) {
                float v = r[p] + bv;
#if HAS_RES
                v += LD(R, row + ow0 + p);
#endif
                ST(Y, row + ow0 + p, ACTIVATE(v));
            }
        }
    }
}
#undef LOAD_PADDED
#endif  // ENTRY_conv2d

#ifdef ENTRY_depthwise_rows
// One output column with bounds checks (the few columns near the edges).
#define DW_EDGE(ow)                                                             \
    {                                                                           \
        float acc = bv;                                                         \
        for (int kh = 0; kh < KH; kh++) {                                       \
            const int ih = ih0 + kh * DH;                                       \
            if (ih < 0 || ih >= IH) continue;                                   \
            for (int kw = 0; kw < KW; kw++) {                                   \
                const int iw = (ow) * SW - PL + kw * DW;                        \
                if (iw >= 0 && iw < IW) acc = fma(LD(x, ih * IW + iw), w[kh * KW + kw], acc); \
            }                                                                   \
        }                                                                       \
        ST(y, (ow), ACTIVATE(acc + RES(ow)));                                   \
    }

__kernel void FN(depthwise_rows)(CONV_PARAMS) {
    const int oh = get_global_id(0);
    const int z = get_global_id(1);  // n * COUT + co
    if (oh >= OH || z >= NB * COUT) return;
    const int co = z % COUT;
    const int n = z / COUT;
    const __global store_t* x = X + (n * CIN + co / COUT_G) * (IH * IW);
    float w[KH * KW];
    for (int t = 0; t < KH * KW; t++) w[t] = LD(W, co * (KH * KW) + t);
#if HAS_BIAS
    const float bv = LD(bias, co);
#else
    const float bv = 0.0f;
#endif
    __global store_t* y = Y + (z * OH + oh) * OW;
#if HAS_RES
    const __global store_t* res = R + (z * OH + oh) * OW;
#define RES(ow) LD(res, (ow))
#else
#define RES(ow) 0.0f
#endif
    const int ih0 = oh * SH - PT;
    // Three loops, not one with a branch: the interior loop stays branch-free
    // over ow, which is what lets the compiler vectorise it.
    for (int ow = 0; ow < LO; ow++) DW_EDGE(ow)
    for (int ow = LO; ow < HI; ow++) {
        const __global store_t* r = x + ow * SW - PL;
        float acc = bv;
#pragma unroll
        for (int kh = 0; kh < KH; kh++) {
            const int ih = ih0 + kh * DH;
            if (ih < 0 || ih >= IH) continue;
#pragma unroll
            for (int kw = 0; kw < KW; kw++) acc = fma(LD(r, ih * IW + kw * DW), w[kh * KW + kw], acc);
        }
        ST(y, ow, ACTIVATE(acc + RES(ow)));
    }
    for (int ow = HI; ow < OW; ow++) DW_EDGE(ow)
}
#undef DW_EDGE
#undef RES
#endif  // ENTRY_depthwise_rows

#ifdef ENTRY_conv_transpose
__kernel void FN(conv_transpose)(CONV_PARAMS) {
    const int i = get_global_id(0);
    if (i >= COUNT) return;
    const int ow = i % OW;
    const int oh = (i / OW) % OH;
    const int co = (i / (OW * OH)) % COUT;
    const int n = i / (OW * OH * COUT);
    const int g = co / COUT_G;
    const int cog = co % COUT_G;
#if HAS_BIAS
    float acc = LD(bias, co);
#else
    float acc = 0.0f;
#endif
    for (int cig = 0; cig < CIN_G; cig++) {
        const int ci = g * CIN_G + cig;
        const __global store_t* xc = X + (n * CIN + ci) * (IH * IW);
        const __global store_t* wc = W + (ci * COUT_G + cog) * (KH * KW);
        for (int kh = 0; kh < KH; kh++) {
            const int th = oh + PT - kh * DH;
            if (th < 0 || th % SH != 0) continue;
            const int ih = th / SH;
            if (ih >= IH) continue;
            for (int kw = 0; kw < KW; kw++) {
                const int tw = ow + PL - kw * DW;
                if (tw < 0 || tw % SW != 0) continue;
                const int iw = tw / SW;
                if (iw >= IW) continue;
                acc = fma(LD(xc, ih * IW + iw), LD(wc, kh * KW + kw), acc);
            }
        }
    }
    ST(Y, i, ACTIVATE(acc));
}
#endif  // ENTRY_conv_transpose

#undef OPT_BIAS
#undef OPT_RES
#undef CONV_PARAMS
