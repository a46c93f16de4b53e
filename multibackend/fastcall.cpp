// The compiled front of a repeated plain matmul on torch tensors (see fastcall.py).
//
// serve(A, B, C, options) answers matmul(A, B) and matmul(A, B, backend=name) for CUDA tensors
// whose family plan (plans.py) is torch's own op: it reads the dtypes, ranks, device and sizes
// straight from the tensors, finds the family among those Python handed over (remember), checks
// the environment values and tables' generation it was made under and the size bounds it holds
// below, and runs at::mm or at::matmul, the ops torch.mm and torch.matmul run.
// A call with C goes to the Python fallback with the same arguments (its family plans make D
// with torch.addmm); any other call it does not serve (other options, a tensor subclass, a torch
// function mode, no family, a changed environment, sizes past the bounds, or the op refusing
// the arrays) is answered with MISS, and the caller takes matmul's full path, which plans or
// words the error.
#include <Python.h>

#include <ATen/PythonTorchFunctionTLS.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/mm.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/autograd/python_variable.h>

#include <climits>
#include <cmath>
#include <vector>

namespace {

enum Op { MM = 0, MATMUL = 1 };

// One family plan: what its key holds, and the bounds its decision holds below.
struct Family {
  PyObject* backend;        // the backend name (owned)
  c10::ScalarType a_type, b_type;
  int64_t a_dim, b_dim;
  int64_t device;
  PyObject* environment[3];  // the watched variables' values it was made under (owned; null: unset)
  PyObject* generation;      // the tables' generation it was made under (owned)
  Op op;
  int64_t a_elements, b_elements, m, n, k;  // LLONG_MAX where nothing bounds it
};

std::vector<Family> families;
PyObject* fallback = nullptr;     // the Python path of a call with C: fallback(A, B, C, options)
PyObject* miss = nullptr;         // what a call not served is answered with
PyObject* environ_data = nullptr;  // os.environ's own dict (encoded names and values)
PyObject* environment_keys[3] = {nullptr, nullptr, nullptr};
PyObject* generation_cell = nullptr;  // a list whose one item is the tables' generation
PyObject* backend_word = nullptr;    // "backend"
PyObject* auto_word = nullptr;       // "auto"
unsigned long long served_count = 0;

constexpr size_t LIMIT = 4096;

void drop(Family& f) {
  Py_XDECREF(f.backend);
  for (PyObject* value : f.environment) Py_XDECREF(value);
  Py_XDECREF(f.generation);
}

void clear() {
  for (Family& f : families) drop(f);
  families.clear();
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

// 1 when the value equals the one a family was made under, 0 when not, -1 on an error.
int same_value(PyObject* now, PyObject* then) {
  if (now == then) return 1;
  if (now == nullptr || then == nullptr) return 0;
  return PyObject_RichCompareBool(now, then, Py_EQ);
}

// The family serving these tensors under this backend name, or null (-1 in *error on an error).
const Family* find(PyObject* backend, const at::Tensor& a, const at::Tensor& b, int* error) {
  const c10::ScalarType a_type = a.scalar_type(), b_type = b.scalar_type();
  const int64_t a_dim = a.dim(), b_dim = b.dim();
  if (a_dim < 2 || b_dim < 2) return nullptr;
  const int64_t device = a.is_cpu() ? -1 : a.get_device();
  for (const Family& f : families) {
    if (f.a_type != a_type || f.b_type != b_type || f.a_dim != a_dim || f.b_dim != b_dim ||
        f.device != device || !same_name(f.backend, backend))
      continue;
    for (int i = 0; i < 3; ++i) {
      PyObject* now = PyDict_GetItemWithError(environ_data, environment_keys[i]);
      if (now == nullptr && PyErr_Occurred()) { *error = -1; return nullptr; }
      const int same = same_value(now, f.environment[i]);
      if (same <= 0) { *error = same; return nullptr; }
    }
    const int same = same_value(PyList_GET_ITEM(generation_cell, 0), f.generation);
    if (same <= 0) { *error = same; return nullptr; }
    return &f;
  }
  return nullptr;
}

bool within(const Family& f, const at::Tensor& a, const at::Tensor& b) {
  if (a.numel() < f.a_elements || b.numel() < f.b_elements) return true;
  return a.size(-2) < f.m || b.size(-1) < f.n || a.size(-1) < f.k;
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
  PyObject* backend = auto_word;
  const Py_ssize_t given = PyDict_GET_SIZE(options);
  if (given) {
    backend = given == 1 ? PyDict_GetItemWithError(options, backend_word) : nullptr;
    if (backend == nullptr) {
      if (PyErr_Occurred()) return nullptr;
      return missed();
    }
  }
  const at::Tensor& a = THPVariable_Unpack(A);
  const at::Tensor& b = THPVariable_Unpack(B);
  int error = 0;
  const Family* f = find(backend, a, b, &error);
  if (error < 0) return nullptr;
  if (f == nullptr || !within(*f, a, b)) return missed();
  at::Tensor d;
  if (!run(f->op, a, b, &d)) return missed();
  ++served_count;
  return THPVariable_Wrap(std::move(d));
}

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

// remember(backend, a_dtype, b_dtype, a_dim, b_dim, device, environment (3-tuple of values or
// None), generation, op ("mm" or "matmul"), bounds (5-tuple: elements of A, of B, M, N, K)).
PyObject* remember(PyObject*, PyObject* args) {
  PyObject *backend, *a_dtype, *b_dtype, *environment, *generation, *op, *bounds;
  long long a_dim, b_dim, device;
  if (!PyArg_ParseTuple(args, "UO!O!LLLO!OUO!", &backend, &THPDtypeType, &a_dtype, &THPDtypeType,
                        &b_dtype, &a_dim, &b_dim, &device, &PyTuple_Type, &environment,
                        &generation, &op, &PyTuple_Type, &bounds))
    return nullptr;
  if (PyTuple_GET_SIZE(environment) != 3 || PyTuple_GET_SIZE(bounds) != 5) {
    PyErr_SetString(PyExc_ValueError, "remember: environment holds 3 values and bounds 5");
    return nullptr;
  }
  Op kind;
  if (PyUnicode_CompareWithASCIIString(op, "mm") == 0) {
    kind = MM;
  } else if (PyUnicode_CompareWithASCIIString(op, "matmul") == 0) {
    kind = MATMUL;
  } else {
    PyErr_Format(PyExc_ValueError, "remember: op is %R: expected 'mm' or 'matmul'", op);
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
  f.op = kind;
  f.a_elements = limits[0];
  f.b_elements = limits[1];
  f.m = limits[2];
  f.n = limits[3];
  f.k = limits[4];
  for (auto it = families.begin(); it != families.end(); ++it) {  // a family made again replaces
    if (it->a_type == f.a_type && it->b_type == f.b_type && it->a_dim == f.a_dim &&
        it->b_dim == f.b_dim && it->device == f.device && same_name(it->backend, backend)) {
      drop(*it);
      families.erase(it);
      break;
    }
  }
  if (families.size() >= LIMIT) clear();
  Py_INCREF(backend);
  f.backend = backend;
  for (int i = 0; i < 3; ++i) {
    PyObject* value = PyTuple_GET_ITEM(environment, i);
    f.environment[i] = value == Py_None ? nullptr : value;
    Py_XINCREF(f.environment[i]);
  }
  Py_INCREF(generation);
  f.generation = generation;
  families.push_back(f);
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

// (how many families are held, how many calls were served)
PyObject* stats(PyObject*, PyObject*) {
  return Py_BuildValue("(nK)", static_cast<Py_ssize_t>(families.size()), served_count);
}

PyMethodDef methods[] = {
    {"serve", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(serve)), METH_FASTCALL,
     "serve(A, B, C, options): D from a remembered family plan, else MISS (with C: the "
     "fallback's answer)"},
    {"remember", remember, METH_VARARGS, "remember a family plan served by torch's own op"},
    {"forget", forget, METH_NOARGS, "drop every family plan"},
    {"bind", bind, METH_VARARGS, "bind the fallback, MISS, the environment and the generation"},
    {"stats", stats, METH_NOARGS, "(families held, calls served)"},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastcall",
                      "The compiled front of a repeated plain matmul (see fastcall.py).", -1,
                      methods};

}  // namespace

PyMODINIT_FUNC PyInit__fastcall() {
  backend_word = PyUnicode_InternFromString("backend");
  auto_word = PyUnicode_InternFromString("auto");
  if (backend_word == nullptr || auto_word == nullptr) return nullptr;
  return PyModule_Create(&module);
}
