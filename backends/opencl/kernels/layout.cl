// Data movement: one generic gather-copy covers Transpose, Concat, Slice, Pad
// (constant, edge, reflect, wrap) and Split. The lowering writes the index
// maps as expressions of the linear output index i:
//   y[DST_OFF(i)] = VALID(i) ? x[SRC_OFF(i)] : PAD_VALUE     for i < COUNT
// VALID is defined only where some outputs read padding.

__kernel void FN(copy)(__global const store_t* restrict x, __global store_t* restrict y) {
    const int i = get_global_id(0);
    if (i >= COUNT) return;
#ifdef VALID
    const float v = VALID(i) ? LD(x, SRC_OFF(i)) : PAD_VALUE;
#else
    const float v = LD(x, SRC_OFF(i));
#endif
    ST(y, DST_OFF(i), v);
}
