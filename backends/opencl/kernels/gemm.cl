// Batched GEMM with a fused epilogue:
//   Y[b][m][n] = ACTIVATE(ALPHA * sum_k A[b][m][k] * B[b][k][n] + BETA * C[b][m][n])
// Each work-item computes a TM x TN register tile (TN = 4, 8 or 16: one
// float vector per row), so every B load feeds TM fused multiply-adds and
// every A load feeds TN.
// Instance defines:
//   M N K TM TN; A_OFF(b) B_OFF(b) Y_OFF(b) batch offsets (broadcasting);
//   SAM SAK: strides of A (transposed A is just other strides);
//   BPACK: B is packed in panels [ceil(N/PW)][K][PW], zero padded (constants);
//     a work-item reads TN (a divisor of PW) columns of one panel;
//   otherwise SBK SBN strides of B, and B_VEC when SBN == 1 (vector loads);
//   HAS_C with C_OFF(b) SCM SCN (stride 0 = broadcast), ALPHA BETA;
//   HAS_RES: add R (laid out like Y) before ACTIVATE(v).
// NDRange: (ceil(N/TN), ceil(M/TM), batch).

#define GEMM_ROWS(BLOAD)                                                        \
    for (int k = 0; k < K; k++) {                                               \
        const VEC(TN) bv = BLOAD;                                               \
        _Pragma("unroll")                                                       \
        for (int i = 0; i < TM; i++)                                            \
            acc[i] = fma((VEC(TN))(LD(a, arow[i] + k * SAK)), bv, acc[i]);      \
    }

__kernel void FN(gemm)(__global const store_t* restrict A, __global const store_t* restrict B,
#if HAS_C
                       __global const store_t* restrict Cm,
#endif
#if HAS_RES
                       __global const store_t* restrict R,
#endif
                       __global store_t* restrict Y) {
    const int n0 = get_global_id(0) * TN;
    const int m0 = get_global_id(1) * TM;
    const int b = get_global_id(2);
    if (n0 >= N || m0 >= M) return;
    const __global store_t* a = A + A_OFF(b);
    const __global store_t* bb = B + B_OFF(b);
    int arow[TM];
    VEC(TN) acc[TM];
#pragma unroll
    for (int i = 0; i < TM; i++) {
        arow[i] = min(m0 + i, M - 1) * SAM;  // edge rows recompute the last row; never stored
        acc[i] = (VEC(TN))(0.0f);
    }
#if BPACK
    const __global store_t* bp = bb + (n0 / PW) * (K * PW) + n0 % PW;
    GEMM_ROWS(LDVEC(TN, bp + k * PW, 0))
#else
    if (B_VEC && n0 + TN <= N) {
        const __global store_t* bp = bb + n0;
        GEMM_ROWS(LDVEC(TN, bp + k * SBK, 0))
    } else {
        float bt[TN];
        for (int k = 0; k < K; k++) {
#pragma unroll
            for (int j = 0; j < TN; j++) bt[j] = (n0 + j < N) ? LD(bb, k * SBK + (n0 + j) * SBN) : 0.0f;
            const VEC(TN) bv = CAT2(vload, TN)(0, bt);
#pragma unroll
            for (int i = 0; i < TM; i++)
                acc[i] = fma((VEC(TN))(LD(a, arow[i] + k * SAK)), bv, acc[i]);
        }
    }
#endif
    __global store_t* y = Y + Y_OFF(b);
#pragma unroll
    for (int i = 0; i < TM; i++) {
        const int m = m0 + i;
        if (m >= M) break;
        float r[TN];
        CAT2(vstore, TN)(acc[i], 0, r);
#pragma unroll
        for (int j = 0; j < TN; j++) {
            const int n = n0 + j;
            if (n < N) {
                float v = ALPHA * r[j];
#if HAS_C
                v += BETA * LD(Cm, C_OFF(b) + m * SCM + n * SCN);
#endif
#if HAS_RES
                v += LD(R, Y_OFF(b) + m * N + n);
#endif
                ST(y, m * N + n, ACTIVATE(v));
            }
        }
    }
}
