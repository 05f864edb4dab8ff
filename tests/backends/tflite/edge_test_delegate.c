/*
 * A minimal TFLite external delegate for the tflite backend tests.
 *
 * It needs no TensorFlow headers: the few structs it touches are declared
 * below from tensorflow/lite/core/c/common.h (field order is the C ABI).
 * Build: cc -shared -fPIC -O1 -o libedge_test_delegate.so edge_test_delegate.c
 * With -DEDGE_NO_PLUGIN_SYMBOLS the two plugin entry points are left out
 * (a library LiteRT cannot use).
 *
 * Options (all strings, as load_delegate passes them):
 *   log_path  file the delegate appends its report to (one event per line)
 *   claim     "ADD": take every float32 ADD it can compute; anything else: none
 *   fail      "create": return NULL from create; "prepare": fail Prepare
 * Every option it receives is logged as "option KEY=VALUE".
 */
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum { kTfLiteOk = 0, kTfLiteError = 1 } TfLiteStatus;
enum { kTfLiteFloat32 = 1, kBuiltinAdd = 0, kBuiltinDelegate = 51 };
enum { kActNone = 0, kActRelu = 1, kActReluN1To1 = 2, kActRelu6 = 3 };

typedef struct TfLiteIntArray { int size; int data[]; } TfLiteIntArray;
typedef struct TfLiteQuantizationParams { float scale; int32_t zero_point; } TfLiteQuantizationParams;
typedef struct TfLiteQuantization { int type; void* params; } TfLiteQuantization;
struct TfLiteDelegate;

typedef struct TfLiteTensor {
  int type;
  void* data;
  TfLiteIntArray* dims;
  TfLiteQuantizationParams params;
  int allocation_type;
  size_t bytes;
  const void* allocation;
  const char* name;
  struct TfLiteDelegate* delegate;
  int buffer_handle;
  bool data_is_stale;
  bool is_variable;
  TfLiteQuantization quantization;
  void* sparsity;
  const TfLiteIntArray* dims_signature;
} TfLiteTensor;

typedef struct TfLiteNode {
  TfLiteIntArray* inputs;
  TfLiteIntArray* outputs;
  TfLiteIntArray* intermediates;
  TfLiteIntArray* temporaries;
  void* user_data;
  void* builtin_data;
  const void* custom_initial_data;
  int custom_initial_data_size;
  struct TfLiteDelegate* delegate;
  bool might_have_side_effect;
} TfLiteNode;

struct TfLiteContext;
typedef struct TfLiteRegistration {
  void* (*init)(struct TfLiteContext* context, const char* buffer, size_t length);
  void (*free)(struct TfLiteContext* context, void* buffer);
  TfLiteStatus (*prepare)(struct TfLiteContext* context, TfLiteNode* node);
  TfLiteStatus (*invoke)(struct TfLiteContext* context, TfLiteNode* node);
  const char* (*profiling_string)(const struct TfLiteContext* context, const TfLiteNode* node);
  int32_t builtin_code;
  const char* custom_name;
  int version;
  void* registration_external;
  void* async_kernel;
  uint64_t inplace_operator;
} TfLiteRegistration;

/* Only the prefix we use; the runtime owns the struct. */
typedef struct TfLiteContext {
  size_t tensors_size;
  TfLiteStatus (*GetExecutionPlan)(struct TfLiteContext* context, TfLiteIntArray** plan);
  TfLiteTensor* tensors;
  void* impl_;
  void* ResizeTensor;
  void (*ReportError)(struct TfLiteContext* context, const char* format, ...);
  void* AddTensors;
  TfLiteStatus (*GetNodeAndRegistration)(struct TfLiteContext* context, int node_index,
                                         TfLiteNode** node, TfLiteRegistration** registration);
  TfLiteStatus (*ReplaceNodeSubsetsWithDelegateKernels)(struct TfLiteContext* context,
                                                        TfLiteRegistration registration,
                                                        const TfLiteIntArray* nodes,
                                                        struct TfLiteDelegate* delegate);
} TfLiteContext;

typedef struct TfLiteDelegate {
  void* data_;
  TfLiteStatus (*Prepare)(TfLiteContext* context, struct TfLiteDelegate* delegate);
  void* CopyFromBufferHandle;
  void* CopyToBufferHandle;
  void* FreeBufferHandle;
  int64_t flags;
  void* opaque_delegate_builder; /* must stay NULL, or Prepare is never called */
} TfLiteDelegate;

typedef struct TfLiteDelegateParams {
  TfLiteDelegate* delegate;
  TfLiteIntArray* nodes_to_replace;
  TfLiteIntArray* input_tensors;
  TfLiteIntArray* output_tensors;
} TfLiteDelegateParams;

/* A wheel that changes these layouts would break the casts above: fail the build instead. */
_Static_assert(sizeof(TfLiteTensor) == 112, "TfLiteTensor layout changed");
_Static_assert(sizeof(TfLiteRegistration) == 88, "TfLiteRegistration layout changed");

typedef struct DelegateState {
  char log_path[1024];
  bool claim_add;
  bool fail_prepare;
} DelegateState;

__attribute__((format(printf, 2, 3)))
static void log_line(const char* path, const char* format, ...) {
  if (path[0] == '\0') return;
  FILE* file = fopen(path, "a");
  if (file == NULL) return;
  va_list args;
  va_start(args, format);
  vfprintf(file, format, args);
  va_end(args);
  fputc('\n', file);
  fclose(file);
}

/* One ADD the kernel computes: tensor indices, activation, private buffer when internal. */
typedef struct AddStep { int a, b, out, activation; float* scratch; } AddStep;
typedef struct AddKernel { const char* log_path; int count; AddStep steps[]; } AddKernel;

static size_t element_count(const TfLiteTensor* t) { return t->bytes / sizeof(float); }

/* The kernel broadcasts only a trailing-suffix operand (e.g. a bias vector). */
static bool suffix_of(const TfLiteIntArray* small, const TfLiteIntArray* big) {
  if (small->size > big->size) return false;
  for (int i = 1; i <= small->size; ++i) {
    if (small->data[small->size - i] != big->data[big->size - i]) return false;
  }
  return true;
}

static bool can_take(TfLiteContext* context, TfLiteNode* node) {
  if (node->inputs->size != 2 || node->outputs->size != 1) return false;
  const TfLiteTensor* a = &context->tensors[node->inputs->data[0]];
  const TfLiteTensor* b = &context->tensors[node->inputs->data[1]];
  const TfLiteTensor* out = &context->tensors[node->outputs->data[0]];
  if (a->type != kTfLiteFloat32 || b->type != kTfLiteFloat32 || out->type != kTfLiteFloat32) return false;
  int activation = node->builtin_data ? *(const int*)node->builtin_data : kActNone;
  if (activation > kActRelu6) return false;
  return (suffix_of(a->dims, out->dims) && element_count(out) % element_count(a) == 0) &&
         (suffix_of(b->dims, out->dims) && element_count(out) % element_count(b) == 0);
}

static bool is_partition_output(const TfLiteDelegateParams* params, int tensor) {
  for (int i = 0; i < params->output_tensors->size; ++i) {
    if (params->output_tensors->data[i] == tensor) return true;
  }
  return false;
}

static void* kernel_init(TfLiteContext* context, const char* buffer, size_t length) {
  (void)length;
  const TfLiteDelegateParams* params = (const TfLiteDelegateParams*)buffer;
  const DelegateState* state = (const DelegateState*)params->delegate->data_;
  int count = params->nodes_to_replace->size;
  AddKernel* kernel = calloc(1, sizeof(AddKernel) + (size_t)count * sizeof(AddStep));
  kernel->log_path = state->log_path;
  kernel->count = count;
  for (int i = 0; i < count; ++i) {
    TfLiteNode* node;
    TfLiteRegistration* registration;
    context->GetNodeAndRegistration(context, params->nodes_to_replace->data[i], &node, &registration);
    AddStep* step = &kernel->steps[i];
    step->a = node->inputs->data[0];
    step->b = node->inputs->data[1];
    step->out = node->outputs->data[0];
    step->activation = node->builtin_data ? *(const int*)node->builtin_data : kActNone;
    /* A tensor made and used inside the partition gets no arena memory: keep our own. */
    if (!is_partition_output(params, step->out)) {
      step->scratch = malloc(context->tensors[step->out].bytes);
    }
  }
  log_line(state->log_path, "kernel nodes=%d", count);
  return kernel;
}

static void kernel_free(TfLiteContext* context, void* buffer) {
  (void)context;
  AddKernel* kernel = buffer;
  for (int i = 0; i < kernel->count; ++i) free(kernel->steps[i].scratch);
  free(kernel);
}

static TfLiteStatus kernel_prepare(TfLiteContext* context, TfLiteNode* node) {
  (void)context;
  (void)node;
  return kTfLiteOk;
}

static const float* step_input(const AddKernel* kernel, int upto, const TfLiteTensor* tensors, int index) {
  for (int i = upto - 1; i >= 0; --i) {
    if (kernel->steps[i].out == index && kernel->steps[i].scratch) return kernel->steps[i].scratch;
  }
  return (const float*)tensors[index].data;
}

static float activate(float value, int activation) {
  switch (activation) {
    case kActRelu: return value < 0.f ? 0.f : value;
    case kActReluN1To1: return value < -1.f ? -1.f : (value > 1.f ? 1.f : value);
    case kActRelu6: return value < 0.f ? 0.f : (value > 6.f ? 6.f : value);
    default: return value;
  }
}

static TfLiteStatus kernel_invoke(TfLiteContext* context, TfLiteNode* node) {
  AddKernel* kernel = node->user_data;
  for (int k = 0; k < kernel->count; ++k) {
    const AddStep* step = &kernel->steps[k];
    const float* a = step_input(kernel, k, context->tensors, step->a);
    const float* b = step_input(kernel, k, context->tensors, step->b);
    float* out = step->scratch ? step->scratch : (float*)context->tensors[step->out].data;
    if (a == NULL || b == NULL || out == NULL) {
      context->ReportError(context, "edge test delegate: ADD step %d has no buffer", k);
      return kTfLiteError;
    }
    size_t n = element_count(&context->tensors[step->out]);
    size_t na = element_count(&context->tensors[step->a]);
    size_t nb = element_count(&context->tensors[step->b]);
    for (size_t i = 0; i < n; ++i) out[i] = activate(a[i % na] + b[i % nb], step->activation);
  }
  log_line(kernel->log_path, "invoke nodes=%d", kernel->count);
  return kTfLiteOk;
}

__attribute__((unused)) static TfLiteStatus delegate_prepare(TfLiteContext* context, TfLiteDelegate* delegate) {
  DelegateState* state = delegate->data_;
  if (state->fail_prepare) {
    log_line(state->log_path, "prepare failing on request");
    return kTfLiteError;
  }
  TfLiteIntArray* plan;
  if (context->GetExecutionPlan(context, &plan) != kTfLiteOk) return kTfLiteError;
  TfLiteIntArray* claimed = malloc(sizeof(TfLiteIntArray) + (size_t)plan->size * sizeof(int));
  claimed->size = 0;
  for (int i = 0; i < plan->size; ++i) {
    TfLiteNode* node;
    TfLiteRegistration* registration;
    context->GetNodeAndRegistration(context, plan->data[i], &node, &registration);
    if (state->claim_add && registration->builtin_code == kBuiltinAdd && can_take(context, node)) {
      claimed->data[claimed->size++] = plan->data[i];
    }
  }
  log_line(state->log_path, "prepare plan_nodes=%d claimed=%d", plan->size, claimed->size);
  TfLiteStatus status = kTfLiteOk;
  if (claimed->size > 0) {
    TfLiteRegistration kernel = {0};
    kernel.init = kernel_init;
    kernel.free = kernel_free;
    kernel.prepare = kernel_prepare;
    kernel.invoke = kernel_invoke;
    kernel.builtin_code = kBuiltinDelegate;
    kernel.custom_name = "EdgeTestDelegate";
    kernel.version = 1;
    status = context->ReplaceNodeSubsetsWithDelegateKernels(context, kernel, claimed, delegate);
  }
  free(claimed);
  return status;
}

#ifndef EDGE_NO_PLUGIN_SYMBOLS
/* NOTE: Python's load_delegate passes the option count as a C int, not size_t. */
TfLiteDelegate* tflite_plugin_create_delegate(char** keys, char** values, int count,
                                              void (*report_error)(const char*)) {
  DelegateState* state = calloc(1, sizeof(DelegateState));
  bool fail_create = false;
  for (int i = 0; i < count; ++i) {
    if (strcmp(keys[i], "log_path") == 0) {
      snprintf(state->log_path, sizeof(state->log_path), "%s", values[i]);
    } else if (strcmp(keys[i], "claim") == 0) {
      state->claim_add = strcmp(values[i], "ADD") == 0;
    } else if (strcmp(keys[i], "fail") == 0) {
      fail_create = strcmp(values[i], "create") == 0;
      state->fail_prepare = strcmp(values[i], "prepare") == 0;
    }
  }
  for (int i = 0; i < count; ++i) log_line(state->log_path, "option %s=%s", keys[i], values[i]);
  if (fail_create) {
    log_line(state->log_path, "create failing on request");
    report_error("edge test delegate: create failed on request (fail=create)");
    free(state);
    return NULL;
  }
  TfLiteDelegate* delegate = calloc(1, sizeof(TfLiteDelegate));
  delegate->data_ = state;
  delegate->Prepare = delegate_prepare;
  log_line(state->log_path, "created");
  return delegate;
}

/* NOTE: called with NULL when create failed. */
void tflite_plugin_destroy_delegate(TfLiteDelegate* delegate) {
  if (delegate == NULL) return;
  DelegateState* state = delegate->data_;
  log_line(state->log_path, "destroyed");
  free(state);
  free(delegate);
}
#else
int edge_test_delegate_without_plugin_symbols(void) { return 0; }
#endif
