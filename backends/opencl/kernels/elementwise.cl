// Element-wise kernels; one output element per work-item.
// Instance defines: COUNT (output elements), ACTIVATE(v) (fused epilogue),
// BINOP(a, b), A_OFF(i), B_OFF(i) (input offsets of output element i, which
// encode numpy broadcasting), C, INNER, EPS (batch normalisation).

#ifdef ENTRY_unary
__kernel void FN(unary)(__global const store_t* restrict x, __global store_t* restrict y) {
    const int i = get_global_id(0);
    if (i >= COUNT) return;
    const float v = LD(x, i);
    ST(y, i, ACTIVATE(v));
}
#endif  // ENTRY_unary

#ifdef ENTRY_binary
__kernel void FN(binary)(__global const store_t* restrict a, __global const store_t* restrict b,
                         __global store_t* restrict y) {
    const int i = get_global_id(0);
    if (i >= COUNT) return;
    const float va = LD(a, A_OFF(i));
    const float vb = LD(b, B_OFF(i));
    const float v = BINOP(va, vb);
    ST(y, i, ACTIVATE(v));
}
#endif  // ENTRY_binary

// Inference batch normalisation over NC... layout: channel = (i / INNER) % C.
#ifdef ENTRY_batchnorm
__kernel void FN(batchnorm)(__global const store_t* restrict x, __global const store_t* restrict scale,
                            __global const store_t* restrict bias, __global const store_t* restrict mean,
                            __global const store_t* restrict var, __global store_t* restrict y) {
    const int i = get_global_id(0);
    if (i >= COUNT) return;
    const int c = (i / INNER) % C;
    const float k = LD(scale, c) / sqrt(LD(var, c) + EPS);
    const float v = (LD(x, i) - LD(mean, c)) * k + LD(bias, c);
    ST(y, i, ACTIVATE(v));
}
#endif  // ENTRY_batchnorm
