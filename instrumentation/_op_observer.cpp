// The per-op path below Python's dispatch: a global RecordFunction callback that notes, for
// every op a TorchDispatchMode would see, the bytes its tensors span, which of them the schema
// says it writes, and the stream current on its device; no Python frame runs per op.
//
// Which ops: the dispatcher fires RecordFunction on every call through it; a dispatch mode
// sees those that reach the Python key. Above it sit the autograd keys, where they are part
// of the call (a tensor argument has them and the thread does not exclude them, as inference
// mode does): there an op whose autograd kernel is CompositeImplicitAutograd is decomposed (the
// mode sees the ops it calls instead), and a few hand-written autograd kernels (`detach_`)
// finish the op without passing it on. An op called from inside a seen op's kernel never
// reaches the mode (it runs below the Python key), nor does one made where the thread
// excludes the Python key (`torch.tensor` makes its tensors so). `redispatch` fires nothing.
//
// What the callback costs is paid on every dispatcher call it fires on, nested ones too (inputs
// boxed, outputs copied). So while a seen op whose kernel calls other ops runs, RecordFunction is
// switched off on its thread (`prune`): those calls are never seen anyway, and they no longer
// fire at all. Switching costs a rebuild of torch's per-thread callback list each way, more
// than a leaf kernel's whole callback, so an op is pruned only once a nested call has been met
// under it; even so it cost more than it saved on the H200 micro loop, so it is asked for, not
// the default. Other RecordFunction users (the profiler) then also miss those nested calls.
#include <torch/extension.h>
#include <Python.h>
#include <ATen/record_function.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/Storage.h>
#include <c10/util/SmallVector.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

struct TensorNote {
  int64_t op;           // the op's number (drained ops keep theirs: numbers never restart)
  int32_t arg;          // argument position; outputs are numbered from 1000
  bool write;
  uintptr_t storage;    // the storage's data pointer: the address the bytes start at
  uintptr_t cdata;      // the StorageImpl (Python's `untyped_storage()._cdata`)
  int64_t sid;          // the registrar's id for the storage (-1 without a registrar)
  int64_t storage_nbytes;
  int64_t offset;       // storage offset, in elements
  c10::SmallVector<int64_t, 5> sizes;      // inline: no allocation per tensor
  c10::SmallVector<int64_t, 5> strides;
  int64_t itemsize;
  int8_t device_type;
  int8_t device_index;
};

struct Facts;

struct OpNote {
  const Facts* facts;   // its op's entry in `by_op` (never moved nor erased): the name
  uint64_t thread;
  int64_t stream;       // the stream current on the op's device (0 on the CPU)
  int8_t device_type;
  int8_t device_index;
  PyObject* stack;      // what the stack capture returned (owned), or null
};

struct Facts {
  bool known = false;
  bool decomposed_cpu = false, decomposed_cuda = false, decomposed_other = false;
  bool absorbed = false;          // an autograd kernel that does not pass the op on
  std::vector<bool> arg_written;
  std::string name;               // "aten::add_.Tensor"
  std::string op, overload;       // its two parts, as the schema spells them
  mutable std::atomic<bool> nests{false};   // its kernel has been seen calling other ops
};

std::mutex lock;
std::vector<OpNote> ops;
std::vector<TensorNote> tensors;
int64_t base = 0;            // the number of ops[0]
int64_t late = 0;            // outputs of ops drained while they ran (lost)
std::unordered_map<std::string, Facts> by_op;
at::CallbackHandle handle = 0;
PyObject* capture = nullptr;     // racecheck's stack capture, called as capture(limit, 1)
PyObject* capture_args[2] = {nullptr, nullptr};
// Storages registered in the callback, where they are first seen: a temporary may be born and
// die between two drains. `registrar(storage) -> id` is Python's (it also watches the storage
// die and then calls `forget`). Lock order: never the GIL while holding `lock` or `known_lock`.
PyObject* registrar = nullptr;
std::mutex known_lock;
std::unordered_map<uintptr_t, int64_t> known;   // StorageImpl -> id, while it lives
bool prune = false;          // switch RecordFunction off on a thread while a seen op runs
struct Open {
  int64_t op;           // its record, -1 unseen, -2 covered
  const Facts* seen;    // the seen op it is or lies under, else null
  bool switched_off;    // it switched RecordFunction off; its exit switches it back on
};
thread_local std::vector<Open> around;   // per open op on this thread
// Per thread, the schema's name string (stable while the op is registered) -> its facts: no
// string copied, hashed or locked per call. A hit is checked against the names, in case an op
// was removed and another's name took its address.
thread_local std::unordered_map<const char*, const Facts*> facts_by_name;

// Whether the autograd key's kernel for `backend` is CompositeImplicitAutograd's. The
// dispatcher says so only in its table dump ("AutogradCPU: registered at ... [math kernel]");
// read once per op.
bool decomposed(const std::string& table, const char* autograd_key) {
  const std::string head = std::string(autograd_key) + ": ";
  size_t at = table.rfind("\n" + head);
  if (at == std::string::npos) {
    if (table.compare(0, head.size(), head) != 0) return false;
    at = 0;
  }
  size_t end = table.find('\n', at + 1);
  std::string line = table.substr(at, end == std::string::npos ? std::string::npos : end - at);
  return line.find("[math kernel]") != std::string::npos;
}

// torch/csrc/autograd/VariableTypeManual.cpp: autograd kernels that return without a redispatch
bool absorbed_by_autograd(const std::string& name) {
  return name == "aten::detach_" || name == "aten::requires_grad_" ||
         name == "aten::retain_grad" || name == "aten::set_data" || name == "aten::_backward";
}

const Facts& facts(const c10::OperatorName& name) {
  std::string key = name.name + "." + name.overload_name;
  auto it = by_op.find(key);
  if (it != by_op.end()) return it->second;
  Facts& f = by_op.try_emplace(key).first->second;   // in place: Facts does not move
  f.name = key;
  f.op = name.name;
  f.overload = name.overload_name;
  auto h = c10::Dispatcher::singleton().findSchema(name);
  if (h) {
    f.known = true;
    const std::string table = h->dumpComputedTable();
    f.decomposed_cpu = decomposed(table, "AutogradCPU");
    f.decomposed_cuda = decomposed(table, "AutogradCUDA");
    f.decomposed_other = decomposed(table, "AutogradMeta");
    f.absorbed = absorbed_by_autograd(name.name);
    for (const auto& a : h->schema().arguments()) {
      const auto* ai = a.alias_info();
      f.arg_written.push_back(ai != nullptr && ai->isWrite());
    }
  }
  return f;
}

// f(tensor) for every defined tensor an argument holds (Tensor, Tensor[], Tensor?[]); stops
// early where f returns true, and says whether it did.
template <typename F>
bool each_tensor(const c10::IValue& v, F&& f) {
  if (v.isTensor()) {
    const auto& t = v.toTensor();
    return t.defined() && f(t);
  }
  if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorList())
      if (t.defined() && f(t)) return true;
  } else if (v.isList()) {                      // Tensor?[] (index, index_put_)
    for (const c10::IValue& e : v.toListRef())
      if (e.isTensor() && e.toTensor().defined() && f(e.toTensor())) return true;
  }
  return false;
}

// Whether the call passes through autograd keys: a tensor argument carries them and the thread
// does not exclude them.
bool through_autograd(c10::ArrayRef<const c10::IValue> in) {
  if (c10::impl::tls_local_dispatch_key_set().excluded_.has_all(c10::autograd_dispatch_keyset))
    return false;
  for (const auto& v : in)
    if (each_tensor(v, [](const at::Tensor& t) {
          return t.key_set().has_any(c10::autograd_dispatch_keyset);
        }))
      return true;
  return false;
}

// The device an op runs on: its first tensor's, else its `device` argument (a factory's), else
// the CPU.
c10::Device op_device(c10::ArrayRef<const c10::IValue> in) {
  c10::Device found(c10::DeviceType::CPU);
  for (const auto& v : in)
    if (each_tensor(v, [&](const at::Tensor& t) { found = t.device(); return true; }))
      return found;
  for (const auto& v : in)
    if (v.isDevice()) return v.toDevice();
  return c10::Device(c10::DeviceType::CPU);
}

int64_t sid_of(const c10::Storage& st) {
  if (registrar == nullptr) return -1;
  const auto key = reinterpret_cast<uintptr_t>(st.unsafeGetStorageImpl());
  {
    std::lock_guard<std::mutex> k(known_lock);
    auto it = known.find(key);
    if (it != known.end()) return it->second;
  }
  int64_t sid = -1;
  PyGILState_STATE gil = PyGILState_Ensure();
  PyObject* py = THPStorage_Wrap(st);
  if (py != nullptr) {
    PyObject* r = PyObject_CallOneArg(registrar, py);
    Py_DECREF(py);
    if (r != nullptr) {
      sid = PyLong_AsLongLong(r);
      Py_DECREF(r);
    }
  }
  if (PyErr_Occurred()) {
    PyErr_Clear();
    sid = -1;
  }
  PyGILState_Release(gil);
  if (sid >= 0) {
    std::lock_guard<std::mutex> k(known_lock);
    known[key] = sid;
  }
  return sid;
}

// A tensor's note (its op number set when it is kept); taken outside `lock`, since registering
// a storage calls Python.
void note_tensor(const at::Tensor& t, int32_t arg, bool write, std::vector<TensorNote>& out) {
  // a wrapped number (`x * 0.5`) reaches a dispatch mode as the Python number it was
  if (!t.has_storage() || t.unsafeGetTensorImpl()->is_wrapped_number()) return;
  const auto& st = t.storage();
  out.push_back({-1, arg, write, reinterpret_cast<uintptr_t>(st.data()),
                 reinterpret_cast<uintptr_t>(st.unsafeGetStorageImpl()), sid_of(st),
                 static_cast<int64_t>(st.nbytes()), t.storage_offset(),
                 c10::SmallVector<int64_t, 5>(t.sizes().begin(), t.sizes().end()),
                 c10::SmallVector<int64_t, 5>(t.strides().begin(), t.strides().end()),
                 static_cast<int64_t>(t.element_size()),
                 static_cast<int8_t>(t.device().type()),
                 static_cast<int8_t>(t.device().index())});
}

void note_value(const c10::IValue& v, int32_t arg, bool write, std::vector<TensorNote>& out) {
  each_tensor(v, [&](const at::Tensor& t) {
    note_tensor(t, arg, write, out);
    return false;
  });
}

void keep(std::vector<TensorNote>& notes, int64_t op) {    // under `lock`
  for (auto& n : notes) {
    n.op = op;
    tensors.push_back(std::move(n));
  }
}

int64_t current_stream(c10::Device device) {
  if (device.is_cpu() || !c10::impl::hasDeviceGuardImpl(device.type())) return 0;
  if (!device.has_index()) device = c10::impl::getDeviceGuardImpl(device.type())->getDevice();
  return c10::impl::getDeviceGuardImpl(device.type())->getStream(device).id();
}

std::unique_ptr<at::ObserverContext> on_enter(const at::RecordFunction& fn) {
  if (!around.empty() && around.back().op != -1) {  // inside a seen op: below the Python key
    const Facts* under = around.back().seen;
    under->nests.store(true, std::memory_order_relaxed);
    around.push_back({-2, under, false});
    return nullptr;
  }
  if (c10::impl::tls_is_dispatch_key_excluded(c10::DispatchKey::Python)) {
    around.push_back({-1, nullptr, false});
    return nullptr;
  }
  const Facts* found = nullptr;
  const char* op_name = fn.name();
  auto hit = facts_by_name.find(op_name);
  if (hit != facts_by_name.end() && hit->second->op == op_name &&
      hit->second->overload == fn.overload_name()) {
    found = hit->second;
  } else {
    auto name = fn.operator_name();      // none for a range named by a string, not an op
    if (!name) {
      around.push_back({-1, nullptr, false});
      return nullptr;
    }
    std::lock_guard<std::mutex> g(lock);
    found = &facts(*name);               // stays put: an unordered_map's elements never move
    facts_by_name[op_name] = found;
  }
  const Facts& w = *found;              // read-only once made: no lock needed
  auto in = fn.inputs();
  const c10::Device device = op_device(in);
  bool seen = w.known;
  if (seen && through_autograd(in)) {
    auto dev = device.type();
    bool dec = dev == c10::DeviceType::CPU ? w.decomposed_cpu
             : dev == c10::DeviceType::CUDA ? w.decomposed_cuda : w.decomposed_other;
    seen = !dec && !w.absorbed;
  }
  if (!seen) {
    around.push_back({-1, nullptr, false});
    return nullptr;
  }
  std::vector<TensorNote> notes;
  for (size_t i = 0; i < in.size(); i++)
    note_value(in[i], static_cast<int32_t>(i), i < w.arg_written.size() && w.arg_written[i],
               notes);
  PyObject* stack = nullptr;
  PyObject* capture_fn = capture;
  if (capture_fn != nullptr) {                 // the program's frames, as a dispatch mode's
    PyGILState_STATE gil = PyGILState_Ensure();  // entry would capture them
    stack = PyObject_Vectorcall(capture_fn, capture_args, 2, nullptr);
    if (stack == nullptr) PyErr_Clear();
    PyGILState_Release(gil);
  }
  std::unique_lock<std::mutex> g(lock);
  int64_t op = base + static_cast<int64_t>(ops.size());
  ops.push_back({&w, fn.threadId(), current_stream(device),
                 static_cast<int8_t>(device.type()), static_cast<int8_t>(device.index()),
                 stack});
  keep(notes, op);
  g.unlock();
  const bool off = prune && w.nests.load(std::memory_order_relaxed) &&
                   at::isRecordFunctionEnabled();
  if (off) at::enableRecordFunction(false);    // the guard's exit still runs (RAII, exceptions)
  around.push_back({op, &w, off});
  return nullptr;
}

void on_exit(const at::RecordFunction& fn, at::ObserverContext*) {
  if (around.empty()) return;
  const Open open = around.back();
  around.pop_back();
  if (open.switched_off) at::enableRecordFunction(true);
  const int64_t op = open.op;
  if (op < 0) return;
  std::vector<TensorNote> notes;
  const auto& out = fn.outputs();
  for (size_t i = 0; i < out.size(); i++)
    note_value(out[i], 1000 + static_cast<int32_t>(i), true, notes);
  std::lock_guard<std::mutex> g(lock);
  if (op < base) {
    late++;
    return;
  }
  keep(notes, op);
}

void start(pybind11::object capture_fn, int limit, pybind11::object registrar_fn,
           bool prune_nested) {
  if (handle != 0) return;
  prune = prune_nested;
  {
    std::lock_guard<std::mutex> k(known_lock);
    known.clear();
  }
  // The registrar, the capture function and its arguments are never released: a callback
  // still running on another thread when `stop` returns may be about to call them.
  registrar = registrar_fn.is_none() ? nullptr : registrar_fn.inc_ref().ptr();
  if (!capture_fn.is_none()) {
    capture_args[0] = PyLong_FromLong(limit);
    capture_args[1] = PyLong_FromLong(1);       // frame 1: the program's, no frame of ours
    capture = capture_fn.inc_ref().ptr();
  } else {
    capture = nullptr;
  }
  handle = at::addGlobalCallback(at::RecordFunctionCallback(on_enter, on_exit)
                                     .needsInputs(true)
                                     .needsOutputs(true)
                                     .scopes({at::RecordScope::FUNCTION}));
}

void stop() {
  if (handle == 0) return;
  at::removeCallback(handle);
  handle = 0;
  capture = nullptr;
  registrar = nullptr;
}

// A registered storage died (the registrar's weakref saw it): a new one at its address is new.
void forget(uintptr_t cdata) {
  std::lock_guard<std::mutex> k(known_lock);
  known.erase(cdata);
}

// How many ops have been noted so far: a storage that dies now died before op `position()`.
int64_t position() {
  std::lock_guard<std::mutex> g(lock);
  return base + static_cast<int64_t>(ops.size());
}

// The bytes a view spans, as racecheck's footprints have them (instrumentation/footprints.py,
// `strided_ranges`): merged [start, end) byte offsets into its storage, exact up to kMaxRuns
// runs, else the bounding interval (`approx`).
constexpr int64_t kMaxRuns = 4096;      // footprints.MAX_RUNS

struct ByteRanges {
  std::vector<std::pair<int64_t, int64_t>> spans;
  bool approx = false;
};

ByteRanges byte_ranges(int64_t offset, c10::ArrayRef<int64_t> sizes,
                       c10::ArrayRef<int64_t> strides, int64_t itemsize) {
  ByteRanges out;
  std::vector<std::pair<int64_t, int64_t>> dims;     // (size, stride) of the dims not of size 1
  for (size_t d = 0; d < sizes.size(); d++) {
    if (sizes[d] == 0) return out;
    if (sizes[d] != 1) dims.emplace_back(sizes[d], strides[d]);
  }
  int64_t lo = offset, hi = offset + 1;               // elements, the bounding interval
  std::vector<std::pair<int64_t, int64_t>> moving;   // (size, |stride|); broadcast dims repeat
  for (const auto& [size, stride] : dims) {
    (stride < 0 ? lo : hi) += (size - 1) * stride;
    if (stride != 0) moving.emplace_back(size, stride < 0 ? -stride : stride);
  }
  if (moving.empty()) {
    out.spans.emplace_back(offset * itemsize, (offset + 1) * itemsize);
    return out;
  }
  std::stable_sort(moving.begin(), moving.end(),
                   [](const auto& a, const auto& b) { return a.second < b.second; });
  int64_t run = 1;                    // the innermost dims that tile without gaps: one run
  size_t inner = 0;
  while (inner < moving.size() && moving[inner].second == run) run *= moving[inner++].first;
  int64_t runs = 1;
  for (size_t j = inner; j < moving.size() && runs <= kMaxRuns; j++) runs *= moving[j].first;
  if (runs > kMaxRuns) {
    out.spans.emplace_back(lo * itemsize, hi * itemsize);
    out.approx = true;
    return out;
  }
  std::vector<int64_t> starts{lo};
  for (size_t j = inner; j < moving.size(); j++) {
    std::vector<int64_t> next;
    next.reserve(starts.size() * moving[j].first);
    for (int64_t s : starts)
      for (int64_t k = 0; k < moving[j].first; k++) next.push_back(s + k * moving[j].second);
    starts.swap(next);
  }
  std::sort(starts.begin(), starts.end());
  for (int64_t s : starts) {
    const int64_t a = s * itemsize, b = (s + run) * itemsize;
    if (!out.spans.empty() && a <= out.spans.back().second)
      out.spans.back().second = std::max(out.spans.back().second, b);
    else
      out.spans.emplace_back(a, b);
  }
  return out;
}

pybind11::tuple ranges_tuple(const ByteRanges& r) {
  pybind11::tuple t(r.spans.size());
  for (size_t i = 0; i < r.spans.size(); i++)
    t[i] = pybind11::make_tuple(r.spans[i].first, r.spans[i].second);
  return t;
}

pybind11::tuple as_tuple(const c10::SmallVector<int64_t, 5>& v) {
  pybind11::tuple t(v.size());
  for (size_t i = 0; i < v.size(); i++) t[i] = pybind11::int_(v[i]);
  return t;
}

// Drops what was noted (the ops keep their numbers): what handing notes over costs, measured
// apart from noting them.
void discard() {
  std::vector<OpNote> got_ops;
  {
    std::lock_guard<std::mutex> g(lock);
    got_ops.swap(ops);
    tensors.clear();
    base += static_cast<int64_t>(got_ops.size());
  }
  for (auto& o : got_ops) Py_XDECREF(o.stack);
}

// (number, name, thread, stream, (device type, index), [(arg, write, storage, StorageImpl, id,
// storage bytes, offset, sizes, strides, itemsize, (device type, index), byte ranges, approx)],
// stack) per op seen since the last drain.
pybind11::list drain() {
  std::vector<OpNote> got_ops;
  std::vector<TensorNote> got_tensors;
  int64_t first;
  {
    std::lock_guard<std::mutex> g(lock);
    got_ops.swap(ops);
    got_tensors.swap(tensors);
    first = base;
    base += static_cast<int64_t>(got_ops.size());
  }
  std::vector<pybind11::list> per_op(got_ops.size());
  for (const auto& t : got_tensors) {
    const ByteRanges r = byte_ranges(t.offset, t.sizes, t.strides, t.itemsize);
    per_op[t.op - first].append(pybind11::make_tuple(
        t.arg, t.write, t.storage, t.cdata, t.sid, t.storage_nbytes, t.offset,
        as_tuple(t.sizes), as_tuple(t.strides),
        t.itemsize, pybind11::make_tuple(t.device_type, t.device_index), ranges_tuple(r),
        r.approx));
  }
  pybind11::list out;
  for (size_t i = 0; i < got_ops.size(); i++) {
    const auto& o = got_ops[i];
    pybind11::object stack = o.stack != nullptr
        ? pybind11::reinterpret_steal<pybind11::object>(o.stack) : pybind11::none();
    out.append(pybind11::make_tuple(first + static_cast<int64_t>(i), o.facts->name, o.thread,
                                    o.stream,
                                    pybind11::make_tuple(o.device_type, o.device_index),
                                    per_op[i], stack));
  }
  return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "Ops a dispatch mode would see, noted below Python's dispatch";
  m.def("start", &start, pybind11::arg("capture") = pybind11::none(),
        pybind11::arg("limit") = 6, pybind11::arg("registrar") = pybind11::none(),
        pybind11::arg("prune") = false);
  m.def("forget", &forget);
  m.def("position", &position);
  m.def("stop", &stop);
  m.def("drain", &drain);
  m.def("discard", &discard);
  m.def("byte_ranges", [](int64_t offset, std::vector<int64_t> sizes,
                          std::vector<int64_t> strides, int64_t itemsize) {
    if (sizes.size() != strides.size()) throw pybind11::value_error("sizes and strides differ");
    const ByteRanges r = byte_ranges(offset, sizes, strides, itemsize);
    return pybind11::make_tuple(ranges_tuple(r), r.approx);
  });
  m.def("active", [] { return handle != 0; });
  m.def("late", [] { return late; });
}
