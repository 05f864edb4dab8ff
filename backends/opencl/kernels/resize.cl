// Resize of a rank <= 4 tensor padded to [D0][D1][D2][D3] (leading 1s).
// nearest: every dimension maps independently; linear: only D2 and D3 may
// change (bilinear), outer dimensions are copied.
// Instance defines: I0..I3, O0..O3 sizes, S0..S3 float scales (output/input),
// COORD_MODE (0 half_pixel, 1 asymmetric, 2 align_corners, 3 pytorch_half_pixel,
// 4 half_pixel_symmetric), NEAREST_MODE (0 round_prefer_floor,
// 1 round_prefer_ceil, 2 floor, 3 ceil), COUNT, ACTIVATE(v).

inline float FN(coord)(int o, float scale, int in_len, int out_len) {
    const float x = (float)o;
#if COORD_MODE == 0
    return (x + 0.5f) / scale - 0.5f;
#elif COORD_MODE == 1
    return x / scale;
#elif COORD_MODE == 2
    // ONNX measures the resized length as scale * input length, unrounded.
    const float out_f = scale * (float)in_len;
    return out_f == 1.0f ? 0.0f : x * (float)(in_len - 1) / (out_f - 1.0f);
#elif COORD_MODE == 3
    return out_len > 1 ? (x + 0.5f) / scale - 0.5f : 0.0f;
#else
    const float adjustment = (float)out_len / (scale * (float)in_len);
    const float center = (float)in_len / 2.0f;
    const float offset = center * (1.0f - adjustment);
    return offset + (x + 0.5f) / scale - 0.5f;
#endif
}

inline int FN(nearest)(int o, float scale, int in_len, int out_len) {
    if (in_len == out_len && scale == 1.0f) return o;
    const float x = FN(coord)(o, scale, in_len, out_len);
#if NEAREST_MODE == 0
    int r = (x == floor(x) + 0.5f) ? (int)floor(x) : (int)round(x);
#elif NEAREST_MODE == 1
    int r = (x == floor(x) + 0.5f) ? (int)ceil(x) : (int)round(x);
#elif NEAREST_MODE == 2
    int r = (int)floor(x);
#else
    int r = (int)ceil(x);
#endif
    return clamp(r, 0, in_len - 1);
}

#ifdef ENTRY_resize_nearest
__kernel void FN(resize_nearest)(__global const store_t* restrict x, __global store_t* restrict y) {
    const int i = get_global_id(0);
    if (i >= COUNT) return;
    const int o3 = i % O3;
    const int o2 = (i / O3) % O2;
    const int o1 = (i / (O3 * O2)) % O1;
    const int o0 = i / (O3 * O2 * O1);
    const int i0 = FN(nearest)(o0, S0, I0, O0);
    const int i1 = FN(nearest)(o1, S1, I1, O1);
    const int i2 = FN(nearest)(o2, S2, I2, O2);
    const int i3 = FN(nearest)(o3, S3, I3, O3);
    const float v = LD(x, ((i0 * I1 + i1) * I2 + i2) * I3 + i3);
    ST(y, i, ACTIVATE(v));
}
#endif  // ENTRY_resize_nearest

#ifdef ENTRY_resize_linear
__kernel void FN(resize_linear)(__global const store_t* restrict x, __global store_t* restrict y) {
    const int i = get_global_id(0);
    if (i >= COUNT) return;
    const int o3 = i % O3;
    const int o2 = (i / O3) % O2;
    const int plane = i / (O3 * O2);
    const float fy = clamp(FN(coord)(o2, S2, I2, O2), 0.0f, (float)(I2 - 1));
    const float fx = clamp(FN(coord)(o3, S3, I3, O3), 0.0f, (float)(I3 - 1));
    const int y0 = (int)floor(fy);
    const int x0 = (int)floor(fx);
    const int y1 = min(y0 + 1, I2 - 1);
    const int x1 = min(x0 + 1, I3 - 1);
    const float wy = fy - (float)y0;
    const float wx = fx - (float)x0;
    const __global store_t* p = x + plane * (I2 * I3);
    const float top = (1.0f - wx) * LD(p, y0 * I3 + x0) + wx * LD(p, y0 * I3 + x1);
    const float bottom = (1.0f - wx) * LD(p, y1 * I3 + x0) + wx * LD(p, y1 * I3 + x1);
    const float v = (1.0f - wy) * top + wy * bottom;
    ST(y, i, ACTIVATE(v));
}
#endif  // ENTRY_resize_linear
