// Shared by every program; placed once at the top of each assembled source.
//
// Storage type: float, or half with USE_HALF (then loads and stores convert,
// arithmetic stays in float so accumulations keep fp32 range and precision).
// Each kernel instance is wrapped in its own KID and shape defines; FN(name)
// gives the instance's unique kernel name (name_k<KID>).

#ifdef USE_HALF
#ifdef cl_khr_fp16
#pragma OPENCL EXTENSION cl_khr_fp16 : enable
#endif
// vload_half/vstore_half are core OpenCL: half storage needs no extension.
typedef half store_t;
#define LD(p, i) vload_half((i), (p))
#define ST(p, i, v) vstore_half((v), (i), (p))
#define LDV4(p, i) vload_half4((i), (p))
#define LDV8(p, i) vload_half8((i), (p))
#define LDV16(p, i) vload_half16((i), (p))
#define STV4(p, i, v) vstore_half4((v), (i), (p))
#define STV8(p, i, v) vstore_half8((v), (i), (p))
#else
typedef float store_t;
#define LD(p, i) ((p)[(i)])
#define ST(p, i, v) ((p)[(i)] = (v))
#define LDV4(p, i) vload4((i), (p))
#define LDV8(p, i) vload8((i), (p))
#define LDV16(p, i) vload16((i), (p))
#define STV4(p, i, v) vstore4((v), (i), (p))
#define STV8(p, i, v) vstore8((v), (i), (p))
#endif

#define CAT2_(a, b) a##b
#define CAT2(a, b) CAT2_(a, b)
#define FN_(name, id) name##_k##id
#define FN2(name, id) FN_(name, id)
#define FN(name) FN2(name, KID)

// Vector of width W (1, 2, 4, 8, 16) and its loads; width 1 is plain float.
#define VEC_1 float
#define VEC_2 float2
#define VEC_4 float4
#define VEC_8 float8
#define VEC_16 float16
#define VEC(w) CAT2(VEC_, w)
#define LDVEC_1(p, i) LD(p, i)
#define LDVEC_4(p, i) LDV4(p, i)
#define LDVEC_8(p, i) LDV8(p, i)
#define LDVEC_16(p, i) LDV16(p, i)
#define LDVEC(w, p, i) CAT2(LDVEC_, w)(p, i)

// ONNX Pow: a negative base with an integral exponent is defined (numpy semantics).
inline float onnx_pow(float a, float b) {
    if (a < 0.0f && b == rint(b)) {
        float m = pow(-a, b);
        return (fmod(fabs(b), 2.0f) == 1.0f) ? -m : m;
    }
    return pow(a, b);
}

// Integer division rounding toward negative infinity (floor), for index maths.
inline int floor_div(int a, int b) {
    int q = a / b;
    return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}
