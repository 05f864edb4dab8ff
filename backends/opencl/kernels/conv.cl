// Convolutions over NCHW (1-D convolutions run with IH = OH = KH = 1).
//
// conv2d: direct convolution, register-blocked: a work-item computes TCO
// output channels (inside one group) x TP consecutive output columns, so each
// input vector feeds TCO multiply-adds per element and each weight feeds TP.
// Instance defines: CIN IH IW COUT OH OW KH KW SH SW DH DW PT PL GROUPS CIN_G
// COUT_G, TCO TP, CO_TILES (= ceil(COUT_G / TCO)), HAS_BIAS, ACTIVATE(v).
// NDRange: (ceil(OW/TP), OH, N * GROUPS * CO_TILES). Weights in ONNX layout
// [COUT][CIN_G][KH][KW].
//
// conv_transpose: one output element per work-item, gathering the inputs
// that scatter into it. Weights in ONNX layout [CIN][COUT_G][KH][KW].

#define PVLOAD_1(t) (t)[0]
#define PVLOAD_2(t) vload2(0, (t))
#define PVLOAD_4(t) vload4(0, (t))
#define PVLOAD_8(t) vload8(0, (t))
#define PVLOAD(w, t) CAT2(PVLOAD_, w)(t)
#define PVSTORE_1(v, t) ((t)[0] = (v))
#define PVSTORE_2(v, t) vstore2((v), 0, (t))
#define PVSTORE_4(v, t) vstore4((v), 0, (t))
#define PVSTORE_8(v, t) vstore8((v), 0, (t))
#define PVSTORE(w, v, t) CAT2(PVSTORE_, w)(v, t)

#ifdef ENTRY_conv2d
__kernel void FN(conv2d)(__global const store_t* restrict X, __global const store_t* restrict W,
#if HAS_BIAS
                         __global const store_t* restrict bias,
#endif
                         __global store_t* restrict Y) {
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
            if (ih < 0 || ih >= IH) continue;
            const __global store_t* xr = xc + ih * IW;
            for (int kw = 0; kw < KW; kw++) {
                const int iw = iw0 + kw * DW;
                VEC(TP) xv;
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
        __global store_t* yrow = Y + ((n * COUT + co) * OH + oh) * OW;
#pragma unroll
        for (int p = 0; p < TP; p++) {
            if (ow0 + p < OW) {
                const float v = r[p] + bv;
                ST(yrow, ow0 + p, ACTIVATE(v));
            }
        }
    }
}
#endif  // ENTRY_conv2d

#ifdef ENTRY_conv_transpose
__kernel void FN(conv_transpose)(__global const store_t* restrict X, __global const store_t* restrict W,
#if HAS_BIAS
                                 __global const store_t* restrict bias,
#endif
                                 __global store_t* restrict Y) {
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
