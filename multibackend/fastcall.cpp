// The compiled front of a repeated matmul on torch tensors (see fastcall.py).
//
// serve(A, B, C, options) answers matmul(A, B), matmul(A, B, backend=name) and
// matmul(A, B, autotune=mode) where the plan Python made for the call (plans.py) is torch's own
// op, reading what the plan's key holds straight from the C++ tensors:
// - a family plan (remember): the backend name, the dtypes, ranks and device, and size bounds
//   the decision holds below;
// - an exact plan (remember_exact), for a call whose decision depends on its shape (first-call
//   autotuning, a shape past a family's bounds): the option word (backend or autotune) and its
//   value, and each operand's dtype, sizes, strides, device and pointer offset within 256 bytes.
// Either is served only under the environment values and tables' generation it was made under,
// by at::mm or at::matmul, the ops torch.mm and torch.matmul run.
// A call with C goes to the Python fallback with the same arguments (its family plans make D
// with torch.addmm); any other call it does not serve (other options, a tensor subclass, a torch
// function mode, no plan, a changed environment, sizes past the bounds, or the op refusing the
// arrays) is answered with MISS, and the caller takes matmul's full path, which plans or words
// the error.
#include <Python.h>

#include <ATen/PythonTorchFunctionTLS.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/mm.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/autograd/python_variable.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <unordered_map>
#include <vector>

namespace {

enum Op { MM = 0, MATMUL = 1 };

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
    return t.scalar_type() == type && t.sizes().equals(sizes) && t.strides().equals(strides) &&
           static_cast<int64_t>(reinterpret_cast<uintptr_t>(t.const_data_ptr()) & 255) == offset;
  }
};

// An exact plan: the option word it was asked with, and A and B exactly.
struct Exact {
  PyObject* word;   // "backend" or "autotune" (owned)
  PyObject* value;  // the option's value (owned)
  int64_t device;
  Operand a, b;
  Made made;
};

std::vector<Family> families;
std::unordered_map<uint64_t, std::vector<Exact>> exact;  // by exact_hash
size_t exact_count = 0;
PyObject* fallback = nullptr;     // the Python path of a call with C: fallback(A, B, C, options)
PyObject* miss = nullptr;         // what a call not served is answered with
PyObject* environ_data = nullptr;  // os.environ's own dict (encoded names and values)
PyObject* environment_keys[3] = {nullptr, nullptr, nullptr};
PyObject* generation_cell = nullptr;  // a list whose one item is the tables' generation
PyObject* backend_word = nullptr;    // "backend"
PyObject* autotune_word = nullptr;   // "autotune"
PyObject* auto_word = nullptr;       // "auto"
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
}

void clear() {
  clear_families();
  clear_exact();
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

int64_t device_index(const at::Tensor& t) { return t.is_cpu() ? -1 : t.get_device(); }

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
    if (same) return &e;
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

PyObject* serve(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 4) {
    PyErr_SetString(PyExc_TypeError, "serve takes (A, B, C, options)");
    return nullptr;
  }
  PyObject *A = args[0], *B = args[1], *C = args[2], *options = args[3];
  if (C != Py_None) return PyObject_Vectorcall(fallback, args, 4, nullptr);
  if (!PyDict_CheckExact(options) || !THPVariable_CheckExact(A) || !THPVariable_CheckExact(B) ||
      at::impl::torch_function_mode_enabled())
    return missed();
  PyObject *word = backend_word, *value = auto_word;  // the one option given, if any
  const Py_ssize_t given = PyDict_GET_SIZE(options);
  if (given > 1) return missed();
  if (given == 1) {
    Py_ssize_t position = 0;
    PyObject* name;
    PyDict_Next(options, &position, &name, &value);
    if (same_name(name, backend_word)) {
      word = backend_word;
    } else if (same_name(name, autotune_word)) {
      word = autotune_word;
    } else {
      return missed();
    }
  }
  const at::Tensor& a = THPVariable_Unpack(A);
  const at::Tensor& b = THPVariable_Unpack(B);
  const Made* made = nullptr;
  int error = 0;
  if (a.layout() != at::kStrided || b.layout() != at::kStrided) return missed();  // sparse...
  try {  // a tensor without sizes or strides (nested) has no plan here
    const int64_t device = device_index(a);
    if (word == backend_word) {
      const Family* f = family_of(value, a, b, device);
      if (f != nullptr && within(*f, a, b)) made = &f->made;
    }
    if (made == nullptr) {
      const Exact* e = exact_of(word, value, a, b, device, &error);
      if (e != nullptr) made = &e->made;
    }
  } catch (const std::exception&) {
    return missed();
  }
  if (error < 0) return nullptr;
  if (made == nullptr) return missed();
  const int now = current(*made);
  if (now < 0) return nullptr;
  at::Tensor d;
  if (!now || !run(made->op, a, b, &d)) return missed();
  ++served_count;
  return THPVariable_Wrap(std::move(d));
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

// Fill `made` from (environment (3-tuple of values or None), generation, op); false on an error.
bool made_from(PyObject* environment, PyObject* generation, PyObject* op, Made* made) {
  if (PyTuple_GET_SIZE(environment) != 3) {
    PyErr_SetString(PyExc_ValueError, "remember: the environment holds 3 values");
    return false;
  }
  if (PyUnicode_CompareWithASCIIString(op, "mm") == 0) {
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

// remember_exact(word, value, A, B, environment, generation, op): an exact plan for calls with
// the option `word` ("backend" or "autotune") at `value` on operands exactly like A and B.
PyObject* remember_exact(PyObject*, PyObject* args) {
  PyObject *word, *value, *A, *B, *environment, *generation, *op;
  if (!PyArg_ParseTuple(args, "UOOOO!OU", &word, &value, &A, &B, &PyTuple_Type, &environment,
                        &generation, &op))
    return nullptr;
  if (!same_name(word, backend_word) && !same_name(word, autotune_word)) {
    PyErr_Format(PyExc_ValueError, "remember_exact: word is %R: expected 'backend' or 'autotune'",
                 word);
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
  e.word = same_name(word, backend_word) ? backend_word : autotune_word;
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

PyObject* forget(PyObject*, PyObject*) {
  clear();
  Py_RETURN_NONE;
}

// bind(fallback, miss, environ_data, (three encoded variable names), generation list)
PyObject* bind(PyObject*, PyObject* args) {
  PyObject *call, *sentinel, *environ, *keys, *cell;
  if (!PyArg_ParseTuple(args, "OOO!O!O!", &call, &sentinel, &PyDict_Type, &environ,
                        &PyTuple_Type, &keys, &PyList_Type, &cell))
    return nullptr;
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

// (family plans held, exact plans held, calls served)
PyObject* stats(PyObject*, PyObject*) {
  return Py_BuildValue("(nnK)", static_cast<Py_ssize_t>(families.size()),
                       static_cast<Py_ssize_t>(exact_count), served_count);
}

PyMethodDef methods[] = {
    {"serve", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(serve)), METH_FASTCALL,
     "serve(A, B, C, options): D from a remembered plan, else MISS (with C: the fallback's "
     "answer)"},
    {"remember", remember, METH_VARARGS, "remember a family plan made by torch's own op"},
    {"remember_exact", remember_exact, METH_VARARGS,
     "remember an exact plan made by torch's own op"},
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
  if (backend_word == nullptr || autotune_word == nullptr || auto_word == nullptr) return nullptr;
  return PyModule_Create(&module);
}
