// The compiled front of a repeated matmul on torch tensors (see fastcall.py).
//
// serve(A, B, C, backend, autotune, options) answers matmul(A, B), matmul(A, B, backend=name),
// matmul(A, B, backend=name, config=c) and matmul(A, B, autotune=mode), each also with out=D,
// where the plan Python made for the call (plans.py) is torch's own op, reading what the plan's
// key holds straight from the C++ tensors:
// - a family plan (remember): the backend name, the dtypes, ranks and device, and size bounds
//   the decision holds below;
// - an exact plan (remember_exact), for a call whose decision depends on its shape (first-call
//   autotuning, a shape past a family's bounds) or that names a config: the option word
//   (backend, autotune, or config, whose value is the pair (backend, config)) and its value,
//   and each operand's dtype, sizes, strides, device and pointer offset within 256 bytes.
// Either is served only under the environment values and tables' generation it was made under,
// by at::mm or at::matmul, the ops torch.mm and torch.matmul run.
// - a native plan (remember_native), an exact plan whose D a kernel of ours makes: D is allocated
//   by at::empty on the operands' device and the plan's steps run on torch's current stream of
//   that device: kernels launched by cuLaunchKernel (resolved from libcuda at the first such
//   plan) from a parameter buffer made once, with only the operands' pointers written per call
//   (or, for a tensor map in it, its address replaced by cuTensorMapReplaceAddress), or a
//   kernel library's entry point (mb_gemm) called with the pointers. It is served only while
//   the plan's context is current on the thread and autograd has nothing to record, and a plan
//   with a kernel that adds by atomics only while torch does not ask for deterministic
//   algorithms.
// serve_dot(x, y, backend, autotune, options) answers dot(x, y) and dot(x, y, backend=name) (or
// autotune=mode) the same way from native plans remembered under the words "dot:backend" and
// "dot:autotune", whose D is 0-d; serve_arrays and serve_dot_arrays do the same for CuPy arrays
// (out=D too, where the plan is one of launches and D is what it would allocate).
// With out=D, a plan of 2-D A and B made by at::mm or our kernels writes D in place of the tensor
// it would allocate, where D is what that tensor would be: a plain torch tensor of the plan's
// dtype, sizes and device, row-major contiguous, 16-byte aligned (the alignment the plan was
// decided with), sharing no byte with A or B, and autograd recording nothing; the call answers D.
// A call with C goes to the Python fallback with the same arguments (its family plans make D
// with torch.addmm); any other call it does not serve (other options, a tensor subclass, a torch
// function mode, no plan, a changed environment, sizes past the bounds, or the op refusing the
// arrays) is answered with MISS, and the caller takes matmul's full path, which plans or words
// the error.
#include <Python.h>

#include <ATen/Context.h>
#include <ATen/PythonTorchFunctionTLS.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/mm.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/autograd/python_variable.h>

#include <dlfcn.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <unordered_map>
#include <vector>

namespace {

enum Op { MM = 0, MATMUL = 1, NATIVE = 2 };

// What every plan was made under, and the op that makes D.
struct Made {
  PyObject* environment[3];  // the watched variables' values (owned; null: unset)
  PyObject* generation;      // the tables' generation (owned)
  Op op;
};

// A family plan: what its key holds, and the bounds its decision holds below.
struct Family {
  PyObject* backend;  // the backend name, or None as backend=None passed it (owned)
  c10::ScalarType a_type, b_type;
  int64_t a_dim, b_dim, device;
  int64_t a_elements, b_elements, m, n, k;  // LLONG_MAX where nothing bounds it
  Made made;
};

// One operand as an exact plan's key holds it.
struct Operand {
  c10::ScalarType type;
  std::vector<int64_t> sizes, strides;
  int64_t offset;  // data pointer modulo 256 (its alignment)

  bool is(const at::Tensor& t) const {
    // a tensor with torch's lazy negation bit is another call: the Python path resolves it
    return t.scalar_type() == type && t.sizes().equals(sizes) && t.strides().equals(strides) &&
           static_cast<int64_t>(reinterpret_cast<uintptr_t>(t.const_data_ptr()) & 255) == offset &&
           !t.is_neg();
  }
};

// -- native plans: our kernels launched from here ---------------------------------------------

// The driver entry points native kernel steps use (CUresult is an int; handles are pointers).
using LaunchKernel = int (*)(void* function, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                             unsigned by, unsigned bz, unsigned smem, void* stream, void** params,
                             void** extra);
using CtxGetCurrent = int (*)(void** context);
using TensorMapReplaceAddress = int (*)(void* tensor_map, void* address);
// A kernel library's entry point: mb_gemm(shape, a, b, c, d, alpha, beta, stream), 0 on success.
using Entry = int (*)(const int64_t*, const void*, const void*, const void*, void*, double, double,
                      void*);

// cuBLAS: cublasSetStream_v2(handle, stream) and cublasGemmEx (cublasStatus_t is an int, the
// enums ints, the handle a pointer), 0 on success.
using SetStream = int (*)(void* handle, void* stream);
using GemmEx = int (*)(void* handle, int transa, int transb, int m, int n, int k,
                       const void* alpha, const void* a, int a_type, int lda, const void* b,
                       int b_type, int ldb, const void* beta, void* c, int c_type, int ldc,
                       int compute, int algo);

LaunchKernel cu_launch_kernel = nullptr;
CtxGetCurrent cu_ctx_get_current = nullptr;
TensorMapReplaceAddress cu_tensor_map_replace_address = nullptr;  // absent from old drivers
PyObject* stream_of = nullptr;  // device index -> the raw handle of torch's current stream there

// The operands a step's pointers come from; a slot's source with MAP_SLOT added is a tensor map
// (128 bytes, 64-byte aligned in the buffer) whose address becomes that operand's.
enum Source { SOURCE_A = 0, SOURCE_B = 1, SOURCE_D = 2 };
constexpr int MAP_SLOT = 4;
constexpr size_t MAP_BYTES = 128, MAP_ALIGN = 64;

constexpr size_t PARAM_BYTES = 4096;  // the most a kernel's parameters may take here
constexpr size_t PARAM_COUNT = 256;

// One step of a native plan: a kernel launch, or a call of a library's entry point.
struct Step {
  bool entry = false;
  bool blas = false;
  // a kernel: function, grid, block, dynamic shared memory, and its parameters (the bytes, each
  // one's offset in them, and the offsets where an operand's pointer is written per call)
  void* function = nullptr;
  unsigned grid[3] = {1, 1, 1}, block[3] = {1, 1, 1}, smem = 0;
  std::vector<char> params;
  std::vector<size_t> offsets;
  std::vector<std::pair<size_t, int>> slots;  // (offset, source), MAP_SLOT added for a map
  // an entry point: the shape array it reads, the operand passed as its a, b, c and d, alpha,
  // and beta
  Entry call = nullptr;
  const int64_t* shape = nullptr;
  int operands[4] = {SOURCE_A, SOURCE_B, SOURCE_D, SOURCE_D};
  double alpha = 1, beta = 0;
  // a cuBLAS GEMM: its entry points and handle, its 13 integer arguments in order (transa,
  // transb, m, n, k, a_type, lda, b_type, ldb, c_type, ldc, compute, algo), the operand passed as
  // its A, B and C, and alpha then beta as its compute type reads them
  GemmEx gemm = nullptr;
  SetStream set_stream = nullptr;
  void* handle = nullptr;
  int ints[13] = {};
  int gemm_operands[3] = {SOURCE_A, SOURCE_B, SOURCE_D};
  alignas(8) char scalars[16] = {};
  // any: the one stream it may run on where pinned (a workspace or scratch buffer of the
  // plan is that stream's; 0 is the legacy default stream)
  bool pinned = false;
  uintptr_t stream = 0;
  // a kernel whose float additions run in an order that varies from run to run (atomics)
  bool unordered = false;
};

struct Native {
  void* context = nullptr;  // the CUDA context the steps' functions live in (null: host plan)
  c10::ScalarType d_type;
  std::vector<int64_t> d_sizes;
  std::vector<Step> steps;
  bool unordered = false;    // a step is: not run while torch asks for deterministic algorithms
  PyObject* keep = nullptr;  // what keeps the functions and shape arrays alive (owned)

  ~Native() { Py_XDECREF(keep); }
};

// An exact plan: the option word it was asked with, and A and B exactly.
struct Exact {
  PyObject* word;   // "backend", "autotune" or "config" (owned)
  PyObject* value;  // the option's value (owned)
  int64_t device;
  Operand a, b;
  Made made;
  std::shared_ptr<Native> native;  // set where made.op is NATIVE
};

// The plans own Python objects (a native plan's `keep`, released by ~Native), so they are released
// only while the interpreter runs: by `forget`, which the module registers with Python's atexit
// (so every plan is dropped before the interpreter finalizes), never by a destructor of static
// storage, which runs at the process's exit() after the interpreter is gone (a Py_DECREF there
// deallocates into freed interpreter state). The containers are therefore made once and never
// destroyed; plans remembered after atexit ran (a daemon thread's calls) stay, unreleased.
std::vector<Family>& families = *new std::vector<Family>();
std::unordered_map<uint64_t, std::vector<Exact>>& exact =  // by exact_hash
    *new std::unordered_map<uint64_t, std::vector<Exact>>();
size_t exact_count = 0;
const Exact* last_exact = nullptr;  // the exact plan found last (null after any change to them)
PyObject* fallback = nullptr;  // a call with C: fallback(A, B, C, backend, autotune, options)
PyObject* miss = nullptr;      // what a call not served is answered with
PyObject* environ_data = nullptr;  // os.environ's own dict (encoded names and values)
PyObject* environment_keys[3] = {nullptr, nullptr, nullptr};
PyObject* generation_cell = nullptr;  // a list whose one item is the tables' generation
PyObject* backend_word = nullptr;    // "backend"
PyObject* autotune_word = nullptr;   // "autotune"
PyObject* auto_word = nullptr;       // "auto"
PyObject* config_word = nullptr;     // "config": a named backend's config, as (backend, config)
PyObject* out_word = nullptr;        // "out": the keyword of a D given by the caller
PyObject* dot_backend_word = nullptr;   // "dot:backend": dot's backend option
PyObject* dot_autotune_word = nullptr;  // "dot:autotune"
unsigned long long served_count = 0;

constexpr size_t LIMIT = 4096;

void drop(Made& made) {
  for (PyObject* value : made.environment) Py_XDECREF(value);
  Py_XDECREF(made.generation);
}

void clear_families() {
  for (Family& f : families) {
    Py_XDECREF(f.backend);
    drop(f.made);
  }
  families.clear();
}

void clear_exact() {
  for (auto& bucket : exact) {
    for (Exact& e : bucket.second) {
      Py_XDECREF(e.word);
      Py_XDECREF(e.value);
      drop(e.made);
    }
  }
  exact.clear();
  exact_count = 0;
  last_exact = nullptr;
}

void clear_arrays();

void clear() {
  clear_families();
  clear_exact();
  clear_arrays();
}

PyObject* missed() {
  Py_INCREF(miss);
  return miss;
}

bool same_name(PyObject* a, PyObject* b) {
  if (a == b) return true;
  if (!PyUnicode_CheckExact(a) || !PyUnicode_CheckExact(b)) return false;
  return PyUnicode_Compare(a, b) == 0;
}

// 1 when the value equals the one a plan was made under, 0 when not, -1 on an error.
int same_value(PyObject* now, PyObject* then) {
  if (now == then) return 1;
  if (now == nullptr || then == nullptr) return 0;
  return PyObject_RichCompareBool(now, then, Py_EQ);
}

// 1 when the environment and tables are as the plan was made under, 0 when not, -1 on an error.
int current(const Made& made) {
  for (int i = 0; i < 3; ++i) {
    PyObject* now = PyDict_GetItemWithError(environ_data, environment_keys[i]);
    if (now == nullptr && PyErr_Occurred()) return -1;
    const int same = same_value(now, made.environment[i]);
    if (same <= 0) return same;
  }
  return same_value(PyList_GET_ITEM(generation_cell, 0), made.generation);
}

// A tensor's device as plans key it: the CUDA ordinal, -1 for host memory, -2 for any other
// device (a meta tensor, which holds no values: never served, the Python path refuses it).
int64_t device_index(const at::Tensor& t) {
  return t.is_cuda() ? t.get_device() : (t.is_cpu() ? -1 : -2);
}

// The family whose key this call has (null where none), as it is now.
const Family* family_of(PyObject* backend, const at::Tensor& a, const at::Tensor& b,
                        int64_t device) {
  const c10::ScalarType a_type = a.scalar_type(), b_type = b.scalar_type();
  const int64_t a_dim = a.dim(), b_dim = b.dim();
  if (a_dim < 2 || b_dim < 2) return nullptr;
  for (const Family& f : families) {
    if (f.a_type == a_type && f.b_type == b_type && f.a_dim == a_dim && f.b_dim == b_dim &&
        f.device == device && same_name(f.backend, backend))
      return &f;
  }
  return nullptr;
}

bool within(const Family& f, const at::Tensor& a, const at::Tensor& b) {
  if (a.numel() < f.a_elements || b.numel() < f.b_elements) return true;
  return a.size(-2) < f.m || b.size(-1) < f.n || a.size(-1) < f.k;
}

uint64_t mix(uint64_t h, uint64_t v) { return (h ^ v) * 0x100000001b3ULL; }

uint64_t exact_hash(Py_hash_t value, int64_t device, c10::ScalarType a_type, c10::IntArrayRef a_sizes,
                    c10::ScalarType b_type, c10::IntArrayRef b_sizes) {
  uint64_t h = mix(0xcbf29ce484222325ULL, static_cast<uint64_t>(value));
  h = mix(h, static_cast<uint64_t>(device));
  h = mix(h, static_cast<uint64_t>(a_type));
  for (int64_t s : a_sizes) h = mix(h, static_cast<uint64_t>(s));
  h = mix(h, static_cast<uint64_t>(b_type) + 0x9e37);
  for (int64_t s : b_sizes) h = mix(h, static_cast<uint64_t>(s));
  return h;
}

// The exact plan of this call (null where none; -1 in *error on an error).
const Exact* exact_of(PyObject* word, PyObject* value, const at::Tensor& a, const at::Tensor& b,
                      int64_t device, int* error) {
  if (exact.empty()) return nullptr;
  const Exact* last = last_exact;  // a loop repeats one call: compared first, value by identity
  if (last != nullptr && last->word == word && last->value == value && last->device == device &&
      last->a.is(a) && last->b.is(b))
    return last;
  const Py_hash_t value_hash = PyObject_Hash(value);
  if (value_hash == -1) {
    PyErr_Clear();  // an unhashable value has no plan
    return nullptr;
  }
  auto bucket = exact.find(exact_hash(value_hash, device, a.scalar_type(), a.sizes(),
                                      b.scalar_type(), b.sizes()));
  if (bucket == exact.end()) return nullptr;
  for (const Exact& e : bucket->second) {
    if (e.word != word || e.device != device || !e.a.is(a) || !e.b.is(b)) continue;
    const int same = same_value(value, e.value);
    if (same < 0) { *error = -1; return nullptr; }
    if (same) return last_exact = &e;
  }
  return nullptr;
}

// D by torch's own op; false (and D untouched) when the op refused the arrays. The GIL stays
// held: the op only queues GPU work (microseconds of host time on a repeated call, whose
// allocation the caching allocator serves), and releasing and retaking it costs about as
// much as the rest of this front, where torch's own bindings release it around the op.
bool run(Op op, const at::Tensor& a, const at::Tensor& b, at::Tensor* d) {
  try {
    *d = op == MM ? at::mm(a, b) : at::matmul(a, b);
  } catch (const std::exception&) {
    return false;
  }
  return true;
}

// at::mm into the caller's D (checked by takes_out); false when the op refused the arrays.
bool run_into(const at::Tensor& a, const at::Tensor& b, at::Tensor& d) {
  try {
    at::mm_out(d, a, b);
  } catch (const std::exception&) {
    return false;
  }
  return true;
}

// The bytes from t's first element to one past its last (0 for an empty tensor).
uint64_t byte_extent(const at::Tensor& t) {
  if (t.numel() == 0) return 0;
  int64_t last = 0;
  for (int64_t i = 0; i < t.dim(); ++i) last += (t.size(i) - 1) * t.stride(i);
  return static_cast<uint64_t>(last + 1) * t.element_size();
}

// Whether the bytes [x, x + x_bytes) and [y, y + y_bytes) meet.
bool ranges_meet(uint64_t x, uint64_t x_bytes, uint64_t y, uint64_t y_bytes) {
  return x_bytes != 0 && y_bytes != 0 && x < y + y_bytes && y < x + x_bytes;
}

bool overlap(const at::Tensor& x, uint64_t x_bytes, const at::Tensor& y) {
  return ranges_meet(reinterpret_cast<uintptr_t>(x.const_data_ptr()), x_bytes,
                     reinterpret_cast<uintptr_t>(y.const_data_ptr()), byte_extent(y));
}

// Whether the caller's `out` is the D a plan would allocate for A and B (dtype `type`, `sizes`,
// A's device, row-major contiguous) at an address the plan was decided for (16-byte aligned),
// shares no byte with A or B, and autograd records nothing: any other goes to the Python path,
// which runs it or words the error.
bool takes_out(const at::Tensor& d, const at::Tensor& a, const at::Tensor& b, c10::ScalarType type,
               c10::IntArrayRef sizes) {
  if (d.layout() != at::kStrided || d.scalar_type() != type || !d.sizes().equals(sizes) ||
      d.device() != a.device() || d.is_neg() || d.is_conj() ||
      (reinterpret_cast<uintptr_t>(d.const_data_ptr()) & 15) != 0)
    return false;
  if ((d.requires_grad() || a.requires_grad() || b.requires_grad()) && at::GradMode::is_enabled())
    return false;
  int64_t expected = 1;  // the strides at::empty gives
  for (int64_t i = d.dim() - 1; i >= 0; --i) {
    if (d.stride(i) != expected) return false;
    expected *= d.size(i);
  }
  const uint64_t bytes = static_cast<uint64_t>(d.numel()) * d.element_size();
  return !overlap(d, bytes, a) && !overlap(d, bytes, b);
}

// The raw handle of the current stream a native plan runs on, from `getter` (called with `arg`
// where not null; 0 for a plan of host tensors): 1 when the plan's context is current and each
// step pinned to a stream is pinned to that one, 0 when not, -1 on a Python error.
int stream_for(const Native& n, PyObject* getter, PyObject* arg, uintptr_t* stream) {
  *stream = 0;
  if (n.context != nullptr) {
    void* context = nullptr;
    if (cu_ctx_get_current(&context) != 0 || context != n.context) return 0;
    PyObject* handle =
        arg != nullptr ? PyObject_CallOneArg(getter, arg) : PyObject_CallNoArgs(getter);
    if (handle == nullptr) return -1;
    *stream = reinterpret_cast<uintptr_t>(PyLong_AsVoidPtr(handle));
    Py_DECREF(handle);
    if (PyErr_Occurred()) return -1;
  }
  for (const Step& step : n.steps) {
    if (step.pinned && step.stream != *stream) return 0;
  }
  return 1;
}

// Run a native plan's steps on `stream` with the pointers of A, B and D: false when a launch was
// refused (the Python path then runs the call and words the error).
bool launch_steps(const Native& n, const uintptr_t pointers[3], uintptr_t stream) {
  if (n.unordered && at::globalContext().deterministicAlgorithms()) return false;
  void* raw_stream = reinterpret_cast<void*>(stream);
  for (const Step& step : n.steps) {
    if (step.blas) {
      const int* v = step.ints;
      const void* p[3];
      for (int i = 0; i < 3; ++i)
        p[i] = reinterpret_cast<const void*>(pointers[step.gemm_operands[i]]);
      if (step.set_stream(step.handle, raw_stream) != 0 ||
          step.gemm(step.handle, v[0], v[1], v[2], v[3], v[4], step.scalars, p[0], v[5], v[6], p[1],
                    v[7], v[8], step.scalars + 8, const_cast<void*>(p[2]), v[9], v[10], v[11],
                    v[12]) != 0)
        return false;
      continue;
    }
    if (step.entry) {
      const void* p[4];
      for (int i = 0; i < 4; ++i) p[i] = reinterpret_cast<const void*>(pointers[step.operands[i]]);
      if (step.call(step.shape, p[0], p[1], p[2], const_cast<void*>(p[3]), step.alpha, step.beta,
                    raw_stream) != 0)
        return false;
      continue;
    }
    alignas(MAP_ALIGN) char buffer[PARAM_BYTES];
    void* params[PARAM_COUNT];
    std::memcpy(buffer, step.params.data(), step.params.size());
    for (const auto& slot : step.slots) {
      if (slot.second & MAP_SLOT) {
        void* address = reinterpret_cast<void*>(pointers[slot.second & ~MAP_SLOT]);
        if (cu_tensor_map_replace_address(buffer + slot.first, address) != 0) return false;
        continue;
      }
      const uint64_t value = pointers[slot.second];
      std::memcpy(buffer + slot.first, &value, sizeof value);
    }
    for (size_t i = 0; i < step.offsets.size(); ++i) params[i] = buffer + step.offsets[i];
    if (cu_launch_kernel(step.function, step.grid[0], step.grid[1], step.grid[2], step.block[0],
                         step.block[1], step.block[2], step.smem, raw_stream, params,
                         nullptr) != 0)
      return false;
  }
  return true;
}

// D made by a native plan on torch tensors (into *d where `given`, checked by takes_out): 1 when
// served, 0 when not, -1 on a Python error.
int run_native(const Native& n, const at::Tensor& a, const at::Tensor& b, int64_t device,
               at::Tensor* d, bool given) {
  if ((a.requires_grad() || b.requires_grad()) && at::GradMode::is_enabled()) return 0;
  uintptr_t stream = 0;
  PyObject* index = n.context != nullptr ? PyLong_FromLongLong(device) : nullptr;
  if (n.context != nullptr && index == nullptr) return -1;
  const int ready = stream_for(n, stream_of, index, &stream);
  Py_XDECREF(index);
  if (ready <= 0) return ready;
  if (!given) {
    try {
      *d = at::empty(n.d_sizes, at::TensorOptions().dtype(n.d_type).device(a.device()));
    } catch (const std::exception&) {
      return 0;
    }
  }
  const uintptr_t pointers[3] = {reinterpret_cast<uintptr_t>(a.const_data_ptr()),
                                 reinterpret_cast<uintptr_t>(b.const_data_ptr()),
                                 reinterpret_cast<uintptr_t>(d->data_ptr())};
  return launch_steps(n, pointers, stream) ? 1 : 0;
}

// How many keywords a call's other keywords (`options`) hold; -1 for anything but a dict.
Py_ssize_t keywords(PyObject* options) {
  return PyDict_CheckExact(options) ? PyDict_GET_SIZE(options) : -1;
}

// The one option a call is planned under, from its backend and autotune keywords and the number
// of its other keywords not yet read: "backend" at `backend` where autotune is None, "autotune"
// at `autotune` where backend is "auto"; false where the call is not served here (another
// keyword, or autotuning asked for with another backend).
bool option_of(PyObject* backend, PyObject* autotune, Py_ssize_t others, PyObject** word,
               PyObject** value) {
  if (others != 0) return false;
  if (autotune == Py_None) {
    *word = backend_word;
    *value = backend;
    return true;
  }
  if (backend != auto_word && !same_name(backend, auto_word)) return false;
  *word = autotune_word;
  *value = autotune;
  return true;
}

// The option of a matmul on torch tensors: option_of's, or "config" at (backend, config) where
// the one other keyword is a config, with a backend named and no autotuning; *packed then holds
// that pair, a new reference the caller releases (null otherwise). Beside it the call may give
// out (not None), borrowed into *out (null where not given).
bool matmul_option_of(PyObject* backend, PyObject* autotune, PyObject* options, PyObject** word,
                      PyObject** value, PyObject** packed, PyObject** out) {
  *packed = nullptr;
  *out = nullptr;
  Py_ssize_t others = keywords(options);
  if (others > 0) {
    *out = PyDict_GetItemWithError(options, out_word);  // borrowed
    if (*out == Py_None) return false;  // spelled out: the Python path
    if (*out != nullptr) {
      --others;
    } else if (PyErr_Occurred()) {
      PyErr_Clear();
      return false;
    }
  }
  if (others != 1 || autotune != Py_None)
    return option_of(backend, autotune, others, word, value);
  PyObject* config = PyDict_GetItemWithError(options, config_word);  // borrowed
  if (config == nullptr || config == Py_None || backend == Py_None || backend == auto_word ||
      same_name(backend, auto_word)) {
    PyErr_Clear();  // another keyword: not served here
    return false;
  }
  *packed = PyTuple_Pack(2, backend, config);
  if (*packed == nullptr) {
    PyErr_Clear();
    return false;
  }
  *word = config_word;
  *value = *packed;
  return true;
}

// The word a dot's option is remembered under: "dot:backend" for "backend", "dot:autotune" for
// "autotune".
PyObject* dot_word(PyObject* word) {
  return word == backend_word ? dot_backend_word : dot_autotune_word;
}

// The caller's D, `out`, written by the plan of 2-D A and B found for the call (made by `op`, or
// `native` where not null) where takes_out holds, else MISS (null on a Python error).
PyObject* serve_into(Op op, const Native* native, const at::Tensor& a, const at::Tensor& b,
                     int64_t device, PyObject* out) {
  at::Tensor d = THPVariable_Unpack(out);
  try {
    if (a.dim() != 2 || b.dim() != 2) return missed();
    if (native != nullptr) {
      if (!takes_out(d, a, b, native->d_type, native->d_sizes)) return missed();
    } else if (op != MM || !takes_out(d, a, b, a.scalar_type(), {a.size(0), b.size(1)})) {
      return missed();
    }
  } catch (const std::exception&) {
    return missed();
  }
  if (native != nullptr) {
    const int done = run_native(*native, a, b, device, &d, true);
    if (done < 0) return nullptr;
    if (done == 0) return missed();
  } else if (!run_into(a, b, d)) {
    return missed();
  }
  ++served_count;
  Py_INCREF(out);
  return out;
}

// D for a call on torch tensors A and B with the option `word` at `value` (and the caller's D,
// `out`, where not null), from a family plan (for "backend") or an exact one, else MISS.
PyObject* serve_tensors(PyObject* A, PyObject* B, PyObject* word, PyObject* value,
                        PyObject* out) {
  if (!THPVariable_CheckExact(A) || !THPVariable_CheckExact(B) ||
      (out != nullptr && !THPVariable_CheckExact(out)) || at::impl::torch_function_mode_enabled())
    return missed();
  const at::Tensor& a = THPVariable_Unpack(A);
  const at::Tensor& b = THPVariable_Unpack(B);
  const Made* made = nullptr;
  const Native* native = nullptr;
  int64_t device = -1;
  int error = 0;
  if (a.layout() != at::kStrided || b.layout() != at::kStrided) return missed();  // sparse...
  try {  // a tensor without sizes or strides (nested) has no plan here
    device = device_index(a);
    if (b.device() != a.device()) return missed();  // the Python path words it
    if (word == backend_word) {
      const Family* f = family_of(value, a, b, device);
      if (f != nullptr && within(*f, a, b)) made = &f->made;
    }
    if (made == nullptr) {
      const Exact* e = exact_of(word, value, a, b, device, &error);
      if (e != nullptr) {
        made = &e->made;
        native = e->native.get();
      }
    }
  } catch (const std::exception&) {
    return missed();
  }
  if (error < 0) return nullptr;
  if (made == nullptr) return missed();
  const int now = current(*made);
  if (now < 0) return nullptr;
  if (!now) return missed();
  if (out != nullptr) return serve_into(made->op, native, a, b, device, out);
  at::Tensor d;
  if (native != nullptr) {
    const int done = run_native(*native, a, b, device, &d, false);
    if (done < 0) return nullptr;
    if (done == 0) return missed();
  } else if (!run(made->op, a, b, &d)) {
    return missed();
  }
  ++served_count;
  return THPVariable_Wrap(std::move(d));
}

PyObject* serve(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 6) {
    PyErr_SetString(PyExc_TypeError, "serve takes (A, B, C, backend, autotune, options)");
    return nullptr;
  }
  if (args[2] != Py_None) return PyObject_Vectorcall(fallback, args, 6, nullptr);
  PyObject *word, *value, *packed, *out;  // the one option the call is planned under, and out
  if (!matmul_option_of(args[3], args[4], args[5], &word, &value, &packed, &out)) return missed();
  PyObject* d = serve_tensors(args[0], args[1], word, value, out);
  Py_XDECREF(packed);
  return d;
}

PyObject* serve_dot(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 5) {
    PyErr_SetString(PyExc_TypeError, "serve_dot takes (x, y, backend, autotune, options)");
    return nullptr;
  }
  PyObject *word, *value;
  if (!option_of(args[2], args[3], keywords(args[4]), &word, &value)) return missed();
  return serve_tensors(args[0], args[1], dot_word(word), value, nullptr);
}

// -- handing plans over ------------------------------------------------------------------------

// A size bound as the integer sizes are compared with: x < v exactly when x < ceil(v).
int64_t bound(PyObject* value, const char* what, bool* ok) {
  if (PyFloat_Check(value)) {
    const double v = PyFloat_AS_DOUBLE(value);
    if (v >= 0 && v >= static_cast<double>(LLONG_MAX)) return LLONG_MAX;  // +inf among them
    if (v >= 0) return static_cast<int64_t>(std::ceil(v));
  } else if (PyLong_Check(value)) {
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (overflow > 0) return LLONG_MAX;
    if (overflow == 0 && v >= 0) return v;
  }
  PyErr_Format(PyExc_TypeError, "remember: bound %s is %R: expected a number >= 0", what, value);
  *ok = false;
  return 0;
}

// Fill `made` from (environment (3-tuple of values or None), generation, op: null for a native
// plan); false on an error.
bool made_from(PyObject* environment, PyObject* generation, PyObject* op, Made* made) {
  if (PyTuple_GET_SIZE(environment) != 3) {
    PyErr_SetString(PyExc_ValueError, "remember: the environment holds 3 values");
    return false;
  }
  if (op == nullptr) {
    made->op = NATIVE;
  } else if (PyUnicode_CompareWithASCIIString(op, "mm") == 0) {
    made->op = MM;
  } else if (PyUnicode_CompareWithASCIIString(op, "matmul") == 0) {
    made->op = MATMUL;
  } else {
    PyErr_Format(PyExc_ValueError, "remember: op is %R: expected 'mm' or 'matmul'", op);
    return false;
  }
  for (int i = 0; i < 3; ++i) {
    PyObject* value = PyTuple_GET_ITEM(environment, i);
    made->environment[i] = value == Py_None ? nullptr : value;
    Py_XINCREF(made->environment[i]);
  }
  Py_INCREF(generation);
  made->generation = generation;
  return true;
}

// remember(backend, a_dtype, b_dtype, a_dim, b_dim, device, environment, generation, op,
// bounds (5-tuple: elements of A, of B, M, N, K)): a family plan.
PyObject* remember(PyObject*, PyObject* args) {
  PyObject *backend, *a_dtype, *b_dtype, *environment, *generation, *op, *bounds;
  long long a_dim, b_dim, device;
  if (!PyArg_ParseTuple(args, "OO!O!LLLO!OUO!", &backend, &THPDtypeType, &a_dtype, &THPDtypeType,
                        &b_dtype, &a_dim, &b_dim, &device, &PyTuple_Type, &environment,
                        &generation, &op, &PyTuple_Type, &bounds))
    return nullptr;
  if (backend != Py_None && !PyUnicode_CheckExact(backend)) {
    PyErr_Format(PyExc_TypeError, "remember: backend is %R: expected a name or None", backend);
    return nullptr;
  }
  if (PyTuple_GET_SIZE(bounds) != 5) {
    PyErr_SetString(PyExc_ValueError, "remember: the bounds are 5");
    return nullptr;
  }
  bool ok = true;
  const char* names[5] = {"a_elements", "b_elements", "m", "n", "k"};
  int64_t limits[5];
  for (int i = 0; i < 5; ++i) limits[i] = bound(PyTuple_GET_ITEM(bounds, i), names[i], &ok);
  if (!ok) return nullptr;
  Family f;
  f.a_type = reinterpret_cast<THPDtype*>(a_dtype)->scalar_type;
  f.b_type = reinterpret_cast<THPDtype*>(b_dtype)->scalar_type;
  f.a_dim = a_dim;
  f.b_dim = b_dim;
  f.device = device;
  f.a_elements = limits[0];
  f.b_elements = limits[1];
  f.m = limits[2];
  f.n = limits[3];
  f.k = limits[4];
  if (!made_from(environment, generation, op, &f.made)) return nullptr;
  for (auto it = families.begin(); it != families.end(); ++it) {  // a family made again replaces
    if (it->a_type == f.a_type && it->b_type == f.b_type && it->a_dim == f.a_dim &&
        it->b_dim == f.b_dim && it->device == f.device && same_name(it->backend, backend)) {
      Py_XDECREF(it->backend);
      drop(it->made);
      families.erase(it);
      break;
    }
  }
  if (families.size() >= LIMIT) clear_families();
  Py_INCREF(backend);
  f.backend = backend;
  families.push_back(f);
  Py_RETURN_NONE;
}

// An exact plan for calls with the option `word` ("backend", "autotune" or "config", for dot
// "dot:backend" or "dot:autotune") at `value` on operands
// exactly like A and B, made by `op` ("mm" or "matmul"), or by `native` where op is null.
PyObject* store_exact(PyObject* word, PyObject* value, PyObject* A, PyObject* B,
                      PyObject* environment, PyObject* generation, PyObject* op,
                      std::shared_ptr<Native> native) {
  PyObject* known = nullptr;
  for (PyObject* w : {backend_word, autotune_word, config_word, dot_backend_word,
                      dot_autotune_word}) {
    if (same_name(word, w)) known = w;
  }
  if (known == nullptr) {
    PyErr_Format(PyExc_ValueError, "remember_exact: word is %R: expected 'backend', 'autotune', "
                 "'config', 'dot:backend' or 'dot:autotune'", word);
    return nullptr;
  }
  if (!THPVariable_Check(A) || !THPVariable_Check(B)) {
    PyErr_SetString(PyExc_TypeError, "remember_exact: A and B must be torch tensors");
    return nullptr;
  }
  const Py_hash_t value_hash = PyObject_Hash(value);
  if (value_hash == -1) return nullptr;
  const at::Tensor& a = THPVariable_Unpack(A);
  const at::Tensor& b = THPVariable_Unpack(B);
  Exact e;
  if (native == nullptr && (known == dot_backend_word || known == dot_autotune_word)) {
    PyErr_SetString(PyExc_ValueError, "remember_exact: a dot's plan is a native one");
    return nullptr;
  }
  e.word = known;
  try {
    e.device = device_index(a);
    e.a = {a.scalar_type(), a.sizes().vec(), a.strides().vec(),
           static_cast<int64_t>(reinterpret_cast<uintptr_t>(a.const_data_ptr()) & 255)};
    e.b = {b.scalar_type(), b.sizes().vec(), b.strides().vec(),
           static_cast<int64_t>(reinterpret_cast<uintptr_t>(b.const_data_ptr()) & 255)};
  } catch (const std::exception& exc) {
    PyErr_Format(PyExc_ValueError, "remember_exact: A or B has no plain layout: %s", exc.what());
    return nullptr;
  }
  if (!made_from(environment, generation, op, &e.made)) return nullptr;
  e.native = std::move(native);
  last_exact = nullptr;  // the bucket it points into may move
  if (exact_count >= LIMIT) clear_exact();
  std::vector<Exact>& bucket =
      exact[exact_hash(value_hash, e.device, a.scalar_type(), a.sizes(), b.scalar_type(),
                       b.sizes())];
  for (auto it = bucket.begin(); it != bucket.end(); ++it) {  // made again: replaced
    if (it->word == e.word && it->device == e.device && it->a.is(a) && it->b.is(b) &&
        same_value(value, it->value) == 1) {
      Py_XDECREF(it->word);
      Py_XDECREF(it->value);
      drop(it->made);
      bucket.erase(it);
      --exact_count;
      break;
    }
  }
  if (PyErr_Occurred()) {
    drop(e.made);
    return nullptr;
  }
  Py_INCREF(e.word);
  Py_INCREF(value);
  e.value = value;
  bucket.push_back(std::move(e));
  ++exact_count;
  Py_RETURN_NONE;
}

// remember_exact(word, value, A, B, environment, generation, op): an exact plan made by torch's
// op ("mm" or "matmul").
PyObject* remember_exact(PyObject*, PyObject* args) {
  PyObject *word, *value, *A, *B, *environment, *generation, *op;
  if (!PyArg_ParseTuple(args, "UOOOO!OU", &word, &value, &A, &B, &PyTuple_Type, &environment,
                        &generation, &op))
    return nullptr;
  return store_exact(word, value, A, B, environment, generation, op, nullptr);
}

// The driver's entry points, resolved from libcuda once; false (and a Python error) where it
// cannot be loaded.
bool load_driver() {
  if (cu_launch_kernel != nullptr) return true;
  void* library = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    PyErr_Format(PyExc_RuntimeError, "remember_native: libcuda.so.1 did not load: %s", dlerror());
    return false;
  }
  auto launch = reinterpret_cast<LaunchKernel>(dlsym(library, "cuLaunchKernel"));
  auto get_current = reinterpret_cast<CtxGetCurrent>(dlsym(library, "cuCtxGetCurrent"));
  if (launch == nullptr || get_current == nullptr) {
    PyErr_SetString(PyExc_RuntimeError,
                    "remember_native: libcuda.so.1 has no cuLaunchKernel or cuCtxGetCurrent");
    return false;
  }
  cu_launch_kernel = launch;
  cu_ctx_get_current = get_current;
  cu_tensor_map_replace_address =
      reinterpret_cast<TensorMapReplaceAddress>(dlsym(library, "cuTensorMapReplaceAddress"));
  return true;
}

// An unsigned integer argument of a step (a size, a handle or an address); false on an error.
bool unsigned_of(PyObject* value, const char* what, unsigned long long* out) {
  *out = PyLong_Check(value) ? PyLong_AsUnsignedLongLong(value) : 0;
  if (!PyLong_Check(value) || PyErr_Occurred()) {
    PyErr_Clear();
    PyErr_Format(PyExc_ValueError, "remember_native: %s is %R: expected an integer >= 0", what,
                 value);
    return false;
  }
  return true;
}

// A step's last two fields: (pinned, stream), the one stream it may run on where pinned; false on
// an error.
bool stream_from(PyObject* item, Step* step) {
  const Py_ssize_t size = PyTuple_GET_SIZE(item);
  const int pinned = PyObject_IsTrue(PyTuple_GET_ITEM(item, size - 2));
  unsigned long long n = 0;
  if (pinned < 0 || !unsigned_of(PyTuple_GET_ITEM(item, size - 1), "the stream", &n)) return false;
  step->pinned = pinned == 1;
  step->stream = static_cast<uintptr_t>(n);
  return true;
}

// A cuBLAS GEMM step from its tuple: (2, gemm address, set_stream address, handle, (13 ints),
// (sources of A, B, C), scalars (bytes: alpha then beta), pinned, stream); false on an error.
bool blas_step_from(PyObject* item, bool on_device, Step* step) {
  if (!on_device) {
    PyErr_SetString(PyExc_ValueError, "remember_native: a cuBLAS step needs a CUDA context");
    return false;
  }
  step->blas = true;
  unsigned long long n = 0;
  if (!unsigned_of(PyTuple_GET_ITEM(item, 1), "cublasGemmEx", &n)) return false;
  step->gemm = reinterpret_cast<GemmEx>(n);
  if (!unsigned_of(PyTuple_GET_ITEM(item, 2), "cublasSetStream_v2", &n)) return false;
  step->set_stream = reinterpret_cast<SetStream>(n);
  if (!unsigned_of(PyTuple_GET_ITEM(item, 3), "the handle", &n)) return false;
  step->handle = reinterpret_cast<void*>(n);
  PyObject *ints = PyTuple_GET_ITEM(item, 4), *sources = PyTuple_GET_ITEM(item, 5);
  PyObject* scalars = PyTuple_GET_ITEM(item, 6);
  if (!PyTuple_Check(ints) || PyTuple_GET_SIZE(ints) != 13 || !PyTuple_Check(sources) ||
      PyTuple_GET_SIZE(sources) != 3 || !PyBytes_Check(scalars) ||
      PyBytes_GET_SIZE(scalars) > 16 || step->gemm == nullptr || step->set_stream == nullptr ||
      step->handle == nullptr) {
    PyErr_Format(PyExc_ValueError, "remember_native: cuBLAS step %R: expected (2, gemm, "
                 "set_stream, handle (none null), 13 ints, 3 sources, at most 16 bytes of "
                 "scalars, pinned, stream)", item);
    return false;
  }
  for (int i = 0; i < 13; ++i) {
    const long value = PyLong_AsLong(PyTuple_GET_ITEM(ints, i));
    if (value == -1 && PyErr_Occurred()) return false;
    if (value < INT_MIN || value > INT_MAX) {
      PyErr_Format(PyExc_ValueError, "remember_native: cuBLAS argument %ld is past 32 bits", value);
      return false;
    }
    step->ints[i] = static_cast<int>(value);
  }
  for (int i = 0; i < 3; ++i) {
    if (!unsigned_of(PyTuple_GET_ITEM(sources, i), "a source", &n)) return false;
    if (n > SOURCE_D) {
      PyErr_Format(PyExc_ValueError, "remember_native: source %llu: A (0), B (1) or D (2)", n);
      return false;
    }
    step->gemm_operands[i] = static_cast<int>(n);
  }
  std::memcpy(step->scalars, PyBytes_AS_STRING(scalars), PyBytes_GET_SIZE(scalars));
  return stream_from(item, step);
}

// A step from its tuple: (0, function, (gx, gy, gz), (bx, by, bz), smem, params (bytes), offsets,
// slots ((offset, source), ...), unordered, pinned, stream) for a kernel, (1, entry address,
// shape address, (sources of a, b, c, d), alpha, beta, pinned, stream) for an entry point; false
// on an error.
bool step_from(PyObject* item, bool on_device, Step* step) {
  if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) < 1) {
    PyErr_Format(PyExc_ValueError, "remember_native: step %R is not a tuple", item);
    return false;
  }
  const long kind = PyLong_AsLong(PyTuple_GET_ITEM(item, 0));
  unsigned long long n = 0;
  if (kind == 0 && PyTuple_GET_SIZE(item) == 11) {
    if (!on_device) {
      PyErr_SetString(PyExc_ValueError, "remember_native: a kernel step needs a CUDA context");
      return false;
    }
    PyObject *grid = PyTuple_GET_ITEM(item, 2), *block = PyTuple_GET_ITEM(item, 3);
    PyObject *params = PyTuple_GET_ITEM(item, 5), *offsets = PyTuple_GET_ITEM(item, 6);
    PyObject* slots = PyTuple_GET_ITEM(item, 7);
    if (!PyTuple_Check(grid) || PyTuple_GET_SIZE(grid) != 3 || !PyTuple_Check(block) ||
        PyTuple_GET_SIZE(block) != 3 || !PyBytes_Check(params) || !PyTuple_Check(offsets) ||
        !PyTuple_Check(slots)) {
      PyErr_Format(PyExc_ValueError, "remember_native: kernel step %R: expected (0, function, "
                   "grid (3), block (3), smem, params (bytes), offsets, slots, unordered, pinned, "
                   "stream)",
                   item);
      return false;
    }
    if (!unsigned_of(PyTuple_GET_ITEM(item, 1), "the function", &n)) return false;
    step->function = reinterpret_cast<void*>(n);
    for (int i = 0; i < 3; ++i) {
      if (!unsigned_of(PyTuple_GET_ITEM(grid, i), "a grid size", &n)) return false;
      step->grid[i] = static_cast<unsigned>(n);
      if (!unsigned_of(PyTuple_GET_ITEM(block, i), "a block size", &n)) return false;
      step->block[i] = static_cast<unsigned>(n);
    }
    if (!unsigned_of(PyTuple_GET_ITEM(item, 4), "smem", &n)) return false;
    step->smem = static_cast<unsigned>(n);
    const size_t size = static_cast<size_t>(PyBytes_GET_SIZE(params));
    if (size > PARAM_BYTES || static_cast<size_t>(PyTuple_GET_SIZE(offsets)) > PARAM_COUNT) {
      PyErr_Format(PyExc_ValueError, "remember_native: %zu bytes in %zd parameters: at most %zu "
                   "bytes in %zu", size, PyTuple_GET_SIZE(offsets), PARAM_BYTES, PARAM_COUNT);
      return false;
    }
    step->params.assign(PyBytes_AS_STRING(params), PyBytes_AS_STRING(params) + size);
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(offsets); ++i) {
      if (!unsigned_of(PyTuple_GET_ITEM(offsets, i), "a parameter offset", &n)) return false;
      if (n >= size) {
        PyErr_Format(PyExc_ValueError, "remember_native: offset %llu past %zu bytes", n, size);
        return false;
      }
      step->offsets.push_back(static_cast<size_t>(n));
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(slots); ++i) {
      PyObject* slot = PyTuple_GET_ITEM(slots, i);
      unsigned long long source = 0;
      if (!PyTuple_Check(slot) || PyTuple_GET_SIZE(slot) != 2 ||
          !unsigned_of(PyTuple_GET_ITEM(slot, 0), "a slot's offset", &n) ||
          !unsigned_of(PyTuple_GET_ITEM(slot, 1), "a slot's source", &source)) {
        if (!PyErr_Occurred())
          PyErr_Format(PyExc_ValueError, "remember_native: slot %R: expected (offset, source)",
                       slot);
        return false;
      }
      const bool map = (source & MAP_SLOT) != 0;
      if (n + (map ? MAP_BYTES : 8) > size || (source & ~MAP_SLOT) > SOURCE_D ||
          (map && n % MAP_ALIGN != 0)) {
        PyErr_Format(PyExc_ValueError, "remember_native: slot %R: an 8-byte pointer, or with "
                     "source + %d a %zu-byte tensor map at a multiple of %zu, within %zu bytes, "
                     "from A (0), B (1) or D (2)", slot, MAP_SLOT, MAP_BYTES, MAP_ALIGN, size);
        return false;
      }
      if (map && cu_tensor_map_replace_address == nullptr) {
        PyErr_SetString(PyExc_ValueError, "remember_native: a tensor-map slot, but libcuda.so.1 "
                        "has no cuTensorMapReplaceAddress");
        return false;
      }
      step->slots.emplace_back(static_cast<size_t>(n), static_cast<int>(source));
    }
    const int unordered = PyObject_IsTrue(PyTuple_GET_ITEM(item, 8));
    if (unordered < 0) return false;
    step->unordered = unordered == 1;
    return stream_from(item, step);
  }
  if (kind == 1 && PyTuple_GET_SIZE(item) == 8) {
    step->entry = true;
    PyObject* sources = PyTuple_GET_ITEM(item, 3);
    if (!unsigned_of(PyTuple_GET_ITEM(item, 1), "the entry point", &n)) return false;
    step->call = reinterpret_cast<Entry>(n);
    if (!unsigned_of(PyTuple_GET_ITEM(item, 2), "the shape array", &n)) return false;
    step->shape = reinterpret_cast<const int64_t*>(n);
    if (!PyTuple_Check(sources) || PyTuple_GET_SIZE(sources) != 4) {
      PyErr_Format(PyExc_ValueError, "remember_native: entry step %R: expected four sources",
                   item);
      return false;
    }
    for (int i = 0; i < 4; ++i) {
      if (!unsigned_of(PyTuple_GET_ITEM(sources, i), "a source", &n)) return false;
      if (n > SOURCE_D) {
        PyErr_Format(PyExc_ValueError, "remember_native: source %llu: A (0), B (1) or D (2)", n);
        return false;
      }
      step->operands[i] = static_cast<int>(n);
    }
    step->alpha = PyFloat_AsDouble(PyTuple_GET_ITEM(item, 4));
    step->beta = PyFloat_AsDouble(PyTuple_GET_ITEM(item, 5));
    if (PyErr_Occurred()) return false;
    if (step->call == nullptr || step->shape == nullptr) {
      PyErr_SetString(PyExc_ValueError, "remember_native: a null entry point or shape array");
      return false;
    }
    return stream_from(item, step);
  }
  if (kind == 2 && PyTuple_GET_SIZE(item) == 9) return blas_step_from(item, on_device, step);
  if (!PyErr_Occurred())
    PyErr_Format(PyExc_ValueError, "remember_native: step %R: expected a kernel (0, 10 fields), "
                 "an entry point (1, 7 fields) or a cuBLAS GEMM (2, 8 fields)", item);
  return false;
}

// A native plan from (context, d_dtype, d_sizes, steps, keep), as remember_native takes them; null
// (and a Python error) where they are wrong. `streams` is the stream getter the plan will use.
std::shared_ptr<Native> native_from(PyObject* context, PyObject* d_dtype, PyObject* d_sizes,
                                    PyObject* steps, PyObject* keep, PyObject* streams) {
  auto native = std::make_shared<Native>();
  unsigned long long n = 0;
  if (!unsigned_of(context, "the context", &n)) return nullptr;
  native->context = reinterpret_cast<void*>(n);
  if (native->context != nullptr) {
    if (streams == nullptr) {
      PyErr_SetString(PyExc_RuntimeError, "remember_native: bound with no stream getter");
      return nullptr;
    }
    if (!load_driver()) return nullptr;
  }
  native->d_type = reinterpret_cast<THPDtype*>(d_dtype)->scalar_type;
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(d_sizes); ++i) {
    if (!unsigned_of(PyTuple_GET_ITEM(d_sizes, i), "a size of D", &n)) return nullptr;
    native->d_sizes.push_back(static_cast<int64_t>(n));
  }
  if (PyTuple_GET_SIZE(steps) == 0) {
    PyErr_SetString(PyExc_ValueError, "remember_native: no steps");
    return nullptr;
  }
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(steps); ++i) {
    Step step;
    if (!step_from(PyTuple_GET_ITEM(steps, i), native->context != nullptr, &step)) return nullptr;
    native->unordered = native->unordered || step.unordered;
    native->steps.push_back(std::move(step));
  }
  Py_INCREF(keep);
  native->keep = keep;
  return native;
}

// remember_native(word, value, A, B, environment, generation, d_dtype, d_sizes, context, steps,
// keep): an exact plan whose D (d_dtype, d_sizes) the steps make; context is the CUDA context
// their functions live in (0 for a plan of host tensors, whose entry points run with stream 0);
// keep is held while the plan is.
PyObject* remember_native(PyObject*, PyObject* args) {
  PyObject *word, *value, *A, *B, *environment, *generation, *d_dtype, *d_sizes, *context;
  PyObject *steps, *keep;
  if (!PyArg_ParseTuple(args, "UOOOO!OO!O!OO!O", &word, &value, &A, &B, &PyTuple_Type,
                        &environment, &generation, &THPDtypeType, &d_dtype, &PyTuple_Type,
                        &d_sizes, &context, &PyTuple_Type, &steps, &keep))
    return nullptr;
  auto native = native_from(context, d_dtype, d_sizes, steps, keep, stream_of);
  if (native == nullptr) return nullptr;
  return store_exact(word, value, A, B, environment, generation, nullptr, std::move(native));
}

// -- CuPy callers -------------------------------------------------------------------------------

// A plan for CuPy arrays: a native one, with D's shape and dtype as cupy.empty takes them, or the
// call that makes D from (A, B) itself (a library's own, as CuPy's caller would make it).
struct ArrayPlan {
  Made made;
  std::shared_ptr<Native> native;
  PyObject* d_shape = nullptr;  // owned
  PyObject* d_dtype = nullptr;  // owned
  PyObject* produce = nullptr;  // owned; null for a native plan

  ~ArrayPlan() {
    drop(made);
    Py_XDECREF(d_shape);
    Py_XDECREF(d_dtype);
    Py_XDECREF(produce);
  }
};

PyObject* array_type = nullptr;     // cupy.ndarray
PyObject* array_empty = nullptr;    // cupy.empty
PyObject* array_stream = nullptr;   // () -> the raw handle of CuPy's current stream
PyObject* array_plans = nullptr;    // key (array_key) -> capsule of an ArrayPlan
PyObject *data_name, *ptr_name, *device_id_name, *dtype_name, *shape_name, *strides_name;
PyObject* itemsize_name;

void release_array_plan(PyObject* capsule) {
  delete static_cast<ArrayPlan*>(PyCapsule_GetPointer(capsule, "multibackend.ArrayPlan"));
}

// The address and device of an array's data (a CuPy MemoryPointer's ptr and device_id); false
// (and a Python error) where it has none.
bool address_of(PyObject* array, unsigned long long* address, long long* device) {
  PyObject* data = PyObject_GetAttr(array, data_name);
  if (data == nullptr) return false;
  PyObject* ptr = PyObject_GetAttr(data, ptr_name);
  PyObject* id = ptr != nullptr ? PyObject_GetAttr(data, device_id_name) : nullptr;
  Py_DECREF(data);
  if (id == nullptr) {
    Py_XDECREF(ptr);
    return false;
  }
  *address = PyLong_AsUnsignedLongLong(ptr);
  *device = PyLong_AsLongLong(id);
  Py_DECREF(ptr);
  Py_DECREF(id);
  return !PyErr_Occurred();
}

// The key of a call on CuPy arrays, as plans.py's hand_over_native_arrays makes it: (word,
// value, then for A and B the dtype, shape, strides (bytes) and address modulo 256, then the
// device, also left in *device). Null on a Python error.
PyObject* array_key(PyObject* word, PyObject* value, PyObject* A, PyObject* B,
                    unsigned long long pointers[2], long long* device) {
  PyObject* parts[11] = {word, value};
  long long devices[2] = {0, 0};
  PyObject* arrays[2] = {A, B};
  bool ok = true;
  for (int i = 0; i < 2 && ok; ++i) {
    parts[2 + 4 * i] = PyObject_GetAttr(arrays[i], dtype_name);
    parts[3 + 4 * i] = PyObject_GetAttr(arrays[i], shape_name);
    parts[4 + 4 * i] = PyObject_GetAttr(arrays[i], strides_name);
    ok = parts[2 + 4 * i] && parts[3 + 4 * i] && parts[4 + 4 * i] &&
         address_of(arrays[i], &pointers[i], &devices[i]);
    parts[5 + 4 * i] = ok ? PyLong_FromUnsignedLongLong(pointers[i] & 255) : nullptr;
    ok = ok && parts[5 + 4 * i] != nullptr;
  }
  parts[10] = ok ? PyLong_FromLongLong(devices[0]) : nullptr;
  *device = devices[0];
  ok = ok && parts[10] != nullptr && devices[0] == devices[1];
  PyObject* key = ok ? PyTuple_New(11) : nullptr;
  for (int i = 0; i < 11; ++i) {
    if (i < 2) {
      if (key != nullptr) {
        Py_INCREF(parts[i]);
        PyTuple_SET_ITEM(key, i, parts[i]);
      }
    } else if (key != nullptr) {
      PyTuple_SET_ITEM(key, i, parts[i]);
    } else {
      Py_XDECREF(parts[i]);
    }
  }
  if (key == nullptr && !PyErr_Occurred()) Py_RETURN_NONE;  // A and B on two devices
  return key;
}

// The caller's `out` written by a native plan of arrays at `pointers` (A and B, as `key`
// describes them) where takes_array_out holds, else MISS (null on a Python error).
PyObject* serve_array_out(const ArrayPlan& plan, PyObject* key,
                          const unsigned long long pointers[2], long long device, PyObject* out);

// The bytes from an array's address to just past its last element (0 for an empty one), from
// its dtype, shape and strides (bytes) as a key holds them; -1 on a Python error, and below 0
// without one for a negative stride.
long long array_span(PyObject* dtype, PyObject* shape, PyObject* strides) {
  PyObject* size = PyObject_GetAttr(dtype, itemsize_name);
  if (size == nullptr) return -1;
  long long span = PyLong_AsLongLong(size);
  Py_DECREF(size);
  if (!PyTuple_Check(shape) || !PyTuple_Check(strides) ||
      PyTuple_GET_SIZE(shape) != PyTuple_GET_SIZE(strides)) {
    PyErr_SetString(PyExc_TypeError, "serve_arrays: an array's shape or strides is no tuple");
    return -1;
  }
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(shape) && span >= 0; ++i) {
    const long long extent = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, i));
    const long long stride = PyLong_AsLongLong(PyTuple_GET_ITEM(strides, i));
    if (PyErr_Occurred()) return -1;
    if (extent == 0) return 0;
    if (stride < 0) return -2;
    span += (extent - 1) * stride;
  }
  return span;
}

// 1 when `out` (an ndarray) is the D a native plan would allocate: the plan's dtype and shape,
// row-major contiguous, 16-byte aligned, on `device`, sharing no byte with A or B (`spans`: from
// each one's address in `pointers`); 0 when not, -1 on a Python error. Its address goes to *at.
int takes_array_out(PyObject* out, const ArrayPlan& plan, long long device,
                    const unsigned long long pointers[2], const long long spans[2],
                    unsigned long long* at) {
  const Native& n = *plan.native;
  PyObject* dtype = PyObject_GetAttr(out, dtype_name);
  if (dtype == nullptr) return -1;
  const int same = PyObject_RichCompareBool(dtype, plan.d_dtype, Py_EQ);
  Py_DECREF(dtype);
  if (same <= 0) return same;
  PyObject* shape = PyObject_GetAttr(out, shape_name);
  PyObject* strides = shape != nullptr ? PyObject_GetAttr(out, strides_name) : nullptr;
  int fits = strides != nullptr && PyTuple_Check(shape) && PyTuple_Check(strides) &&
             PyTuple_GET_SIZE(shape) == static_cast<Py_ssize_t>(n.d_sizes.size()) &&
             PyTuple_GET_SIZE(strides) == PyTuple_GET_SIZE(shape);
  long long expected = static_cast<long long>(c10::elementSize(n.d_type));  // bytes
  for (Py_ssize_t i = fits ? PyTuple_GET_SIZE(shape) - 1 : -1; i >= 0; --i) {
    const long long size = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, i));
    const long long stride = PyLong_AsLongLong(PyTuple_GET_ITEM(strides, i));
    fits = fits && size == n.d_sizes[i] && stride == expected;
    expected *= size;
  }
  Py_XDECREF(shape);
  Py_XDECREF(strides);
  if (PyErr_Occurred()) return -1;
  long long out_device = 0;
  if (!fits || !address_of(out, at, &out_device)) return PyErr_Occurred() ? -1 : 0;
  if (out_device != device || (*at & 15) != 0) return 0;
  const unsigned long long bytes = static_cast<unsigned long long>(expected);
  for (int i = 0; i < 2; ++i) {
    if (ranges_meet(*at, bytes, pointers[i], static_cast<uint64_t>(spans[i]))) return 0;
  }
  return 1;
}

// D for a repeated call of CuPy arrays A and B with the option `word` at `value` whose native
// plan was handed over (remember_arrays), written into the caller's `out` where not null and
// takes_array_out holds; else MISS.
PyObject* serve_array_call(PyObject* A, PyObject* B, PyObject* word, PyObject* value,
                           PyObject* out) {
  if (array_plans == nullptr || Py_TYPE(A) != (PyTypeObject*)array_type ||
      Py_TYPE(B) != (PyTypeObject*)array_type ||
      (out != nullptr && Py_TYPE(out) != (PyTypeObject*)array_type))
    return missed();
  unsigned long long pointers[2] = {0, 0};
  long long device = 0;
  PyObject* key = array_key(word, value, A, B, pointers, &device);
  if (key == nullptr) return nullptr;
  PyObject* found = key == Py_None ? nullptr : PyDict_GetItemWithError(array_plans, key);
  if (found == nullptr) {
    Py_DECREF(key);
    if (PyErr_Occurred() && !PyErr_ExceptionMatches(PyExc_TypeError)) return nullptr;
    PyErr_Clear();  // an unhashable option has no plan: the Python path words it
    return missed();
  }
  const ArrayPlan& plan =
      *static_cast<ArrayPlan*>(PyCapsule_GetPointer(found, "multibackend.ArrayPlan"));
  const int now = current(plan.made);
  if (now <= 0 || out != nullptr) {
    PyObject* d = now <= 0 ? (now < 0 ? nullptr : missed())
                           : serve_array_out(plan, key, pointers, device, out);
    Py_DECREF(key);
    return d;
  }
  Py_DECREF(key);
  if (plan.produce != nullptr) {
    PyObject* operands[2] = {A, B};
    PyObject* D = PyObject_Vectorcall(plan.produce, operands, 2, nullptr);
    if (D != nullptr) ++served_count;
    return D;
  }
  uintptr_t stream = 0;
  const int ready = stream_for(*plan.native, array_stream, nullptr, &stream);
  if (ready <= 0) return ready < 0 ? nullptr : missed();
  PyObject* D = PyObject_CallFunctionObjArgs(array_empty, plan.d_shape, plan.d_dtype, nullptr);
  if (D == nullptr) return nullptr;
  unsigned long long d_pointer = 0;
  long long d_device = 0;
  if (!address_of(D, &d_pointer, &d_device)) {
    Py_DECREF(D);
    return nullptr;
  }
  const uintptr_t all[3] = {pointers[0], pointers[1], static_cast<uintptr_t>(d_pointer)};
  if (!launch_steps(*plan.native, all, stream)) {
    Py_DECREF(D);
    return missed();
  }
  ++served_count;
  return D;
}

PyObject* serve_array_out(const ArrayPlan& plan, PyObject* key,
                          const unsigned long long pointers[2], long long device, PyObject* out) {
  if (plan.native == nullptr) return missed();  // a library's own call: the Python path
  long long spans[2];
  for (int i = 0; i < 2; ++i) {  // a planned call's strides are >= 0 (torch views them)
    spans[i] = array_span(PyTuple_GET_ITEM(key, 2 + 4 * i), PyTuple_GET_ITEM(key, 3 + 4 * i),
                          PyTuple_GET_ITEM(key, 4 + 4 * i));
    if (spans[i] < 0) return PyErr_Occurred() ? nullptr : missed();
  }
  unsigned long long at = 0;
  const int fits = takes_array_out(out, plan, device, pointers, spans, &at);
  if (fits <= 0) return fits < 0 ? nullptr : missed();
  uintptr_t stream = 0;
  const int ready = stream_for(*plan.native, array_stream, nullptr, &stream);
  if (ready <= 0) return ready < 0 ? nullptr : missed();
  const uintptr_t all[3] = {pointers[0], pointers[1], static_cast<uintptr_t>(at)};
  if (!launch_steps(*plan.native, all, stream)) return missed();
  ++served_count;
  Py_INCREF(out);
  return out;
}

// serve_arrays(A, B, C, backend, autotune, options): a repeated matmul of CuPy arrays
// (serve_array_call), with out=D where given.
PyObject* serve_arrays(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 6) {
    PyErr_SetString(PyExc_TypeError, "serve_arrays takes (A, B, C, backend, autotune, options)");
    return nullptr;
  }
  PyObject *word, *value, *packed, *out;
  if (args[2] != Py_None ||
      !matmul_option_of(args[3], args[4], args[5], &word, &value, &packed, &out))
    return missed();
  PyObject* d = serve_array_call(args[0], args[1], word, value, out);
  Py_XDECREF(packed);
  return d;
}

// serve_dot_arrays(x, y, backend, autotune, options): a repeated dot of CuPy arrays
// (serve_array_call).
PyObject* serve_dot_arrays(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 5) {
    PyErr_SetString(PyExc_TypeError, "serve_dot_arrays takes (x, y, backend, autotune, options)");
    return nullptr;
  }
  PyObject *word, *value;
  if (!option_of(args[2], args[3], keywords(args[4]), &word, &value)) return missed();
  return serve_array_call(args[0], args[1], dot_word(word), value, nullptr);
}

// bind_arrays(ndarray type, empty, stream getter): the array library of serve_arrays.
PyObject* bind_arrays(PyObject*, PyObject* args) {
  PyObject *type, *empty, *streams;
  if (!PyArg_ParseTuple(args, "O!OO", &PyType_Type, &type, &empty, &streams)) return nullptr;
  if (array_plans == nullptr && (array_plans = PyDict_New()) == nullptr) return nullptr;
  Py_INCREF(type);
  Py_XSETREF(array_type, type);
  Py_INCREF(empty);
  Py_XSETREF(array_empty, empty);
  Py_INCREF(streams);
  Py_XSETREF(array_stream, streams);
  Py_RETURN_NONE;
}

// Store `plan` under `key` (an array_key tuple); null on an error.
PyObject* store_array_plan(PyObject* key, std::unique_ptr<ArrayPlan> plan) {
  if (array_plans == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "remember_arrays: no array library bound");
    return nullptr;
  }
  if (PyTuple_GET_SIZE(key) != 11) {
    PyErr_SetString(PyExc_ValueError, "remember_arrays: a key holds 11 items");
    return nullptr;
  }
  PyObject* capsule = PyCapsule_New(plan.get(), "multibackend.ArrayPlan", release_array_plan);
  if (capsule == nullptr) return nullptr;
  plan.release();
  if (PyDict_GET_SIZE(array_plans) >= static_cast<Py_ssize_t>(LIMIT)) PyDict_Clear(array_plans);
  const int stored = PyDict_SetItem(array_plans, key, capsule);
  Py_DECREF(capsule);
  if (stored < 0) return nullptr;
  Py_RETURN_NONE;
}

// remember_arrays(key, environment, generation, d_shape, d_dtype (the array library's), torch
// dtype of D, context, steps, keep): a native plan for calls on arrays with this key.
PyObject* remember_arrays(PyObject*, PyObject* args) {
  PyObject *key, *environment, *generation, *d_shape, *d_dtype, *d_type, *context, *steps, *keep;
  if (!PyArg_ParseTuple(args, "O!O!OO!OO!OO!O", &PyTuple_Type, &key, &PyTuple_Type, &environment,
                        &generation, &PyTuple_Type, &d_shape, &d_dtype, &THPDtypeType, &d_type,
                        &context, &PyTuple_Type, &steps, &keep))
    return nullptr;
  auto plan = std::make_unique<ArrayPlan>();
  plan->native = native_from(context, d_type, d_shape, steps, keep, array_stream);
  if (plan->native == nullptr) return nullptr;
  if (!made_from(environment, generation, nullptr, &plan->made)) return nullptr;
  Py_INCREF(d_shape);
  plan->d_shape = d_shape;
  Py_INCREF(d_dtype);
  plan->d_dtype = d_dtype;
  return store_array_plan(key, std::move(plan));
}

// remember_array_call(key, environment, generation, produce): a plan for calls on arrays with
// this key whose D produce(A, B) makes.
PyObject* remember_array_call(PyObject*, PyObject* args) {
  PyObject *key, *environment, *generation, *produce;
  if (!PyArg_ParseTuple(args, "O!O!OO", &PyTuple_Type, &key, &PyTuple_Type, &environment,
                        &generation, &produce))
    return nullptr;
  if (!PyCallable_Check(produce)) {
    PyErr_Format(PyExc_TypeError, "remember_array_call: produce %R is not callable", produce);
    return nullptr;
  }
  auto plan = std::make_unique<ArrayPlan>();
  if (!made_from(environment, generation, nullptr, &plan->made)) return nullptr;
  Py_INCREF(produce);
  plan->produce = produce;
  return store_array_plan(key, std::move(plan));
}

void clear_arrays() {
  if (array_plans != nullptr) PyDict_Clear(array_plans);
}

PyObject* forget(PyObject*, PyObject*) {
  clear();
  Py_RETURN_NONE;
}

// bind(fallback, miss, environ_data, (three encoded variable names), generation list,
// stream_of (device index -> raw handle of torch's current stream there; None without CUDA))
PyObject* bind(PyObject*, PyObject* args) {
  PyObject *call, *sentinel, *environ, *keys, *cell, *streams;
  if (!PyArg_ParseTuple(args, "OOO!O!O!O", &call, &sentinel, &PyDict_Type, &environ,
                        &PyTuple_Type, &keys, &PyList_Type, &cell, &streams))
    return nullptr;
  if (streams == Py_None) {
    Py_CLEAR(stream_of);
  } else {
    Py_INCREF(streams);
    Py_XSETREF(stream_of, streams);
  }
  if (PyTuple_GET_SIZE(keys) != 3 || PyList_GET_SIZE(cell) != 1) {
    PyErr_SetString(PyExc_ValueError, "bind: three variable names and a one-item list");
    return nullptr;
  }
  Py_INCREF(call);
  Py_XSETREF(fallback, call);
  Py_INCREF(sentinel);
  Py_XSETREF(miss, sentinel);
  Py_INCREF(environ);
  Py_XSETREF(environ_data, environ);
  for (int i = 0; i < 3; ++i) {
    PyObject* name = PyTuple_GET_ITEM(keys, i);
    Py_INCREF(name);
    Py_XSETREF(environment_keys[i], name);
  }
  Py_INCREF(cell);
  Py_XSETREF(generation_cell, cell);
  Py_RETURN_NONE;
}

// (family plans held, exact plans held (CuPy arrays' included), calls served)
PyObject* stats(PyObject*, PyObject*) {
  const Py_ssize_t arrays = array_plans != nullptr ? PyDict_GET_SIZE(array_plans) : 0;
  return Py_BuildValue("(nnK)", static_cast<Py_ssize_t>(families.size()),
                       static_cast<Py_ssize_t>(exact_count) + arrays, served_count);
}

PyMethodDef methods[] = {
    {"serve", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(serve)), METH_FASTCALL,
     "serve(A, B, C, backend, autotune, options): D from a remembered plan, else MISS (with C: "
     "the fallback's answer)"},
    {"remember", remember, METH_VARARGS, "remember a family plan made by torch's own op"},
    {"remember_exact", remember_exact, METH_VARARGS,
     "remember an exact plan made by torch's own op"},
    {"remember_native", remember_native, METH_VARARGS,
     "remember an exact plan made by kernels launched from here"},
    {"serve_dot", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(serve_dot)),
     METH_FASTCALL,
     "serve_dot(x, y, backend, autotune, options): a dot's 0-d result from a native plan, else "
     "MISS"},
    {"serve_arrays", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(serve_arrays)),
     METH_FASTCALL,
     "serve_arrays(A, B, C, backend, autotune, options): D from a native plan of CuPy arrays, "
     "else MISS"},
    {"serve_dot_arrays",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(serve_dot_arrays)), METH_FASTCALL,
     "serve_dot_arrays(x, y, backend, autotune, options): a dot of CuPy arrays from a native "
     "plan, else MISS"},
    {"remember_arrays", remember_arrays, METH_VARARGS,
     "remember a native plan for calls on CuPy arrays"},
    {"remember_array_call", remember_array_call, METH_VARARGS,
     "remember a plan for calls on CuPy arrays made by a library's own call"},
    {"bind_arrays", bind_arrays, METH_VARARGS, "bind cupy.ndarray, cupy.empty and a stream getter"},
    {"forget", forget, METH_NOARGS, "drop every plan"},
    {"bind", bind, METH_VARARGS, "bind the fallback, MISS, the environment and the generation"},
    {"stats", stats, METH_NOARGS, "(family plans held, exact plans held, calls served)"},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastcall",
                      "The compiled front of a repeated matmul (see fastcall.py).", -1, methods};

}  // namespace

PyMODINIT_FUNC PyInit__fastcall() {
  backend_word = PyUnicode_InternFromString("backend");
  autotune_word = PyUnicode_InternFromString("autotune");
  auto_word = PyUnicode_InternFromString("auto");
  config_word = PyUnicode_InternFromString("config");
  out_word = PyUnicode_InternFromString("out");
  dot_backend_word = PyUnicode_InternFromString("dot:backend");
  dot_autotune_word = PyUnicode_InternFromString("dot:autotune");
  data_name = PyUnicode_InternFromString("data");
  ptr_name = PyUnicode_InternFromString("ptr");
  device_id_name = PyUnicode_InternFromString("device_id");
  dtype_name = PyUnicode_InternFromString("dtype");
  shape_name = PyUnicode_InternFromString("shape");
  strides_name = PyUnicode_InternFromString("strides");
  itemsize_name = PyUnicode_InternFromString("itemsize");
  if (backend_word == nullptr || autotune_word == nullptr || auto_word == nullptr ||
      config_word == nullptr || out_word == nullptr ||
      dot_backend_word == nullptr || dot_autotune_word == nullptr ||
      data_name == nullptr || ptr_name == nullptr || device_id_name == nullptr ||
      dtype_name == nullptr || shape_name == nullptr || strides_name == nullptr ||
      itemsize_name == nullptr)
    return nullptr;
  PyObject* created = PyModule_Create(&module);
  if (created == nullptr) return nullptr;
  // every plan dropped at interpreter exit, while the objects they hold can still be released
  PyObject* at_exit = PyImport_ImportModule("atexit");
  PyObject* drop_all = at_exit != nullptr ? PyObject_GetAttrString(created, "forget") : nullptr;
  PyObject* registered =
      drop_all != nullptr ? PyObject_CallMethod(at_exit, "register", "O", drop_all) : nullptr;
  Py_XDECREF(at_exit);
  Py_XDECREF(drop_all);
  if (registered == nullptr) {
    Py_DECREF(created);
    return nullptr;
  }
  Py_DECREF(registered);
  return created;
}
