// Data movement: one generic gather-copy covers Transpose, Concat, Slice, Pad
// (constant, edge, reflect, wrap) and Split. The lowering writes the index
// maps as expressions of the linear output index i:
//   y[DST_OFF(i)] = VALID(i) ? x[SRC_OFF(i)] : PAD_VALUE     for i < COUNT
// VALID is defined only where some outputs read padding.
//
// pad2d: constant padding of the last two dims (a convolution's input): one
// work-item per output row, straight loops (no index divisions per element).
// Defines: PLANES, IH, IW, OHP, OWP, TOP, LEFT, PAD_VALUE.

#ifdef ENTRY_copy
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
#endif  // ENTRY_copy

#ifdef ENTRY_pad2d
__kernel void FN(pad2d)(__global const store_t* restrict x, __global store_t* restrict y) {
    const int row = get_global_id(0);  // plane * OHP + output row
    if (row >= PLANES * OHP) return;
    const int ih = row % OHP - TOP;
    __global store_t* out = y + row * OWP;
    if (ih < 0 || ih >= IH) {
        for (int ow = 0; ow < OWP; ow++) ST(out, ow, PAD_VALUE);
        return;
    }
    const __global store_t* in = x + ((row / OHP) * IH + ih) * IW;
    for (int ow = 0; ow < LEFT; ow++) ST(out, ow, PAD_VALUE);
    for (int iw = 0; iw < IW; iw++) ST(out, LEFT + iw, LD(in, iw));
    for (int ow = LEFT + IW; ow < OWP; ow++) ST(out, ow, PAD_VALUE);
}
#endif  // ENTRY_pad2d
