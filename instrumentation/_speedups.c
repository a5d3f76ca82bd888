/* racecheck.instrumentation._speedups: the instrumentation's per-op hot path in C.

   Each function or type here is a port of Python that stays the reference (and the fallback
   where this module is not built, or RACECHECK_PURE_PYTHON=1); its comment names what it ports:
   stack capture (instrumentation/stacks.py), the plain-kernel plan (instrumentation/
   interceptor.py), whole-tensor footprints and storage registration (instrumentation/
   footprints.py), a device backend's stream lookups (instrumentation/device.py), Alloc emission
   (instrumentation/base.py) and the recorder's emit (racecheck/core/recorder.py).
   docs/ARCHITECTURE.md lists them. (The checker's own C is racecheck/core/_engine.c.)

   They work on the same Python objects as the Python code and call back into it for anything
   rare, so the rare paths have one implementation and the two can be compared on one trace. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <frameobject.h>
#include <structmember.h>
#include <stddef.h>

#if PY_VERSION_HEX >= 0x030B0000
#define HAVE_FRAME_API 1
#endif

/* ---- interned names ------------------------------------------------------------------------ */

static PyObject *s_ACTIVE, *s_mute, *s_new_event_id, *s_event, *s_graph, *s_graph_replay, *s_stream_id, *s_device_index, *s_device_type, *s_alloc_stream, *s_checking, *s_seq, *s_internal, *s_sync_kind, *s_target, *s_thread, *s_stream, *s_reads, *s_writes, *s_storage, *s_ranges, *s_born,
    *s_append, *s_capture_attr, *s_tid_attr, *s_before_launch, *s_host, *s_data_ptr, *s_dict,
    *s_pin_memory, *s_op, *s_stack, *s_thread_tid, *s_block, *s_dead,
    *s_busy, *s_flush_pending, *s_numel, *s_is_contiguous, *s_untyped_storage, *s_cdata,
    *s_element_size, *s_storage_offset, *s_is_view, *s_approx, *s_new_are_host, *s_host_of,
    *s_next, *s_by_cdata, *s_cdata_of, *s_host_sids, *s_nbytes, *s_on_new, *s_is_cpu,
    *s_get_device, *s_popleft, *s_current_stream_tid, *s_emit, *s_waiter, *s_waitee, *minus_one,
    *empty_tuple;

/* I: an attribute (or method, or global) read by name, declared beside the Python that defines
   it (racecheck.core.cnames; tests/test_cnames.py checks both sides). V: a string used as a value. */
static int intern_all(void) {
#define I(var, text) if (!(var = PyUnicode_InternFromString(text))) return -1
#define V(var, text) I(var, text)
    /* the sink (instrumentation/base.py Sink; racecheck/core/recorder.py Recorder) */
    I(s_checking, "checking"); I(s_seq, "seq"); I(s_emit, "emit");
    I(s_new_event_id, "new_event_id"); I(s_thread_tid, "thread_tid"); I(s_busy, "_busy");
    I(s_flush_pending, "flush_pending");
    /* thread state (recorder.py ThreadState; the device wrappers' instrumentation/device.py
       _WrapperState) */
    I(s_tid_attr, "tid"); I(s_capture_attr, "capture"); I(s_internal, "internal");
    I(s_alloc_stream, "alloc_stream"); I(s_mute, "mute");
    /* backends (base.py Backend; device.py's globals) */
    I(s_before_launch, "before_launch"); I(s_current_stream_tid, "current_stream_tid");
    I(s_ACTIVE, "_ACTIVE");
    /* the storage registry (instrumentation/footprints.py StorageRegistry) */
    I(s_next, "_next"); I(s_by_cdata, "_by_cdata"); I(s_cdata_of, "_cdata_of");
    I(s_host_sids, "host_sids"); I(s_dead, "dead"); I(s_on_new, "_on_new");
    I(s_new_are_host, "new_are_host"); I(s_host_of, "host_of");
    /* trace events and footprints (racecheck/core/trace.py, their __slots__) */
    I(s_thread, "thread"); I(s_stack, "stack"); I(s_stream, "stream"); I(s_reads, "reads");
    I(s_writes, "writes"); I(s_op, "op"); I(s_event, "event"); I(s_graph, "graph");
    I(s_sync_kind, "sync_kind"); I(s_target, "target"); I(s_waiter, "waiter");
    I(s_waitee, "waitee"); I(s_block, "block"); I(s_nbytes, "nbytes"); I(s_host, "host");
    I(s_storage, "storage"); I(s_ranges, "ranges"); I(s_approx, "approx"); I(s_born, "born");
    /* torch's tensors, storages and streams (declared in instrumentation/footprints.py and
       device.py, where the Python reads the same) */
    I(s_numel, "numel"); I(s_is_contiguous, "is_contiguous"); I(s_untyped_storage, "untyped_storage");
    I(s_element_size, "element_size"); I(s_storage_offset, "storage_offset");
    I(s_is_view, "_is_view"); I(s_data_ptr, "data_ptr"); I(s_get_device, "get_device");
    I(s_is_cpu, "is_cpu"); I(s_cdata, "_cdata"); I(s_stream_id, "stream_id");
    I(s_device_index, "device_index"); I(s_device_type, "device_type");
    /* builtins: the queues' deque methods, any object's __dict__ */
    I(s_append, "append"); I(s_popleft, "popleft"); I(s_dict, "__dict__");
    /* values: the op name a graph replay's launch hook gets, a keyword argument */
    V(s_graph_replay, "graph_replay"); V(s_pin_memory, "pin_memory");
#undef V
#undef I
    if (!(minus_one = PyLong_FromLong(-1)) || !(empty_tuple = PyTuple_New(0)))
        return -1;
    return 0;
}


/* ---- stacks -------------------------------------------------------------------------------- */

#ifdef HAVE_FRAME_API
static PyObject *st_internal;   /* filename -> bool (stacks._internal) */
static PyObject *st_offsets;    /* id(caller code) -> int (stacks._offsets) */
static PyObject *st_last;       /* (id(code), lasti) -> tuple (stacks._last) */
static PyObject *st_inside;     /* stacks._inside(code) -> bool, fills st_internal */
static Py_ssize_t st_last_limit = 4096;

static PyObject *stack_setup(PyObject *mod, PyObject *args) {
    PyObject *internal, *offsets, *last, *inside;
    Py_ssize_t limit;
    if (!PyArg_ParseTuple(args, "O!O!O!On", &PyDict_Type, &internal, &PyDict_Type, &offsets,
                          &PyDict_Type, &last, &inside, &limit))
        return NULL;
    Py_INCREF(internal); Py_XSETREF(st_internal, internal);
    Py_INCREF(offsets); Py_XSETREF(st_offsets, offsets);
    Py_INCREF(last); Py_XSETREF(st_last, last);
    Py_INCREF(inside); Py_XSETREF(st_inside, inside);
    st_last_limit = limit;
    Py_RETURN_NONE;
}

/* 1: racecheck/torch/plumbing, 0: the program's code, -1: error */
static int code_inside(PyCodeObject *code) {
    PyObject *v = PyDict_GetItemWithError(st_internal, code->co_filename);
    if (v != NULL)
        return PyObject_IsTrue(v);
    if (PyErr_Occurred())
        return -1;
    PyObject *r = PyObject_CallOneArg(st_inside, (PyObject *)code);
    if (r == NULL)
        return -1;
    int t = PyObject_IsTrue(r);
    Py_DECREF(r);
    return t;
}

static int frame_inside(PyFrameObject *f) {
    PyCodeObject *code = PyFrame_GetCode(f);
    int t = code_inside(code);
    Py_DECREF(code);
    return t;
}

/* The frame n levels out from the Python frame that called us (0: that frame); a new
   reference, or NULL without an error when the stack is shallower. */
static PyFrameObject *frame_at(Py_ssize_t n) {
    PyFrameObject *f = PyEval_GetFrame();
    if (f == NULL)
        return NULL;
    Py_INCREF(f);
    while (n-- > 0 && f != NULL) {
        PyFrameObject *b = PyFrame_GetBack(f);
        Py_DECREF(f);
        f = b;
    }
    return f;
}

static PyObject *frame_entry(PyFrameObject *f) {
    PyCodeObject *code = PyFrame_GetCode(f);
    PyObject *lasti = PyLong_FromLong(PyFrame_GetLasti(f));
    if (lasti == NULL) {
        Py_DECREF(code);
        return NULL;
    }
    PyObject *t = PyTuple_New(2);
    if (t == NULL) {
        Py_DECREF(code);
        Py_DECREF(lasti);
        return NULL;
    }
    PyTuple_SET_ITEM(t, 0, (PyObject *)code);
    PyTuple_SET_ITEM(t, 1, lasti);
    return t;
}

/* Advance *pf (owned) to the next user frame at or after it; 0 ok, -1 error. */
static int to_user(PyFrameObject **pf) {
    while (*pf != NULL) {
        int in = frame_inside(*pf);
        if (in < 0)
            return -1;
        if (!in)
            return 0;
        PyFrameObject *b = PyFrame_GetBack(*pf);
        Py_DECREF(*pf);
        *pf = b;
    }
    return 0;
}

static PyObject *slice_or_self(PyObject *prev, Py_ssize_t k) {
    if (PyTuple_GET_SIZE(prev) == k) {
        Py_INCREF(prev);
        return prev;
    }
    return PyTuple_GetSlice(prev, 0, k);
}

/* stacks._walk: up to `limit` user frames from the user frame f (borrowed) outwards. */
static PyObject *walk(PyFrameObject *f0, Py_ssize_t limit) {
    PyCodeObject *code = PyFrame_GetCode(f0);
    int lasti = PyFrame_GetLasti(f0);
    PyObject *out = NULL, *result = NULL, *site = NULL;
    PyFrameObject *f = NULL;
    PyObject *cid = PyLong_FromVoidPtr(code), *li = cid ? PyLong_FromLong(lasti) : NULL;
    if (li != NULL && (site = PyTuple_New(2)) != NULL) {
        PyTuple_SET_ITEM(site, 0, cid);
        PyTuple_SET_ITEM(site, 1, li);
    } else {
        Py_XDECREF(cid);
        Py_XDECREF(li);
    }
    if (site == NULL)
        goto done;
    PyObject *prev = PyDict_GetItemWithError(st_last, site);
    if (prev == NULL && PyErr_Occurred())
        goto done;
    Py_INCREF(f0);
    f = f0;
    if (prev != NULL && PyTuple_Check(prev) && PyTuple_GET_SIZE(prev) > 0 &&
        PyTuple_GET_ITEM(PyTuple_GET_ITEM(prev, 0), 0) == (PyObject *)code) {
        Py_INCREF(prev);
        Py_ssize_t n = PyTuple_GET_SIZE(prev), k = 1;
        if (k == limit) {
            result = PyTuple_GetSlice(prev, 0, 1);
            Py_DECREF(prev);
            goto done;
        }
        PyFrameObject *b = PyFrame_GetBack(f);
        Py_DECREF(f);
        f = b;
        for (;;) {
            if (to_user(&f) < 0) {
                Py_DECREF(prev);
                goto done;
            }
            if (f == NULL) {
                if (k == n) {
                    result = prev;
                    goto done;
                }
                break;
            }
            if (k == n)
                break;
            PyObject *pk = PyTuple_GET_ITEM(prev, k);
            PyCodeObject *fc = PyFrame_GetCode(f);
            int same = (PyObject *)fc == PyTuple_GET_ITEM(pk, 0) &&
                       PyLong_AsLong(PyTuple_GET_ITEM(pk, 1)) == PyFrame_GetLasti(f);
            Py_DECREF(fc);
            if (!same)
                break;
            k++;
            if (k == limit) {
                result = slice_or_self(prev, k);
                Py_DECREF(prev);
                goto done;
            }
            b = PyFrame_GetBack(f);
            Py_DECREF(f);
            f = b;
        }
        out = PyList_New(0);
        for (Py_ssize_t j = 0; out != NULL && j < k; j++) {
            if (PyList_Append(out, PyTuple_GET_ITEM(prev, j)) < 0)
                Py_CLEAR(out);
        }
        Py_DECREF(prev);
    } else {
        out = PyList_New(0);
    }
    if (out == NULL)
        goto done;
    while (f != NULL) {
        int in = frame_inside(f);
        if (in < 0)
            goto done;
        if (!in) {
            PyObject *e = frame_entry(f);
            if (e == NULL || PyList_Append(out, e) < 0) {
                Py_XDECREF(e);
                goto done;
            }
            Py_DECREF(e);
            if (PyList_GET_SIZE(out) >= limit)
                break;
        }
        PyFrameObject *b = PyFrame_GetBack(f);
        Py_DECREF(f);
        f = b;
    }
    result = PyList_AsTuple(out);
    if (result == NULL)
        goto done;
    if (PyDict_GET_SIZE(st_last) >= st_last_limit)
        PyDict_Clear(st_last);
    if (PyDict_SetItem(st_last, site, result) < 0)
        Py_CLEAR(result);
done:
    Py_XDECREF(f);
    Py_XDECREF(out);
    Py_XDECREF(site);
    Py_DECREF(code);
    return result;
}

/* stacks.capture: innermost-first user frames as (code, lasti) pairs. `skip` counts as in the
   Python version, whose own frame is number 0 (here: the caller is frame 1). */
static PyObject *capture_impl(Py_ssize_t limit, Py_ssize_t skip);

static PyObject *capture(PyObject *mod, PyObject *const *args, Py_ssize_t nargs,
                         PyObject *kwnames) {
    Py_ssize_t limit = 6, skip = 2;
    Py_ssize_t npos = nargs;
    if (npos > 2 || st_internal == NULL) {
        PyErr_SetString(PyExc_TypeError, "capture(limit=6, skip=2), after stack_setup");
        return NULL;
    }
    if (npos > 0 && (limit = PyLong_AsSsize_t(args[0])) == -1 && PyErr_Occurred())
        return NULL;
    if (npos > 1 && (skip = PyLong_AsSsize_t(args[1])) == -1 && PyErr_Occurred())
        return NULL;
    if (kwnames != NULL) {
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(kwnames); i++) {
            PyObject *k = PyTuple_GET_ITEM(kwnames, i);
            Py_ssize_t v = PyLong_AsSsize_t(args[nargs + i]);
            if (v == -1 && PyErr_Occurred())
                return NULL;
            if (PyUnicode_CompareWithASCIIString(k, "limit") == 0)
                limit = v;
            else if (PyUnicode_CompareWithASCIIString(k, "skip") == 0)
                skip = v;
            else {
                PyErr_Format(PyExc_TypeError, "capture() got an unexpected keyword %R", k);
                return NULL;
            }
        }
    }
    return capture_impl(limit, skip);
}

static PyObject *capture_impl(Py_ssize_t limit, Py_ssize_t skip) {
    PyFrameObject *caller = PyEval_GetFrame();
    if (caller == NULL)
        return PyTuple_New(0);
    PyCodeObject *ccode = PyFrame_GetCode(caller);
    PyObject *key = PyLong_FromVoidPtr(ccode);
    Py_DECREF(ccode);
    if (key == NULL)
        return NULL;
    PyObject *off_obj = PyDict_GetItemWithError(st_offsets, key);
    if (off_obj == NULL && PyErr_Occurred()) {
        Py_DECREF(key);
        return NULL;
    }
    if (off_obj != NULL) {
        Py_ssize_t off = PyLong_AsSsize_t(off_obj);
        PyFrameObject *f = NULL;
        if (off) {
            PyFrameObject *below = frame_at(skip + off - 2);
            if (below != NULL) {
                int in = frame_inside(below);
                if (in < 0) {
                    Py_DECREF(below);
                    Py_DECREF(key);
                    return NULL;
                }
                if (in)
                    f = PyFrame_GetBack(below);
                Py_DECREF(below);
            }
        } else {
            f = frame_at(skip - 1);
        }
        if (f != NULL) {
            int in = frame_inside(f);
            if (in < 0) {
                Py_DECREF(f);
                Py_DECREF(key);
                return NULL;
            }
            if (!in) {
                Py_DECREF(key);
                PyObject *r = walk(f, limit);
                Py_DECREF(f);
                return r;
            }
            Py_DECREF(f);
        }
    }
    /* the first user frame from skip on, its distance learned for this caller; the frames
       from it on go through walk() (and its cache of the stack last seen at that site) */
    PyFrameObject *f = frame_at(skip - 1);
    Py_ssize_t depth = 0;
    while (f != NULL) {
        int in = frame_inside(f);
        if (in < 0) {
            Py_DECREF(f);
            Py_DECREF(key);
            return NULL;
        }
        if (!in)
            break;
        PyFrameObject *b = PyFrame_GetBack(f);
        Py_DECREF(f);
        f = b;
        depth++;
    }
    if (f == NULL) {
        Py_DECREF(key);
        return PyTuple_New(0);
    }
    PyObject *v = PyLong_FromSsize_t(depth);
    int rc = v == NULL ? -1 : PyDict_SetItem(st_offsets, key, v);
    Py_XDECREF(v);
    Py_DECREF(key);
    PyObject *result = rc < 0 ? NULL : walk(f, limit);
    Py_DECREF(f);
    return result;
}
#endif /* HAVE_FRAME_API */

/* ---- helpers ------------------------------------------------------------------------------ */

/* d.pop(key, None): 1 and a new reference in *out, 0 (absent, *out NULL), -1 error */
static int dict_pop(PyObject *d, PyObject *key, PyObject **out) {
    *out = NULL;
    PyObject *v = PyDict_GetItemWithError(d, key);
    if (v == NULL)
        return PyErr_Occurred() ? -1 : 0;
    Py_INCREF(v);
    if (PyDict_DelItem(d, key) < 0) {
        Py_DECREF(v);
        return -1;
    }
    *out = v;
    return 1;
}

/* torch's own methods of a tensor (or storage) type, called without looking their names up:
   per type, the C method descriptors its attribute lookup finds, kept while the type's version
   tag says nothing in its hierarchy was reassigned (a patched method is a Python function: that
   type is not cached and takes the named call). An instance attribute that shadows a torch
   method by name is not looked at. */
enum { M_NUMEL, M_IS_CONTIGUOUS, M_UNTYPED_STORAGE, M_ELEMENT_SIZE, M_STORAGE_OFFSET, M_IS_VIEW,
       M_DATA_PTR, M_GET_DEVICE, M_NBYTES, M_COUNT };
#define MCACHE_TYPES 4

typedef struct {
    PyTypeObject *type[MCACHE_TYPES];       /* strong references */
    unsigned int version[MCACHE_TYPES];
    PyObject *descr[MCACHE_TYPES][M_COUNT]; /* strong references; NULL: not a C method there */
} MethodCache;

static MethodCache mcache;

static PyObject *method_name(int m) {
    switch (m) {
    case M_NUMEL: return s_numel;
    case M_IS_CONTIGUOUS: return s_is_contiguous;
    case M_UNTYPED_STORAGE: return s_untyped_storage;
    case M_ELEMENT_SIZE: return s_element_size;
    case M_STORAGE_OFFSET: return s_storage_offset;
    case M_IS_VIEW: return s_is_view;
    case M_DATA_PTR: return s_data_ptr;
    case M_GET_DEVICE: return s_get_device;
    default: return s_nbytes;
    }
}

/* the slot of tp in the cache, filled or refreshed; -1 where the type has no valid version tag */
static int mcache_slot(PyTypeObject *tp) {
    if (!PyType_HasFeature(tp, Py_TPFLAGS_VALID_VERSION_TAG) || tp->tp_version_tag == 0)
        return -1;
    int free_slot = -1;
    for (int i = 0; i < MCACHE_TYPES; i++) {
        if (mcache.type[i] == tp) {
            if (mcache.version[i] == tp->tp_version_tag)
                return i;
            free_slot = i;
            break;
        }
        if (mcache.type[i] == NULL && free_slot < 0)
            free_slot = i;
    }
    if (free_slot < 0)
        return -1;
    int i = free_slot;
    for (int m = 0; m < M_COUNT; m++) {
        PyObject *d = _PyType_Lookup(tp, method_name(m));
        if (d != NULL && Py_TYPE(d) != &PyMethodDescr_Type)
            d = NULL;
        Py_XINCREF(d);
        Py_XSETREF(mcache.descr[i][m], d);
    }
    if (mcache.type[i] != tp) {
        Py_INCREF(tp);
        Py_XSETREF(mcache.type[i], tp);
    }
    mcache.version[i] = tp->tp_version_tag;
    return i;
}

/* obj.<method m>() */
static PyObject *mcall(PyObject *obj, int m) {
    int i = mcache_slot(Py_TYPE(obj));
    PyObject *d = i < 0 ? NULL : mcache.descr[i][m];
    if (d != NULL)
        return PyObject_Vectorcall(d, &obj, 1, NULL);
    return PyObject_CallMethodNoArgs(obj, method_name(m));
}

/* traverse, clear and dealloc of a GC type whose references are the fields FIELDS(X) names */
#define GC_VISIT_(f) Py_VISIT(o->f);
#define GC_CLEAR_(f) Py_CLEAR(o->f);
#define GC_METHODS(prefix, Type, FIELDS)                                                      \
    static int prefix##_traverse(Type *o, visitproc visit, void *arg) {                       \
        FIELDS(GC_VISIT_)                                                                     \
        return 0;                                                                             \
    }                                                                                         \
    static int prefix##_clear(Type *o) {                                                      \
        FIELDS(GC_CLEAR_)                                                                     \
        return 0;                                                                             \
    }                                                                                         \
    static void prefix##_dealloc(Type *o) {                                                   \
        PyObject_GC_UnTrack(o);                                                               \
        prefix##_clear(o);                                                                    \
        Py_TYPE(o)->tp_free((PyObject *)o);                                                   \
    }

/* ---- the recorder's emit ------------------------------------------------------------------- */

/* Recorder.emit's common case (nothing unresolved, no liveness poll): report storage deaths,
   append to the queue, hand a batch to the checker at a host sync (or a full queue); anything
   else calls the Python emit. */
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *recorder, *pending, *slow, *dead, *tls, *free_type, *sync_type;
    PyObject *append, *popleft;     /* pending.append, dead.popleft */
    Py_ssize_t batch, cap;
    int divert;     /* something unresolved or a liveness poll: every event takes the slow emit */
} Emitter;

#define EM_FIELDS(X) X(recorder) X(pending) X(slow) X(dead) X(tls) X(free_type) X(sync_type)     \
    X(append) X(popleft)
GC_METHODS(em, Emitter, EM_FIELDS)

/* The host timeline of the calling thread: tls.tid, else sink.thread_tid() (new reference) */
static PyObject *thread_of(PyObject *tls, PyObject *sink) {
    PyObject *t = PyObject_GetAttr(tls, s_tid_attr);
    if (t == NULL || t != Py_None)
        return t;
    Py_DECREF(t);
    return PyObject_CallMethodNoArgs(sink, s_thread_tid);
}

/* Where a slots class keeps its attributes: offsets read from its member descriptors once. */
typedef struct {
    PyTypeObject *type;         /* the class the offsets are for (NULL: not computed yet) */
    int ok;                     /* every attribute is a plain writable slot */
    Py_ssize_t off[8];
} Layout;

static void layout_compute(Layout *L, PyTypeObject *tp, PyObject *const *names, int n) {
    L->type = tp;
    L->ok = n <= 8;
    for (int i = 0; L->ok && i < n; i++) {
        PyObject *d = PyObject_GetAttr((PyObject *)tp, names[i]);
        if (d == NULL) {
            PyErr_Clear();
            L->ok = 0;
            break;
        }
        if (Py_TYPE(d) == &PyMemberDescr_Type &&
            ((PyMemberDescrObject *)d)->d_member->type == T_OBJECT_EX &&
            !(((PyMemberDescrObject *)d)->d_member->flags & READONLY))
            L->off[i] = ((PyMemberDescrObject *)d)->d_member->offset;
        else
            L->ok = 0;
        Py_DECREF(d);
    }
}

#define SLOT(o, off) (*(PyObject **)((char *)(o) + (off)))

/* A new object of a slots class without running __init__ (events, footprints): attributes stored
   straight into their slots where the class has them (else set one by one). The object holds
   only immutable data (ids, strings, tuples of footprints, stacks), never itself or a container
   that could lead back to it, so the cyclic collector is told not to track it. */
static PyObject *new_event(Layout *L, PyObject *type, PyObject *const *names,
                           PyObject *const *values, int n) {
    PyTypeObject *tp = (PyTypeObject *)type;
    if (L->type != tp)
        layout_compute(L, tp, names, n);
    PyObject *ev = tp->tp_new(tp, empty_tuple, NULL);
    if (ev == NULL)
        return NULL;
    if (L->ok) {
        for (int i = 0; i < n; i++) {
            Py_INCREF(values[i]);
            Py_XSETREF(SLOT(ev, L->off[i]), values[i]);
        }
        if (PyObject_GC_IsTracked(ev))
            PyObject_GC_UnTrack(ev);
        return ev;
    }
    for (int i = 0; i < n; i++) {
        if (PyObject_SetAttr(ev, names[i], values[i]) < 0) {
            Py_DECREF(ev);
            return NULL;
        }
    }
    return ev;
}

/* Recorder._drain_dead without a liveness poll: a Free for each storage that died */
static int drain_dead(Emitter *e) {
    PyObject *thread = thread_of(e->tls, e->recorder);
    if (thread == NULL)
        return -1;
    int rc = 0;
    while (rc == 0) {
        Py_ssize_t n = PyObject_Length(e->dead);
        if (n < 0) {
            rc = -1;
            break;
        }
        if (n == 0)
            break;
        PyObject *item = PyObject_CallNoArgs(e->popleft);
        if (item == NULL || !PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2) {
            if (item != NULL)
                PyErr_SetString(PyExc_TypeError, "dead: (sid, stack) pairs");
            Py_XDECREF(item);
            rc = -1;
            break;
        }
        PyObject *names[3] = {s_thread, s_block, s_stack};
        PyObject *values[3] = {thread, PyTuple_GET_ITEM(item, 0), PyTuple_GET_ITEM(item, 1)};
        static Layout L;
        PyObject *ev = new_event(&L, e->free_type, names, values, 3);
        Py_DECREF(item);
        PyObject *r = ev ? PyObject_CallOneArg(e->append, ev) : NULL;
        Py_XDECREF(ev);
        if (r == NULL)
            rc = -1;
        Py_XDECREF(r);
    }
    Py_DECREF(thread);
    return rc;
}

static int attr_true(PyObject *obj, PyObject *name) {
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v == NULL)
        return -1;
    int t = PyObject_IsTrue(v);
    Py_DECREF(v);
    return t;
}

static PyObject *em_emit(Emitter *e, PyObject *ev) {
    if (e->divert)
        return PyObject_Vectorcall(e->slow, &ev, 1, NULL);
    Py_ssize_t nd = PyObject_Length(e->dead);
    if (nd < 0 || (nd > 0 && drain_dead(e) < 0))
        return NULL;
    PyObject *r = PyObject_CallOneArg(e->append, ev);
    if (r == NULL)
        return NULL;
    Py_DECREF(r);
    Py_ssize_t n = PyObject_Length(e->pending);
    if (n < 0)
        return NULL;
    if (n >= e->cap || (n >= e->batch && (PyObject *)Py_TYPE(ev) == e->sync_type)) {
        int busy = attr_true(e->recorder, s_busy);
        if (busy < 0)
            return NULL;
        if (!busy) {
            r = PyObject_CallMethodNoArgs(e->recorder, s_flush_pending);
            if (r == NULL)
                return NULL;
            Py_DECREF(r);
        }
    }
    Py_RETURN_NONE;
}

static PyObject *em_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf,
                               PyObject *kwnames) {
    if (PyVectorcall_NARGS(nargsf) != 1 || kwnames != NULL) {
        PyErr_SetString(PyExc_TypeError, "emit(event)");
        return NULL;
    }
    return em_emit((Emitter *)self, args[0]);
}

static PyObject *em_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *recorder, *pending, *slow, *dead, *tls, *free_type, *sync_type;
    Py_ssize_t batch, cap;
    if (!PyArg_ParseTuple(args, "OOnnO!OOOO!:Emitter", &recorder, &pending, &batch, &cap,
                          &PyType_Type, &sync_type, &slow, &dead, &tls, &PyType_Type, &free_type))
        return NULL;
    Emitter *e = (Emitter *)type->tp_alloc(type, 0);
    if (e == NULL)
        return NULL;
    Py_INCREF(recorder); e->recorder = recorder;
    Py_INCREF(pending); e->pending = pending;
    Py_INCREF(slow); e->slow = slow;
    Py_INCREF(dead); e->dead = dead;
    Py_INCREF(tls); e->tls = tls;
    Py_INCREF(free_type); e->free_type = free_type;
    Py_INCREF(sync_type); e->sync_type = sync_type;
    e->batch = batch;
    e->cap = cap;
    e->vectorcall = em_vectorcall;
    if (!(e->append = PyObject_GetAttr(pending, s_append)) ||
        !(e->popleft = PyObject_GetAttr(dead, s_popleft))) {
        Py_DECREF(e);
        return NULL;
    }
    return (PyObject *)e;
}

static PyMemberDef em_members[] = {
    {"divert", T_INT, offsetof(Emitter, divert), 0,
     "nonzero: every event goes to the slow emit (the recorder sets it)"},
    {NULL},
};

static PyTypeObject EmitterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "racecheck.instrumentation._speedups.Emitter",
    .tp_members = em_members,
    .tp_basicsize = sizeof(Emitter),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "Emitter(recorder, pending, batch, cap, HostSync, slow_emit, dead, tls, Free): "
              "Recorder.emit's common case in C",
    .tp_new = em_new,
    .tp_dealloc = (destructor)em_dealloc,
    .tp_traverse = (traverseproc)em_traverse,
    .tp_clear = (inquiry)em_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(Emitter, vectorcall),
};

/* emit(ev) through the sink's emit: in C where it is the Emitter */
static PyObject *emit_to(PyObject *emit, PyObject *ev) {
    return Py_TYPE(emit) == &EmitterType ? em_emit((Emitter *)emit, ev) : PyObject_CallOneArg(emit, ev);
}


/* While a C plan registers its op's outputs on this thread (borrowed; NULL otherwise): the op's
   stream, where the allocator took their memory from (Interceptor._outputs), and the issuing
   host timeline. */
static _Thread_local PyObject *alloc_stream = NULL, *alloc_thread = NULL;

/* Backend._on_new_storage: AllocEmitter(sink, tls, backend, Alloc)(sid, nbytes, host) */
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *sink, *tls, *backend, *alloc_type, *emit;   /* emit: sink.emit, bound once as plans do */
} AllocEmitter;

#define AE_FIELDS(X) X(sink) X(tls) X(backend) X(alloc_type) X(emit)
GC_METHODS(ae, AllocEmitter, AE_FIELDS)

static PyObject *ae_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf,
                               PyObject *kwnames) {
    AllocEmitter *a = (AllocEmitter *)self;
    if (PyVectorcall_NARGS(nargsf) != 3 || kwnames != NULL) {
        PyErr_SetString(PyExc_TypeError, "on_new(sid, nbytes, host)");
        return NULL;
    }
    PyObject *thread = alloc_thread;
    if (thread != NULL)
        Py_INCREF(thread);
    else if ((thread = thread_of(a->tls, a->sink)) == NULL)
        return NULL;
    PyObject *stream = alloc_stream;
    if (stream != NULL)
        Py_INCREF(stream);
    else {
        /* Backend._on_new_storage: tls.alloc_stream (a Python plan registering an op's outputs),
           else the current stream */
        stream = PyObject_GetAttr(a->tls, s_alloc_stream);
        if (stream == Py_None) {
            Py_DECREF(stream);
            stream = PyObject_CallMethodNoArgs(a->backend, s_current_stream_tid);
        }
    }
    if (stream == NULL) {
        Py_DECREF(thread);
        return NULL;
    }
    PyObject *names[6] = {s_thread, s_block, s_stream, s_nbytes, s_host, s_stack};
    PyObject *values[6] = {thread, args[0], stream, args[1], args[2], empty_tuple};
    static Layout L;
    PyObject *ev = new_event(&L, a->alloc_type, names, values, 6);
    Py_DECREF(thread);
    Py_DECREF(stream);
    if (ev == NULL)
        return NULL;
    PyObject *r = emit_to(a->emit, ev);
    Py_DECREF(ev);
    return r;
}

static PyObject *ae_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *sink, *tls, *backend, *alloc_type;
    if (!PyArg_ParseTuple(args, "OOOO!:AllocEmitter", &sink, &tls, &backend, &PyType_Type,
                          &alloc_type))
        return NULL;
    AllocEmitter *a = (AllocEmitter *)type->tp_alloc(type, 0);
    if (a == NULL)
        return NULL;
    Py_INCREF(sink); a->sink = sink;
    Py_INCREF(tls); a->tls = tls;
    Py_INCREF(backend); a->backend = backend;
    Py_INCREF(alloc_type); a->alloc_type = alloc_type;
    if (!(a->emit = PyObject_GetAttr(sink, s_emit))) {
        Py_DECREF(a);
        return NULL;
    }
    a->vectorcall = ae_vectorcall;
    return (PyObject *)a;
}

static PyTypeObject AllocEmitterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "racecheck.instrumentation._speedups.AllocEmitter",
    .tp_basicsize = sizeof(AllocEmitter),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "AllocEmitter(sink, tls, backend, Alloc): Backend._on_new_storage in C",
    .tp_new = ae_new,
    .tp_dealloc = (destructor)ae_dealloc,
    .tp_traverse = (traverseproc)ae_traverse,
    .tp_clear = (inquiry)ae_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(AllocEmitter, vectorcall),
};

/* ---- the storage registry (instrumentation/footprints.py StorageRegistry) ------------------- */
#ifdef HAVE_FRAME_API

#define FREE_FRAMES 4

/* The weakref callback of one registered storage: StorageRegistry.register's _died. */
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *key, *sid, *by_cdata, *cdata_of, *host_sids, *dead;
} DeathWatch;

#define DW_FIELDS(X) X(key) X(sid) X(by_cdata) X(cdata_of) X(host_sids) X(dead)
GC_METHODS(dw, DeathWatch, DW_FIELDS)

/* Where the last reference went (the `del`, the rebinding, the return that dropped the
   tensor): one frame when it is the program's, else the program's frames around it. */
static PyObject *drop_stack(void) {
    PyFrameObject *f = PyEval_GetFrame();
    if (f == NULL)
        return PyTuple_New(0);
    PyCodeObject *code = PyFrame_GetCode(f);
    PyObject *v = PyDict_GetItemWithError(st_internal, code->co_filename);
    Py_DECREF(code);
    if (v == NULL && PyErr_Occurred())
        return NULL;
    if (v == Py_False) {
        PyObject *e = frame_entry(f);
        if (e == NULL)
            return NULL;
        PyObject *t = PyTuple_Pack(1, e);
        Py_DECREF(e);
        return t;
    }
    return capture_impl(FREE_FRAMES, 1);
}

static PyObject *dw_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf,
                               PyObject *kwnames) {
    DeathWatch *w = (DeathWatch *)self;
    PyObject *cur = PyDict_GetItemWithError(w->by_cdata, w->key);
    if (cur == NULL && PyErr_Occurred())
        return NULL;
    if (cur != NULL && PyTuple_Check(cur) && PyTuple_GET_SIZE(cur) > 0) {
        int same = PyObject_RichCompareBool(PyTuple_GET_ITEM(cur, 0), w->sid, Py_EQ);
        if (same < 0 || (same && PyDict_DelItem(w->by_cdata, w->key) < 0))
            return NULL;
    }
    PyObject *gone = NULL;
    if (dict_pop(w->cdata_of, w->sid, &gone) < 0)
        return NULL;
    Py_XDECREF(gone);
    if (PySet_Discard(w->host_sids, w->sid) < 0)
        return NULL;
    PyObject *stack = drop_stack();
    if (stack == NULL)
        return NULL;
    PyObject *item = PyTuple_Pack(2, w->sid, stack);
    Py_DECREF(stack);
    if (item == NULL)
        return NULL;
    PyObject *r = PyObject_CallOneArg(w->dead, item);     /* registry.dead.append */
    Py_DECREF(item);
    if (r == NULL)
        return NULL;
    Py_DECREF(r);
    Py_RETURN_NONE;
}

static PyTypeObject DeathWatchType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "racecheck.instrumentation._speedups.DeathWatch",
    .tp_basicsize = sizeof(DeathWatch),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "A registered storage's weakref callback (StorageRegistry.register's _died)",
    .tp_dealloc = (destructor)dw_dealloc,
    .tp_traverse = (traverseproc)dw_traverse,
    .tp_clear = (inquiry)dw_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(DeathWatch, vectorcall),
};

/* StorageRegistry.register, bound to one registry: Registrar(registry)(t, st, host=False) ->
   (sid, host). The registry's containers are looked up once; its id counter lives here. */
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *reg, *by_cdata, *cdata_of, *host_sids, *dead, *on_new;
    long long next;
} Registrar;

#define RG_FIELDS(X) X(reg) X(by_cdata) X(cdata_of) X(host_sids) X(dead) X(on_new)
GC_METHODS(rg, Registrar, RG_FIELDS)

/* key: st._cdata where the caller has read it (borrowed), else NULL */
static PyObject *rg_register(Registrar *r, PyObject *t, PyObject *st, int host, PyObject *key) {
    PyObject *sid = NULL, *ref = NULL, *entry = NULL, *nbytes = NULL, *result = NULL;
    DeathWatch *w = NULL;
    if (key != NULL)
        Py_INCREF(key);
    else if (!(key = PyObject_GetAttr(st, s_cdata)))
        goto done;
    if (!host) {
        host = attr_true(r->reg, s_new_are_host);
        if (host < 0)
            goto done;
    }
    if (!host) {
        PyObject *host_of = PyObject_GetAttr(r->reg, s_host_of);
        if (host_of == NULL)
            goto done;
        if (host_of != Py_None) {
            PyObject *v = PyObject_CallOneArg(host_of, t);
            host = v ? PyObject_IsTrue(v) : -1;
            Py_XDECREF(v);
        }
        Py_DECREF(host_of);
        if (host < 0)
            goto done;
    }
    if (!(sid = PyLong_FromLongLong(r->next)))
        goto done;
    r->next++;
    if (!(w = PyObject_GC_New(DeathWatch, &DeathWatchType)))
        goto done;
    w->vectorcall = dw_vectorcall;
    Py_INCREF(key); w->key = key;
    Py_INCREF(sid); w->sid = sid;
    Py_INCREF(r->by_cdata); w->by_cdata = r->by_cdata;
    Py_INCREF(r->cdata_of); w->cdata_of = r->cdata_of;
    Py_INCREF(r->host_sids); w->host_sids = r->host_sids;
    Py_INCREF(r->dead); w->dead = r->dead;
    PyObject_GC_Track(w);
    if (!(ref = PyWeakref_NewRef(st, (PyObject *)w)))
        goto done;
    PyObject *hostb = host ? Py_True : Py_False;
    if (!(entry = PyTuple_Pack(3, sid, ref, hostb)) || PyDict_SetItem(r->by_cdata, key, entry) < 0 ||
        PyDict_SetItem(r->cdata_of, sid, key) < 0)
        goto done;
    if (host && PySet_Add(r->host_sids, sid) < 0)
        goto done;
    if (!(nbytes = mcall(st, M_NBYTES)))
        goto done;
    PyObject *a[3] = {sid, nbytes, hostb};
    PyObject *res = PyObject_Vectorcall(r->on_new, a, 3, NULL);
    if (res == NULL)
        goto done;
    Py_DECREF(res);
    result = PyTuple_Pack(2, sid, hostb);
done:
    Py_XDECREF(key); Py_XDECREF(sid); Py_XDECREF(ref); Py_XDECREF(entry); Py_XDECREF(nbytes);
    Py_XDECREF((PyObject *)w);
    return result;
}

static PyObject *rg_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf,
                               PyObject *kwnames) {
    Py_ssize_t n = PyVectorcall_NARGS(nargsf);
    if (n < 2 || n > 3 || kwnames != NULL) {
        PyErr_SetString(PyExc_TypeError, "register(t, st, host=False)");
        return NULL;
    }
    int host = n > 2 ? PyObject_IsTrue(args[2]) : 0;
    if (host < 0)
        return NULL;
    return rg_register((Registrar *)self, args[0], args[1], host, NULL);
}

static PyObject *rg_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *reg;
    if (!PyArg_ParseTuple(args, "O:Registrar", &reg))
        return NULL;
    Registrar *r = (Registrar *)type->tp_alloc(type, 0);
    if (r == NULL)
        return NULL;
    Py_INCREF(reg);
    r->reg = reg;
    PyObject *next = PyObject_GetAttr(reg, s_next);
    r->next = next ? PyLong_AsLongLong(next) : -1;
    Py_XDECREF(next);
    if ((r->next == -1 && PyErr_Occurred()) || !(r->by_cdata = PyObject_GetAttr(reg, s_by_cdata)) ||
        !(r->cdata_of = PyObject_GetAttr(reg, s_cdata_of)) ||
        !(r->host_sids = PyObject_GetAttr(reg, s_host_sids)) ||
        !(r->dead = PyObject_GetAttr(reg, s_dead)) || !(r->on_new = PyObject_GetAttr(reg, s_on_new))) {
        Py_DECREF(r);
        return NULL;
    }
    /* the death watches only append to it */
    PyObject *dead = r->dead;
    r->dead = PyObject_GetAttr(dead, s_append);
    Py_DECREF(dead);
    if (r->dead == NULL) {
        Py_DECREF(r);
        return NULL;
    }
    if (!PyDict_Check(r->by_cdata) || !PyDict_Check(r->cdata_of) || !PyAnySet_Check(r->host_sids)) {
        PyErr_SetString(PyExc_TypeError, "Registrar: the registry's containers");
        Py_DECREF(r);
        return NULL;
    }
    r->vectorcall = rg_vectorcall;
    return (PyObject *)r;
}

static PyTypeObject RegistrarType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "racecheck.instrumentation._speedups.Registrar",
    .tp_basicsize = sizeof(Registrar),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "Registrar(registry): StorageRegistry.register in C, bound to the registry",
    .tp_new = rg_new,
    .tp_dealloc = (destructor)rg_dealloc,
    .tp_traverse = (traverseproc)rg_traverse,
    .tp_clear = (inquiry)rg_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(Registrar, vectorcall),
};
#endif /* HAVE_FRAME_API */

/* ---- footprints of whole tensors (instrumentation/footprints.py FootprintMaker.of) --------- */

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *by_cdata, *register_fn, *compute, *footprint_type, *tok, *attr, *born_attr;
} Footprints;

#define FPS_FIELDS(X) X(by_cdata) X(register_fn) X(compute) X(footprint_type) X(tok) X(attr)      \
    X(born_attr)
GC_METHODS(fps, Footprints, FPS_FIELDS)

static long long call0_ll(PyObject *obj, int m, int *err) {
    PyObject *v = mcall(obj, m);
    if (v == NULL) {
        *err = 1;
        return 0;
    }
    long long x = PyLong_AsLongLong(v);
    Py_DECREF(v);
    if (x == -1 && PyErr_Occurred())
        *err = 1;
    return x;
}

/* A new Footprint(sid, ((lo, hi),), host, None, born) without running __init__ */
static PyObject *new_footprint(Footprints *f, PyObject *sid, long long lo, long long hi,
                               PyObject *host, PyObject *born) {
    PyObject *a = PyLong_FromLongLong(lo), *b = a ? PyLong_FromLongLong(hi) : NULL;
    PyObject *range = b ? PyTuple_Pack(2, a, b) : NULL;
    PyObject *ranges = range ? PyTuple_Pack(1, range) : NULL;
    Py_XDECREF(a); Py_XDECREF(b); Py_XDECREF(range);
    if (ranges == NULL)
        return NULL;
    PyObject *names[5] = {s_storage, s_ranges, s_host, s_approx, s_born};
    PyObject *values[5] = {sid, ranges, host, Py_None, born};
    static Layout L;
    PyObject *fp = new_event(&L, f->footprint_type, names, values, 5);
    Py_DECREF(ranges);
    return fp;
}

/* The footprint of a contiguous tensor t not in the cache (new reference); Py_None when the
   tensor is empty; NULL without an error: not contiguous (the caller computes it in Python). */
static PyObject *contiguous_fp(Footprints *f, PyObject *t) {
    int err = 0;
    long long n = call0_ll(t, M_NUMEL, &err);
    if (err)
        return NULL;
    if (n == 0) {
        Py_RETURN_NONE;
    }
    PyObject *c = mcall(t, M_IS_CONTIGUOUS);
    if (c == NULL)
        return NULL;
    int contiguous = PyObject_IsTrue(c);
    Py_DECREF(c);
    if (contiguous <= 0)
        return NULL;
    PyObject *st = mcall(t, M_UNTYPED_STORAGE);
    if (st == NULL)
        return NULL;
    PyObject *key = PyObject_GetAttr(st, s_cdata);
    if (key == NULL) {
        Py_DECREF(st);
        return NULL;
    }
    PyObject *entry = PyDict_GetItemWithError(f->by_cdata, key);
    PyObject *sid, *host;
    if (entry != NULL) {
        Py_INCREF(entry);
    } else if (!PyErr_Occurred()) {
#ifdef HAVE_FRAME_API
        if (Py_TYPE(f->register_fn) == &RegistrarType)
            entry = rg_register((Registrar *)f->register_fn, t, st, 0, key);
        else
#endif
        {
            PyObject *a[2] = {t, st};
            entry = PyObject_Vectorcall(f->register_fn, a, 2, NULL);
        }
    }
    Py_DECREF(key);
    Py_DECREF(st);
    if (entry == NULL)
        return NULL;
    /* a registry entry is (sid, weakref, host); register() returns (sid, host) */
    if (!PyTuple_Check(entry) || PyTuple_GET_SIZE(entry) < 2) {
        Py_DECREF(entry);
        PyErr_SetString(PyExc_TypeError, "storage registry entry");
        return NULL;
    }
    sid = PyTuple_GET_ITEM(entry, 0);
    host = PyTuple_GET_ITEM(entry, PyTuple_GET_SIZE(entry) - 1);
    long long itemsize = call0_ll(t, M_ELEMENT_SIZE, &err);
    long long off = err ? 0 : call0_ll(t, M_STORAGE_OFFSET, &err);
    PyObject *born = NULL;
    if (!err) {
        PyObject *view = mcall(t, M_IS_VIEW);
        int is = view ? PyObject_IsTrue(view) : -1;
        Py_XDECREF(view);
        if (is < 0)
            err = 1;
        else if (is) {
            PyObject *d = PyObject_GetAttr(t, s_dict);
            if (d == NULL)
                err = 1;
            else {
                born = PyDict_Check(d) ? PyDict_GetItemWithError(d, f->born_attr) : NULL;
                Py_XINCREF(born);
                Py_DECREF(d);
                if (born == NULL && PyErr_Occurred())
                    err = 1;
            }
        }
    }
    PyObject *fp = NULL;
    if (!err)
        fp = new_footprint(f, sid, off * itemsize, (off + n) * itemsize, host,
                           born ? born : Py_None);
    Py_XDECREF(born);
    Py_DECREF(entry);
    if (fp == NULL && !PyErr_Occurred())
        PyErr_SetString(PyExc_RuntimeError, "footprint");
    return fp;
}

static PyObject *fps_of(Footprints *f, PyObject *t) {
    PyObject *d = PyObject_GetAttr(t, s_dict);
    if (d == NULL)
        return NULL;
    PyObject *hit = PyDict_Check(d) ? PyDict_GetItemWithError(d, f->attr) : NULL;
    PyObject *ptr = NULL;
    if (hit != NULL && PyTuple_Check(hit) && PyTuple_GET_SIZE(hit) == 3) {
        int same = PyObject_RichCompareBool(PyTuple_GET_ITEM(hit, 0), f->tok, Py_EQ);
        if (same > 0) {
            ptr = mcall(t, M_DATA_PTR);
            same = ptr ? PyObject_RichCompareBool(PyTuple_GET_ITEM(hit, 1), ptr, Py_EQ) : -1;
        }
        if (same < 0) {
            Py_XDECREF(ptr);
            Py_DECREF(d);
            return NULL;
        }
        if (same) {
            PyObject *fp = PyTuple_GET_ITEM(hit, 2);
            Py_INCREF(fp);
            Py_DECREF(ptr);
            Py_DECREF(d);
            return fp;
        }
    } else if (hit == NULL && PyErr_Occurred()) {
        Py_DECREF(d);
        return NULL;
    }
    PyObject *fp = contiguous_fp(f, t);
    if (fp == NULL) {
        if (PyErr_Occurred()) {
            Py_XDECREF(ptr);
            Py_DECREF(d);
            return NULL;
        }
        fp = PyObject_CallOneArg(f->compute, t);       /* strided: the Python path */
        if (fp == NULL) {
            Py_XDECREF(ptr);
            Py_DECREF(d);
            return NULL;
        }
    }
    if (fp != Py_None) {
        /* the data pointer after the computation, as the Python version reads it */
        Py_XDECREF(ptr);
        ptr = mcall(t, M_DATA_PTR);
        PyObject *entry = ptr ? PyTuple_Pack(3, f->tok, ptr, fp) : NULL;
        if (entry == NULL || PyDict_SetItem(d, f->attr, entry) < 0) {
            Py_XDECREF(entry);
            Py_XDECREF(ptr);
            Py_DECREF(fp);
            Py_DECREF(d);
            return NULL;
        }
        Py_DECREF(entry);
    }
    Py_XDECREF(ptr);
    Py_DECREF(d);
    return fp;
}

static PyObject *fps_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf,
                                PyObject *kwnames) {
    if (PyVectorcall_NARGS(nargsf) != 1 || kwnames != NULL) {
        PyErr_SetString(PyExc_TypeError, "of(tensor)");
        return NULL;
    }
    return fps_of((Footprints *)self, args[0]);
}

static PyObject *fps_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"by_cdata", "register", "compute", "footprint_type", "token", "attr",
                             "born_attr", NULL};
    PyObject *by_cdata, *reg, *compute, *ftype, *tok, *attr, *born_attr;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!OOO!OO!O!:Footprints", kwlist,
                                     &PyDict_Type, &by_cdata, &reg, &compute, &PyType_Type,
                                     &ftype, &tok, &PyUnicode_Type, &attr, &PyUnicode_Type,
                                     &born_attr))
        return NULL;
    Footprints *f = (Footprints *)type->tp_alloc(type, 0);
    if (f == NULL)
        return NULL;
    Py_INCREF(by_cdata); f->by_cdata = by_cdata;
    Py_INCREF(reg); f->register_fn = reg;
    Py_INCREF(compute); f->compute = compute;
    Py_INCREF(ftype); f->footprint_type = ftype;
    Py_INCREF(tok); f->tok = tok;
    Py_INCREF(attr); f->attr = attr;
    Py_INCREF(born_attr); f->born_attr = born_attr;
    f->vectorcall = fps_vectorcall;
    return (PyObject *)f;
}

static PyTypeObject FootprintsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "racecheck.instrumentation._speedups.Footprints",
    .tp_basicsize = sizeof(Footprints),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "FootprintMaker.of in C: cached footprints, contiguous tensors computed here",
    .tp_new = fps_new,
    .tp_dealloc = (destructor)fps_dealloc,
    .tp_traverse = (traverseproc)fps_traverse,
    .tp_clear = (inquiry)fps_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(Footprints, vectorcall),
};



/* ---- a device backend's stream lookups (instrumentation/device.py) ------------------------ */

/* DeviceBackend.op_stream_tid (by_args) / current_stream_tid: the timeline of the current stream
   (of the first tensor's device) when it is known, else the Python method. */
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *cur, *tids, *slow, *tensor;
    int by_args;
} StreamOf;

#define SO_FIELDS(X) X(cur) X(tids) X(slow) X(tensor)
GC_METHODS(so, StreamOf, SO_FIELDS)

static PyObject *so_known(StreamOf *o, PyObject *dev) {
    PyObject *key = PyObject_CallOneArg(o->cur, dev);
    if (key == NULL)
        return NULL;
    PyObject *tid = PyDict_GetItemWithError(o->tids, key);
    Py_DECREF(key);
    Py_XINCREF(tid);
    return tid;
}

/* the lookup; args is (op args, kwargs) when by_args, else empty */
static PyObject *so_call(StreamOf *o, PyObject *const *args, Py_ssize_t n) {
    PyObject *tid = NULL;
    if (!o->by_args) {
        tid = so_known(o, minus_one);       /* the current device */
    } else if (PyTuple_Check(args[0]) && PyTuple_GET_SIZE(args[0]) > 0) {
        PyObject *a = PyTuple_GET_ITEM(args[0], 0);
        int is = PyObject_IsInstance(a, o->tensor);
        if (is < 0)
            return NULL;
        if (is) {
            int cpu = attr_true(a, s_is_cpu);
            if (cpu < 0)
                return NULL;
            if (!cpu) {
                PyObject *dev = mcall(a, M_GET_DEVICE);
                if (dev == NULL)
                    return NULL;
                tid = so_known(o, dev);
                Py_DECREF(dev);
            }
        }
    }
    if (tid != NULL || PyErr_Occurred())
        return tid;
    return PyObject_Vectorcall(o->slow, args, n, NULL);
}

static PyObject *so_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf,
                               PyObject *kwnames) {
    StreamOf *o = (StreamOf *)self;
    Py_ssize_t n = PyVectorcall_NARGS(nargsf);
    if (kwnames != NULL || n != (o->by_args ? 2 : 0)) {
        PyErr_SetString(PyExc_TypeError, o->by_args ? "op_stream_tid(args, kwargs)"
                                                    : "current_stream_tid()");
        return NULL;
    }
    return so_call(o, args, n);
}

static PyObject *so_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"cur", "tids", "slow", "tensor", "by_args", NULL};
    PyObject *cur, *tids, *slow, *tensor;
    int by_args;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO!OOp:StreamOf", kwlist, &cur, &PyDict_Type,
                                     &tids, &slow, &tensor, &by_args))
        return NULL;
    StreamOf *o = (StreamOf *)type->tp_alloc(type, 0);
    if (o == NULL)
        return NULL;
    Py_INCREF(cur); o->cur = cur;
    Py_INCREF(tids); o->tids = tids;
    Py_INCREF(slow); o->slow = slow;
    Py_INCREF(tensor); o->tensor = tensor;
    o->by_args = by_args;
    o->vectorcall = so_vectorcall;
    return (PyObject *)o;
}

static PyTypeObject StreamOfType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "racecheck.instrumentation._speedups.StreamOf",
    .tp_basicsize = sizeof(StreamOf),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "StreamOf(cur, tids, slow, tensor, by_args): a device backend's stream lookup",
    .tp_new = so_new,
    .tp_dealloc = (destructor)so_dealloc,
    .tp_traverse = (traverseproc)so_traverse,
    .tp_clear = (inquiry)so_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(StreamOf, vectorcall),
};

/* ---- the dispatch mode's plan for a plain kernel (instrumentation/interceptor.py) ----------- */


enum { ROLE_READ = 0, ROLE_WRITE = 1, ROLE_READ_WRITE = 2 };

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *pinned, *names, *kernel, *oc, *tls, *fp, *capture, *stream_fn,
        *backend, *call, *execute, *outs, *sink, *emit, *kernel_type, *name, *tensor;
    int by_device, direct, out_mode, native_capture;
    Py_ssize_t need, nspec, skip;
    Py_ssize_t index[16];
    int role[16];
} FastPlan;

#define FP_FIELDS(X) X(pinned) X(names) X(kernel) X(oc) X(tls) X(fp) X(capture) X(stream_fn)      \
    X(backend) X(call) X(execute) X(outs) X(sink) X(emit) X(kernel_type) X(name) X(tensor)
GC_METHODS(fp, FastPlan, FP_FIELDS)

static PyObject *fallback(FastPlan *p, PyObject *func, PyObject *a, PyObject *kw) {
    PyObject *args[4] = {func, a, kw, p->oc};
    return PyObject_Vectorcall(p->kernel, args, 4, NULL);
}

/* The stream an op runs on: the backend's lookup (by the op's tensors' device, or the current
   stream), called in C where it is a StreamOf; args (the op's arguments) only when by_device */
static PyObject *op_stream(PyObject *fn, int by_device, PyObject *args, PyObject *kw) {
    if (by_device) {
        PyObject *sargs[2] = {args, kw};
        return Py_TYPE(fn) == &StreamOfType ? so_call((StreamOf *)fn, sargs, 2)
                                            : PyObject_Vectorcall(fn, sargs, 2, NULL);
    }
    return Py_TYPE(fn) == &StreamOfType ? so_call((StreamOf *)fn, NULL, 0) : PyObject_CallNoArgs(fn);
}

/* backend.before_launch(stream, op), where one is set (delay plans): 0, or -1 on error */
static int before_launch(PyObject *backend, PyObject *stream, PyObject *op) {
    PyObject *hook = PyObject_GetAttr(backend, s_before_launch);
    if (hook == NULL)
        return -1;
    int rc = 0;
    if (hook != Py_None) {
        PyObject *hargs[2] = {stream, op};
        PyObject *r = PyObject_Vectorcall(hook, hargs, 2, NULL);
        rc = r == NULL ? -1 : 0;
        Py_XDECREF(r);
    }
    Py_DECREF(hook);
    return rc;
}

/* f.host of a footprint made by the maker (a plain slot read where the class has it) */
static int fp_host(PyObject *f) {
    static Layout L;
    PyObject *const names[1] = {s_host};
    if (L.type != Py_TYPE(f))
        layout_compute(&L, Py_TYPE(f), names, 1);
    PyObject *host = L.ok ? SLOT(f, L.off[0]) : PyObject_GetAttr(f, s_host);
    if (host == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_AttributeError, "host");
        return -1;
    }
    int h = host == Py_False ? 0 : host == Py_True ? 1 : PyObject_IsTrue(host);
    if (!L.ok)
        Py_DECREF(host);
    return h;
}

/* the maker's of(t): in C where it is Footprints */
static inline PyObject *footprint_of(PyObject *of, PyObject *t) {
    return Py_TYPE(of) == &FootprintsType ? fps_of((Footprints *)of, t) : PyObject_CallOneArg(of, t);
}

static int is_native_capture(PyObject *fn) {
#ifdef HAVE_FRAME_API
    return PyCFunction_Check(fn) &&
           PyCFunction_GET_FUNCTION(fn) == (PyCFunction)(void (*)(void))capture;
#else
    return 0;
#endif
}

/* stacks.capture(6, skip) from a C plan or wrapper, which has no Python frame of its own: skip 1
   starts at the innermost Python frame (the caller's) */
static PyObject *stack_from(PyObject *capture_fn, int native, Py_ssize_t skip) {
#ifdef HAVE_FRAME_API
    if (native)
        return capture_impl(6, skip);
#endif
    PyObject *args[2] = {PyLong_FromLong(6), PyLong_FromSsize_t(skip)};
    PyObject *r = args[0] && args[1] ? PyObject_Vectorcall(capture_fn, args, 2, NULL) : NULL;
    Py_XDECREF(args[0]);
    Py_XDECREF(args[1]);
    return r;
}

/* The footprint of tensor t (new reference, through the maker's `of`, which keeps the cache);
   NULL without an error: fall back to the generic path (an empty or a host tensor). */
static PyObject *tensor_fp(FastPlan *p, PyObject *t, int *fallback_needed) {
    PyObject *f = footprint_of(p->fp, t);
    if (f == NULL)
        return NULL;
    if (f == Py_None) {
        Py_DECREF(f);
        *fallback_needed = 1;
        return NULL;
    }
    int h = fp_host(f);
    if (h != 0) {
        Py_DECREF(f);
        if (h > 0)
            *fallback_needed = 1;
        return NULL;
    }
    return f;
}

static PyObject *make_kernel(FastPlan *p, PyObject *thread, PyObject *stream, PyObject *reads,
                             PyObject *writes, PyObject *stack) {
    PyObject *names[6] = {s_thread, s_stream, s_reads, s_writes, s_op, s_stack};
    PyObject *values[6] = {thread, stream, reads, writes, p->name, stack};
    static Layout L;
    return new_event(&L, p->kernel_type, names, values, 6);
}


/* The plan: interceptor._plan_source's function, for (func, args tuple, kwargs dict) */
static PyObject *plan_call(FastPlan *p, PyObject *func, PyObject *a, PyObject *kw) {
    if (PyDict_GET_SIZE(kw)) {
        if (p->pinned != Py_None) {
            PyObject *pin = PyDict_GetItemWithError(kw, s_pin_memory);
            int t = pin ? PyObject_IsTrue(pin) : (PyErr_Occurred() ? -1 : 0);
            if (t < 0)
                return NULL;
            if (t) {
                PyObject *pargs[3] = {func, a, kw};
                return PyObject_Vectorcall(p->pinned, pargs, 3, NULL);
            }
        }
        Py_ssize_t pos = 0;
        PyObject *k, *v;
        while (PyDict_Next(kw, &pos, &k, &v)) {
            int in = PySet_Contains(p->names, k);
            if (in < 0)
                return NULL;
            if (in)
                return fallback(p, func, a, kw);
        }
    }
    PyObject *cap = PyObject_GetAttr(p->tls, s_capture_attr);
    if (cap == NULL)
        return NULL;
    Py_DECREF(cap);
    if (cap != Py_None || PyTuple_GET_SIZE(a) < p->need)
        return fallback(p, func, a, kw);
    PyObject *fps[16] = {NULL};
    PyObject *stack = NULL, *stream = NULL, *out = NULL, *reads = NULL, *writes = NULL,
             *thread = NULL, *ev = NULL, *result = NULL;
    Py_ssize_t nr = 0, nw = 0;
    for (Py_ssize_t k = 0; k < p->nspec; k++) {
        PyObject *t = PyTuple_GET_ITEM(a, p->index[k]);
        if (PyObject_TypeCheck(t, (PyTypeObject *)p->tensor)) {
            int fb = 0;
            fps[k] = tensor_fp(p, t, &fb);
            if (fps[k] == NULL) {
                if (fb) {
                    result = fallback(p, func, a, kw);
                }
                goto done;
            }
            if (p->role[k] != ROLE_WRITE)
                nr++;
            if (p->role[k] != ROLE_READ)
                nw++;
        }
    }
    if (!(stack = stack_from(p->capture, p->native_capture, p->skip)))
        goto done;
    stream = op_stream(p->stream_fn, p->by_device, a, kw);
    if (stream == NULL || before_launch(p->backend, stream, p->name) < 0)
        goto done;
    if (p->direct) {
        out = PyObject_Call(p->call, a, PyDict_GET_SIZE(kw) ? kw : NULL);
    } else {
        PyObject *eargs[4] = {stream, func, a, kw};
        out = PyObject_Vectorcall(p->execute, eargs, 4, NULL);
    }
    if (out == NULL)
        goto done;
    if (!(thread = thread_of(p->tls, p->sink)))
        goto done;
    PyObject *extra = NULL;
    if (p->out_mode == 1 && PyObject_TypeCheck(out, (PyTypeObject *)p->tensor)) {
        alloc_stream = stream;
        alloc_thread = thread;
        PyObject *f = footprint_of(p->fp, out);
        alloc_stream = alloc_thread = NULL;
        if (f == NULL)
            goto done;
        if (f == Py_None)
            Py_DECREF(f);
        else {
            extra = PyTuple_Pack(1, f);
            Py_DECREF(f);
            if (extra == NULL)
                goto done;
        }
    } else if (p->out_mode != 0) {
        alloc_stream = stream;
        alloc_thread = thread;
        extra = PyObject_CallOneArg(p->outs, out);
        alloc_stream = alloc_thread = NULL;
        if (extra == NULL)
            goto done;
        if (!PyTuple_Check(extra)) {
            PyErr_SetString(PyExc_TypeError, "plan outs() must return a tuple");
            Py_DECREF(extra);
            goto done;
        }
    }
    Py_ssize_t ne = extra ? PyTuple_GET_SIZE(extra) : 0;
    reads = PyTuple_New(nr);
    writes = PyTuple_New(nw + ne);
    if (reads == NULL || writes == NULL) {
        Py_XDECREF(extra);
        goto done;
    }
    Py_ssize_t ir = 0, iw = 0;
    for (Py_ssize_t k = 0; k < p->nspec; k++) {
        if (fps[k] == NULL)
            continue;
        if (p->role[k] != ROLE_WRITE) {
            Py_INCREF(fps[k]);
            PyTuple_SET_ITEM(reads, ir++, fps[k]);
        }
        if (p->role[k] != ROLE_READ) {
            Py_INCREF(fps[k]);
            PyTuple_SET_ITEM(writes, iw++, fps[k]);
        }
    }
    for (Py_ssize_t k = 0; k < ne; k++) {
        PyObject *f = PyTuple_GET_ITEM(extra, k);
        Py_INCREF(f);
        PyTuple_SET_ITEM(writes, iw++, f);
    }
    Py_XDECREF(extra);
    if (!(ev = make_kernel(p, thread, stream, reads, writes, stack)))
        goto done;
    PyObject *r = emit_to(p->emit, ev);
    if (r == NULL)
        goto done;
    Py_DECREF(r);
    result = out;
    out = NULL;
done:
    for (Py_ssize_t k = 0; k < p->nspec; k++)
        Py_XDECREF(fps[k]);
    Py_XDECREF(stack); Py_XDECREF(stream); Py_XDECREF(out); Py_XDECREF(reads);
    Py_XDECREF(writes); Py_XDECREF(thread); Py_XDECREF(ev);
    return result;
}

static PyObject *plan_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf,
                                 PyObject *kwnames) {
    if (PyVectorcall_NARGS(nargsf) != 3 || kwnames != NULL || !PyTuple_Check(args[1]) ||
        !PyDict_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "plan(func, args, kwargs)");
        return NULL;
    }
    return plan_call((FastPlan *)self, args[0], args[1], args[2]);
}

static PyObject *plan_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"pinned", "names", "kernel", "oc", "tls", "fp",
                             "capture", "stream_fn", "by_device", "backend", "call", "direct",
                             "execute", "out_mode", "outs", "sink", "emit", "kernel_type",
                             "name", "tensor", "need", "spec", "skip", NULL};
    FastPlan *p = (FastPlan *)type->tp_alloc(type, 0);
    if (p == NULL)
        return NULL;
    PyObject *spec;
    p->skip = 2;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO!OOOOOOpOOpOiOOOOO!OnO!|n:FastPlan", kwlist,
                                     &p->pinned, &PyFrozenSet_Type, &p->names, &p->kernel,
                                     &p->oc, &p->tls, &p->fp,
                                     &p->capture, &p->stream_fn, &p->by_device, &p->backend,
                                     &p->call, &p->direct, &p->execute, &p->out_mode, &p->outs,
                                     &p->sink, &p->emit, &p->kernel_type, &PyUnicode_Type,
                                     &p->name, &p->tensor, &p->need, &PyTuple_Type, &spec,
                                     &p->skip)) {
        p->pinned = p->names = p->kernel = p->oc = p->tls = p->fp = NULL;
        p->capture = p->stream_fn = p->backend = p->call = p->execute = p->outs = NULL;
        p->sink = p->emit = p->kernel_type = p->name = p->tensor = NULL;
        Py_DECREF(p);
        return NULL;
    }
    Py_INCREF(p->pinned); Py_INCREF(p->names); Py_INCREF(p->kernel); Py_INCREF(p->oc);
    Py_INCREF(p->tls); Py_INCREF(p->fp);
    Py_INCREF(p->capture); Py_INCREF(p->stream_fn); Py_INCREF(p->backend); Py_INCREF(p->call);
    Py_INCREF(p->execute); Py_INCREF(p->outs); Py_INCREF(p->sink); Py_INCREF(p->emit);
    Py_INCREF(p->kernel_type); Py_INCREF(p->name); Py_INCREF(p->tensor);
    if (!PyType_Check(p->kernel_type) || !PyType_Check(p->tensor)) {
        PyErr_SetString(PyExc_TypeError, "FastPlan: kernel_type and tensor must be types");
        Py_DECREF(p);
        return NULL;
    }
    p->nspec = PyTuple_GET_SIZE(spec);
    if (p->nspec > 16) {
        PyErr_SetString(PyExc_ValueError, "FastPlan: at most 16 tensor arguments");
        Py_DECREF(p);
        return NULL;
    }
    for (Py_ssize_t k = 0; k < p->nspec; k++) {
        PyObject *it = PyTuple_GET_ITEM(spec, k);
        if (!PyArg_ParseTuple(it, "ni", &p->index[k], &p->role[k])) {
            Py_DECREF(p);
            return NULL;
        }
        if (p->index[k] < 0 || p->index[k] >= p->need) {
            PyErr_SetString(PyExc_ValueError, "FastPlan: argument index out of range");
            Py_DECREF(p);
            return NULL;
        }
    }
    p->native_capture = is_native_capture(p->capture);
    p->vectorcall = plan_vectorcall;
    return (PyObject *)p;
}

static PyTypeObject FastPlanType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "racecheck.instrumentation._speedups.FastPlan",
    .tp_basicsize = sizeof(FastPlan),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "The plan of a plain kernel (interceptor._fast_kernel's source, in C)",
    .tp_new = plan_new,
    .tp_dealloc = (destructor)fp_dealloc,
    .tp_traverse = (traverseproc)fp_traverse,
    .tp_clear = (inquiry)fp_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(FastPlan, vectorcall),
};




/* ---- the dispatch mode's plans for copy_, views and .item() (interceptor._copy, _view,
   _scalar_read) ------------------------------------------------------------------------------ */

enum { PLAN_COPY = 1, PLAN_VIEW = 2, PLAN_ITEM = 3 };

/* The common case of each in C, the rest through `slow`, the Python plan (func, args, kwargs),
   which computes the same footprints again from the tensors' caches. */
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    int kind;
    PyObject *slow, *tls, *fp, *capture, *stream_fn, *backend, *call, *execute, *sink, *emit,
        *kernel_type, *host_sync_type, *name, *tensor, *pending, *born_attr, *wait;
    int by_device, direct, native_capture;
    Py_ssize_t skip;
} SpecialPlan;

#define SP_FIELDS(X) X(slow) X(tls) X(fp) X(capture) X(stream_fn) X(backend) X(call) X(execute)   \
    X(sink) X(emit) X(kernel_type) X(host_sync_type) X(name) X(tensor) X(pending) X(born_attr)    \
    X(wait)
GC_METHODS(sp, SpecialPlan, SP_FIELDS)

static PyObject *sp_slow(SpecialPlan *p, PyObject *func, PyObject *a, PyObject *kw) {
    PyObject *args[3] = {func, a, kw};
    return PyObject_Vectorcall(p->slow, args, 3, NULL);
}

static PyObject *sp_call(SpecialPlan *p, PyObject *a, PyObject *kw) {
    return PyObject_Call(p->call, a, PyDict_GET_SIZE(kw) ? kw : NULL);
}

/* a device footprint of tensor t (new reference); NULL without an error: take the slow path */
static PyObject *sp_device_fp(SpecialPlan *p, PyObject *t) {
    if (!PyObject_TypeCheck(t, (PyTypeObject *)p->tensor))
        return NULL;
    PyObject *f = footprint_of(p->fp, t);
    if (f == NULL || f == Py_None) {
        Py_XDECREF(f);
        return NULL;
    }
    int h = fp_host(f);
    if (h != 0) {
        Py_DECREF(f);
        return NULL;
    }
    return f;
}

/* Interceptor._copy, device to device outside a capture: Kernel(src -> dst) */
static PyObject *copy_call(SpecialPlan *p, PyObject *func, PyObject *a, PyObject *kw) {
    if (PyTuple_GET_SIZE(a) < 2)
        return sp_slow(p, func, a, kw);
    PyObject *dst = PyTuple_GET_ITEM(a, 0), *src = PyTuple_GET_ITEM(a, 1);
    if (!PyObject_TypeCheck(src, (PyTypeObject *)p->tensor))
        return sp_slow(p, func, a, kw);
    PyObject *dfp = sp_device_fp(p, dst);
    if (dfp == NULL)
        return PyErr_Occurred() ? NULL : sp_slow(p, func, a, kw);
    PyObject *sfp = sp_device_fp(p, src);
    if (sfp == NULL) {
        Py_DECREF(dfp);
        return PyErr_Occurred() ? NULL : sp_slow(p, func, a, kw);
    }
    PyObject *stack = NULL, *thread = NULL, *stream = NULL, *pair = NULL, *reads = NULL,
             *writes = NULL, *ev = NULL, *result = NULL;
    PyObject *cap = PyObject_GetAttr(p->tls, s_capture_attr);
    if (cap == NULL)
        goto done;
    Py_DECREF(cap);
    if (cap != Py_None) {
        result = sp_slow(p, func, a, kw);
        goto done;
    }
    if (!(stack = stack_from(p->capture, p->native_capture, p->skip)) || !(thread = thread_of(p->tls, p->sink)))
        goto done;
    /* the source's device decides the stream (interceptor._copy looks at (src, dst)) */
    if (p->by_device && !(pair = PyTuple_Pack(2, src, dst)))
        goto done;
    stream = op_stream(p->stream_fn, p->by_device, pair, Py_None);
    if (stream == NULL || before_launch(p->backend, stream, p->name) < 0)
        goto done;
    if (!(reads = PyTuple_Pack(1, sfp)) || !(writes = PyTuple_Pack(1, dfp)))
        goto done;
    PyObject *names[6] = {s_thread, s_stream, s_reads, s_writes, s_op, s_stack};
    PyObject *values[6] = {thread, stream, reads, writes, p->name, stack};
    static Layout L;
    if (!(ev = new_event(&L, p->kernel_type, names, values, 6)))
        goto done;
    PyObject *r = emit_to(p->emit, ev);
    if (r == NULL)
        goto done;
    Py_DECREF(r);
    if (p->direct) {
        result = sp_call(p, a, kw);
    } else {
        PyObject *eargs[4] = {stream, func, a, kw};
        result = PyObject_Vectorcall(p->execute, eargs, 4, NULL);
    }
done:
    Py_DECREF(dfp); Py_DECREF(sfp);
    Py_XDECREF(stack); Py_XDECREF(thread); Py_XDECREF(stream); Py_XDECREF(pair);
    Py_XDECREF(reads); Py_XDECREF(writes); Py_XDECREF(ev);
    return result;
}

/* Interceptor._view: run it; each output view remembers the trace position it was made at */
static int set_born(SpecialPlan *p, PyObject *t, PyObject *pos) {
    if (!PyObject_TypeCheck(t, (PyTypeObject *)p->tensor))
        return 0;
    PyObject *d = PyObject_GetAttr(t, s_dict);
    if (d == NULL)
        return -1;
    int rc = PyObject_SetItem(d, p->born_attr, pos);
    Py_DECREF(d);
    return rc;
}

static PyObject *view_call(SpecialPlan *p, PyObject *func, PyObject *a, PyObject *kw) {
    PyObject *out = sp_call(p, a, kw);
    if (out == NULL)
        return NULL;
    /* Recorder.position: the trace index the next event will have */
    PyObject *seq = PyObject_GetAttr(p->sink, s_seq);
    Py_ssize_t n = seq ? PyObject_Length(p->pending) : -1;
    PyObject *queued = n >= 0 ? PyLong_FromSsize_t(n) : NULL;
    PyObject *pos = queued ? PyNumber_Add(seq, queued) : NULL;
    Py_XDECREF(seq);
    Py_XDECREF(queued);
    int rc = pos == NULL ? -1 : 0;
    if (rc == 0) {
        if (PyObject_TypeCheck(out, (PyTypeObject *)p->tensor))
            rc = set_born(p, out, pos);
        else if (PyList_Check(out) || PyTuple_Check(out)) {
            for (Py_ssize_t k = 0; rc == 0 && k < PySequence_Fast_GET_SIZE(out); k++)
                rc = set_born(p, PySequence_Fast_ITEMS(out)[k], pos);
        }
    }
    Py_XDECREF(pos);
    if (rc < 0) {
        Py_DECREF(out);
        return NULL;
    }
    return out;
}

/* Interceptor._scalar_read on a device tensor: Kernel(read), then the host waits for its stream */
static PyObject *item_call(SpecialPlan *p, PyObject *func, PyObject *a, PyObject *kw) {
    if (PyTuple_GET_SIZE(a) < 1)
        return sp_slow(p, func, a, kw);
    PyObject *t = PyTuple_GET_ITEM(a, 0);
    int checking = attr_true(p->sink, s_checking);
    if (checking < 0)
        return NULL;
    if (!checking || !PyObject_TypeCheck(t, (PyTypeObject *)p->tensor))
        return sp_slow(p, func, a, kw);
    PyObject *v = PyObject_GetAttr(p->tls, s_internal);
    int busy = v == NULL ? -1 : PyObject_IsTrue(v);
    Py_XDECREF(v);
    if (busy < 0)
        return NULL;
    PyObject *cap = busy ? NULL : PyObject_GetAttr(p->tls, s_capture_attr);
    if (!busy && cap == NULL)
        return NULL;
    Py_XDECREF(cap);
    if (busy || cap != Py_None)
        return sp_slow(p, func, a, kw);
    PyObject *f = sp_device_fp(p, t);
    if (f == NULL)
        return PyErr_Occurred() ? NULL : sp_slow(p, func, a, kw);
    PyObject *stack = NULL, *stream = NULL, *thread = NULL, *reads = NULL, *ev = NULL,
             *result = NULL;
    if (!(stack = stack_from(p->capture, p->native_capture, p->skip)))
        goto done;
    stream = op_stream(p->stream_fn, 0, NULL, NULL);
    if (stream == NULL || !(thread = thread_of(p->tls, p->sink)) || !(reads = PyTuple_Pack(1, f)))
        goto done;
    PyObject *names[6] = {s_thread, s_stream, s_reads, s_writes, s_op, s_stack};
    PyObject *values[6] = {thread, stream, reads, empty_tuple, p->name, stack};
    static Layout L;
    if (!(ev = new_event(&L, p->kernel_type, names, values, 6)))
        goto done;
    PyObject *r = emit_to(p->emit, ev);
    if (r == NULL)
        goto done;
    Py_DECREF(r);
    Py_CLEAR(ev);
    if (p->wait != Py_None) {
        r = PyObject_CallOneArg(p->wait, stream);
    } else {
        /* Backend.emit_host_sync("stream", stream): the host waited for the stream */
        Py_DECREF(thread);
        if (!(thread = thread_of(p->tls, p->sink)))
            goto done;
        PyObject *hnames[4] = {s_thread, s_sync_kind, s_target, s_stack};
        PyObject *hvalues[4] = {thread, s_stream, stream, stack};
        static Layout H;
        if (!(ev = new_event(&H, p->host_sync_type, hnames, hvalues, 4)))
            goto done;
        r = emit_to(p->emit, ev);
    }
    if (r == NULL)
        goto done;
    Py_DECREF(r);
    result = sp_call(p, a, kw);
done:
    Py_DECREF(f);
    Py_XDECREF(stack); Py_XDECREF(stream); Py_XDECREF(thread); Py_XDECREF(reads); Py_XDECREF(ev);
    return result;
}

static PyObject *sp_run(SpecialPlan *p, PyObject *func, PyObject *a, PyObject *kw) {
    switch (p->kind) {
    case PLAN_COPY: return copy_call(p, func, a, kw);
    case PLAN_VIEW: return view_call(p, func, a, kw);
    default: return item_call(p, func, a, kw);
    }
}

static PyObject *sp_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf,
                               PyObject *kwnames) {
    if (PyVectorcall_NARGS(nargsf) != 3 || kwnames != NULL || !PyTuple_Check(args[1]) ||
        !PyDict_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "plan(func, args, kwargs)");
        return NULL;
    }
    return sp_run((SpecialPlan *)self, args[0], args[1], args[2]);
}

static PyObject *sp_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"kind", "slow", "tls", "fp", "capture", "stream_fn", "by_device",
                             "backend", "call", "direct", "execute", "sink", "emit",
                             "kernel_type", "host_sync_type", "name", "tensor", "pending",
                             "born_attr", "wait", "skip", NULL};
    SpecialPlan *p = (SpecialPlan *)type->tp_alloc(type, 0);
    if (p == NULL)
        return NULL;
    PyObject *o[17] = {NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "iOOOOOpOOpOOOOOOOOOOn:SpecialPlan", kwlist,
                                     &p->kind, &o[0], &o[1], &o[2], &o[3], &o[4], &p->by_device,
                                     &o[5], &o[6], &p->direct, &o[7], &o[8], &o[9], &o[10],
                                     &o[11], &o[12], &o[13], &o[14], &o[15], &o[16], &p->skip)) {
        Py_DECREF(p);
        return NULL;
    }
    PyObject **dst[17] = {&p->slow, &p->tls, &p->fp, &p->capture, &p->stream_fn, &p->backend,
                          &p->call, &p->execute, &p->sink, &p->emit, &p->kernel_type,
                          &p->host_sync_type, &p->name, &p->tensor, &p->pending, &p->born_attr,
                          &p->wait};
    for (int i = 0; i < 17; i++) {
        Py_INCREF(o[i]);
        *dst[i] = o[i];
    }
    if (p->kind < PLAN_COPY || p->kind > PLAN_ITEM || !PyType_Check(p->tensor) ||
        !PyType_Check(p->kernel_type)) {
        PyErr_SetString(PyExc_ValueError, "SpecialPlan: bad kind or types");
        Py_DECREF(p);
        return NULL;
    }
    p->native_capture = is_native_capture(p->capture);
    p->vectorcall = sp_vectorcall;
    return (PyObject *)p;
}

static PyTypeObject SpecialPlanType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "racecheck.instrumentation._speedups.SpecialPlan",
    .tp_basicsize = sizeof(SpecialPlan),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "The plan of copy_ (kind 1), a view op (2) or .item() (3): the interceptor's "
              "_copy, _view and _scalar_read for their common case",
    .tp_new = sp_new,
    .tp_dealloc = (destructor)sp_dealloc,
    .tp_traverse = (traverseproc)sp_traverse,
    .tp_clear = (inquiry)sp_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(SpecialPlan, vectorcall),
};


/* ---- a device backend's wrappers of Event.record, Event.wait, the graph's replay and
   Stream.wait_stream (instrumentation/device.py DeviceBackend._install_wrappers, without trace
   callbacks) ---- */

enum { HOOK_RECORD = 1, HOOK_WAIT = 2, HOOK_REPLAY = 3, HOOK_WAIT_STREAM = 4 };

/* Installed as a class attribute in place of the method it wraps (binds like a function); the
   original runs first, then the event goes to the sink (a replay: after the delay hook). */
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    int kind;
    PyObject *orig, *backend, *globals, *sink, *tls, *mute_tls, *token, *attr, *tids, *dtype,
        *stream_of, *current_tid, *capture, *emit, *event_type, *internal_error, *where;
    int native_capture;
} SyncHook;

#define SH_FIELDS(X) X(orig) X(backend) X(globals) X(sink) X(tls) X(mute_tls) X(token) X(attr)    \
    X(tids) X(dtype) X(stream_of) X(current_tid) X(capture) X(emit) X(event_type)                 \
    X(internal_error) X(where)
GC_METHODS(sh, SyncHook, SH_FIELDS)

/* DeviceBackend._live: this backend is the active one, checking, not muted */
static int sh_live(SyncHook *h) {
    PyObject *active = PyDict_GetItemWithError(h->globals, s_ACTIVE);
    if (active == NULL)
        return PyErr_Occurred() ? -1 : 0;
    if (active != h->backend)
        return 0;
    int t = attr_true(h->sink, s_checking);
    if (t <= 0)
        return t;
    PyObject *mute = PyObject_GetAttr(h->mute_tls, s_mute);
    if (mute == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError))
            return -1;
        PyErr_Clear();
        return 1;
    }
    int m = PyObject_IsTrue(mute);
    Py_DECREF(mute);
    return m < 0 ? -1 : !m;
}

/* DeviceBackend._obj_eid(ev, create): the id this session gave the Event object */
static PyObject *sh_obj_eid(SyncHook *h, PyObject *ev, int create) {
    PyObject *d = PyObject_GetAttr(ev, s_dict);
    if (d == NULL)
        return NULL;
    PyObject *got = PyDict_Check(d) ? PyDict_GetItemWithError(d, h->attr) : NULL;
    if (got == NULL && PyErr_Occurred()) {
        Py_DECREF(d);
        return NULL;
    }
    if (got != NULL && PyTuple_Check(got) && PyTuple_GET_SIZE(got) == 2 &&
        PyTuple_GET_ITEM(got, 0) == h->token) {
        PyObject *eid = PyTuple_GET_ITEM(got, 1);
        Py_INCREF(eid);
        Py_DECREF(d);
        return eid;
    }
    if (!create) {
        Py_DECREF(d);
        Py_RETURN_NONE;
    }
    PyObject *eid = PyObject_CallMethodNoArgs(h->sink, s_new_event_id);
    PyObject *pair = eid ? PyTuple_Pack(2, h->token, eid) : NULL;
    if (pair == NULL || PyObject_SetItem(d, h->attr, pair) < 0)
        Py_CLEAR(eid);
    Py_XDECREF(pair);
    Py_DECREF(d);
    return eid;
}

/* record_tid(stream): the current stream's timeline, or DeviceBackend.stream_of(stream) (a
   known stream of this device type looked up here, anything else in Python) */
static PyObject *sh_stream_tid(SyncHook *h, PyObject *stream) {
    if (stream == Py_None)
        return op_stream(h->current_tid, 0, NULL, NULL);
    PyObject *sid = PyObject_GetAttr(stream, s_stream_id);
    PyObject *dev = sid ? PyObject_GetAttr(stream, s_device_index) : NULL;
    PyObject *dt = dev ? PyObject_GetAttr(stream, s_device_type) : NULL;
    PyObject *tid = NULL;
    if (dt != NULL && PyLong_CheckExact(sid) && PyLong_CheckExact(dev) && PyLong_CheckExact(dt)) {
        int same = PyObject_RichCompareBool(dt, h->dtype, Py_EQ);
        if (same > 0) {
            PyObject *key = PyTuple_Pack(3, sid, dev, h->dtype);
            tid = key ? PyDict_GetItemWithError(h->tids, key) : NULL;
            Py_XINCREF(tid);
            Py_XDECREF(key);
        }
    }
    Py_XDECREF(sid);
    Py_XDECREF(dev);
    Py_XDECREF(dt);
    if (tid != NULL)
        return tid;
    PyErr_Clear();
    return PyObject_CallOneArg(h->stream_of, stream);
}

static int sh_emit(SyncHook *h, PyObject *const *names, PyObject *const *values, int n,
                   Layout *L) {
    PyObject *ev = new_event(L, h->event_type, names, values, n);
    if (ev == NULL)
        return -1;
    PyObject *r = emit_to(h->emit, ev);
    Py_DECREF(ev);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

/* Report an error of racecheck's own (the program goes on): the exception set now, if any */
static void sh_internal_error(SyncHook *h) {
    PyObject *et, *ev_, *tb;
    PyErr_Fetch(&et, &ev_, &tb);
    PyErr_NormalizeException(&et, &ev_, &tb);
    if (ev_ != NULL) {
        PyObject *a[2] = {ev_, h->where};
        PyObject *r = PyObject_Vectorcall(h->internal_error, a, 2, NULL);
        Py_XDECREF(r);
        PyErr_Clear();
    }
    Py_XDECREF(et);
    Py_XDECREF(ev_);
    Py_XDECREF(tb);
}

/* the event of a record or wait (any error is racecheck's: reported, the program goes on) */
static void sh_report(SyncHook *h, PyObject *ev, PyObject *stream) {
    PyObject *thread = NULL, *eid = NULL, *tid = NULL, *stack = NULL;
    int rc = -1;
    if (!(thread = thread_of(h->tls, h->sink)))
        goto done;
    if (h->kind == HOOK_RECORD) {
        /* EventRecord(thread, _obj_eid(ev), record_tid(stream), capture()) */
        if (!(eid = sh_obj_eid(h, ev, 1)) || !(tid = sh_stream_tid(h, stream)) ||
            !(stack = stack_from(h->capture, h->native_capture, 1)))
            goto done;
        PyObject *names[4] = {s_thread, s_event, s_stream, s_stack};
        PyObject *values[4] = {thread, eid, tid, stack};
        static Layout L;
        rc = sh_emit(h, names, values, 4, &L);
    } else {
        /* StreamWaitEvent(thread, record_tid(stream), _obj_eid(ev), capture()): without trace
           callbacks an event's id lives on the object (a runtime handle is reused once its
           event is destroyed, and nothing reports that) */
        if (!(tid = sh_stream_tid(h, stream)) || !(eid = sh_obj_eid(h, ev, 1)) ||
            !(stack = stack_from(h->capture, h->native_capture, 1)))
            goto done;
        PyObject *names[4] = {s_thread, s_stream, s_event, s_stack};
        PyObject *values[4] = {thread, tid, eid, stack};
        static Layout L;
        rc = sh_emit(h, names, values, 4, &L);
    }
done:
    Py_XDECREF(thread); Py_XDECREF(eid); Py_XDECREF(tid); Py_XDECREF(stack);
    if (rc < 0)
        sh_internal_error(h);
}

/* A graph's replay: the delay hook, the launch, then GraphReplay(thread, gid, tid, capture())
   (reported once launched, so that its cost overlaps the graph's work instead of delaying it) */
static PyObject *sh_replay(SyncHook *h, PyObject *obj) {
    PyObject *d = PyObject_GetAttr(obj, s_dict);
    if (d == NULL)
        return NULL;
    PyObject *got = PyDict_Check(d) ? PyDict_GetItemWithError(d, h->attr) : NULL;
    Py_XINCREF(got);
    Py_DECREF(d);
    if (got == NULL && PyErr_Occurred())
        return NULL;
    int live = got != NULL ? sh_live(h) : 0;
    if (live < 0) {
        Py_DECREF(got);
        return NULL;
    }
    if (!live || !PyTuple_Check(got) || PyTuple_GET_SIZE(got) != 2 ||
        PyTuple_GET_ITEM(got, 0) != h->token) {
        Py_XDECREF(got);
        return PyObject_CallOneArg(h->orig, obj);
    }
    PyObject *tid = sh_stream_tid(h, Py_None);
    if (tid == NULL || before_launch(h->backend, tid, s_graph_replay) < 0) {
        Py_XDECREF(tid);
        Py_DECREF(got);
        return NULL;
    }
    PyObject *out = PyObject_CallOneArg(h->orig, obj);
    if (out != NULL) {
        PyObject *thread = thread_of(h->tls, h->sink), *stack = NULL;
        int rc = -1;
        if (thread != NULL && (stack = stack_from(h->capture, h->native_capture, 1)) != NULL) {
            PyObject *names[4] = {s_thread, s_graph, s_stream, s_stack};
            PyObject *values[4] = {thread, PyTuple_GET_ITEM(got, 1), tid, stack};
            static Layout L;
            rc = sh_emit(h, names, values, 4, &L);
        }
        Py_XDECREF(thread);
        Py_XDECREF(stack);
        if (rc < 0)
            sh_internal_error(h);
    }
    Py_DECREF(tid);
    Py_DECREF(got);
    return out;
}

/* waiter.wait_stream(waitee): the original (torch makes, records and waits on a new event) with
   the record and wait wrappers muted, then StreamWaitStream(thread, waiter, waitee, capture()) */
static PyObject *sh_wait_stream(SyncHook *h, PyObject *waiter, PyObject *waitee) {
    PyObject *args[2] = {waiter, waitee};
    int live = sh_live(h);
    if (live < 0) {
        PyErr_Clear();
        live = 0;
    }
    if (live) {                     /* during a capture the record and wait are graph nodes */
        PyObject *cap = PyObject_GetAttr(h->tls, s_capture_attr);
        if (cap == NULL)
            PyErr_Clear();
        live = cap == Py_None;
        Py_XDECREF(cap);
    }
    if (!live)
        return PyObject_Vectorcall(h->orig, args, 2, NULL);
    PyObject *was = PyObject_GetAttr(h->mute_tls, s_mute), *muted = NULL;
    if (was != NULL && PyLong_CheckExact(was)) {
        long m = PyLong_AsLong(was);
        muted = m == -1 && PyErr_Occurred() ? NULL : PyLong_FromLong(m + 1);
    }
    if (muted == NULL || PyObject_SetAttr(h->mute_tls, s_mute, muted) < 0) {
        Py_XDECREF(was);
        Py_XDECREF(muted);
        PyErr_Clear();              /* not muted: the record and the wait report themselves */
        return PyObject_Vectorcall(h->orig, args, 2, NULL);
    }
    Py_DECREF(muted);
    PyObject *out = PyObject_Vectorcall(h->orig, args, 2, NULL);
    PyObject *et, *ev_, *tb;
    PyErr_Fetch(&et, &ev_, &tb);
    int restored = PyObject_SetAttr(h->mute_tls, s_mute, was);
    Py_DECREF(was);
    if (restored < 0)
        sh_internal_error(h);
    PyErr_Restore(et, ev_, tb);
    if (out == NULL)
        return NULL;
    PyObject *thread = NULL, *a = NULL, *b = NULL, *stack = NULL;
    int rc = -1;
    if ((thread = thread_of(h->tls, h->sink)) && (a = sh_stream_tid(h, waiter)) &&
        (b = sh_stream_tid(h, waitee)) && (stack = stack_from(h->capture, h->native_capture, 1))) {
        PyObject *names[4] = {s_thread, s_waiter, s_waitee, s_stack};
        PyObject *values[4] = {thread, a, b, stack};
        static Layout L;
        rc = sh_emit(h, names, values, 4, &L);
    }
    Py_XDECREF(thread); Py_XDECREF(a); Py_XDECREF(b); Py_XDECREF(stack);
    if (rc < 0)
        sh_internal_error(h);
    return out;
}

static PyObject *sh_call(SyncHook *h, PyObject *obj, PyObject *stream) {
    if (h->kind == HOOK_REPLAY)
        return sh_replay(h, obj);
    if (h->kind == HOOK_WAIT_STREAM)
        return sh_wait_stream(h, obj, stream);
    PyObject *args[2] = {obj, stream};
    PyObject *out = PyObject_Vectorcall(h->orig, args, 2, NULL);
    if (out == NULL)
        return NULL;
    int live = sh_live(h);
    if (live < 0) {
        PyErr_Clear();
        live = 0;
    }
    if (live) {
        PyObject *cap = PyObject_GetAttr(h->tls, s_capture_attr);
        if (cap == NULL)
            PyErr_Clear();
        else if (cap == Py_None)
            sh_report(h, obj, stream);
        Py_XDECREF(cap);
    }
    return out;
}

static PyObject *sh_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf,
                               PyObject *kwnames) {
    SyncHook *h = (SyncHook *)self;
    Py_ssize_t n = PyVectorcall_NARGS(nargsf);
    PyObject *stream = Py_None;
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    int max = h->kind == HOOK_REPLAY ? 1 : 2;
    if (n < 1 || n > max || nkw > (max - n) || (h->kind == HOOK_WAIT_STREAM && n + nkw != 2) ||
        (nkw == 1 && PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, 0), "stream") != 0)) {
        /* an unusual call: the original method says what is wrong with it */
        return PyObject_Vectorcall(h->orig, args, nargsf, kwnames);
    }
    if (n == 2)
        stream = args[1];
    else if (nkw == 1)
        stream = args[1];
    return sh_call(h, args[0], stream);
}

static PyObject *sh_descr_get(PyObject *self, PyObject *obj, PyObject *type) {
    if (obj == NULL || obj == Py_None) {
        Py_INCREF(self);
        return self;
    }
    return PyMethod_New(self, obj);
}

static PyObject *sh_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"kind", "orig", "backend", "globals", "sink", "tls", "mute_tls",
                             "token", "attr", "tids", "dtype", "stream_of", "current_tid",
                             "capture", "emit", "event_type", "internal_error", "where", NULL};
    SyncHook *h = (SyncHook *)type->tp_alloc(type, 0);
    if (h == NULL)
        return NULL;
    PyObject *o[17] = {NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "iOOO!OOOOOO!OOOOOOOO:SyncHook", kwlist,
                                     &h->kind, &o[0], &o[1], &PyDict_Type, &o[2], &o[3], &o[4],
                                     &o[5], &o[6], &o[7], &PyDict_Type, &o[8], &o[9], &o[10],
                                     &o[11], &o[12], &o[13], &o[14], &o[15], &o[16])) {
        Py_DECREF(h);
        return NULL;
    }
    PyObject **dst[17] = {&h->orig, &h->backend, &h->globals, &h->sink, &h->tls, &h->mute_tls,
                          &h->token, &h->attr, &h->tids, &h->dtype, &h->stream_of,
                          &h->current_tid, &h->capture, &h->emit, &h->event_type,
                          &h->internal_error, &h->where};
    for (int i = 0; i < 17; i++) {
        Py_INCREF(o[i]);
        *dst[i] = o[i];
    }
    if (h->kind < HOOK_RECORD || h->kind > HOOK_WAIT_STREAM || !PyType_Check(h->event_type)) {
        PyErr_SetString(PyExc_ValueError, "SyncHook: bad kind or event type");
        Py_DECREF(h);
        return NULL;
    }
    h->native_capture = is_native_capture(h->capture);
    h->vectorcall = sh_vectorcall;
    return (PyObject *)h;
}

static PyTypeObject SyncHookType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "racecheck.instrumentation._speedups.SyncHook",
    .tp_basicsize = sizeof(SyncHook),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "A device backend's Event.record (kind 1), Event.wait (2) or graph replay (3) "
              "wrapper, in C",
    .tp_new = sh_new,
    .tp_dealloc = (destructor)sh_dealloc,
    .tp_traverse = (traverseproc)sh_traverse,
    .tp_clear = (inquiry)sh_clear,
    .tp_call = PyVectorcall_Call,
    .tp_descr_get = sh_descr_get,
    .tp_vectorcall_offset = offsetof(SyncHook, vectorcall),
};

/* ---- the dispatch mode's entry (instrumentation/interceptor.py Interceptor.__torch_dispatch__) */

/* Bound to the mode as its `__torch_dispatch__` (types.MethodType): torch calls it with (mode,
   func, types, args, kwargs) and no Python frame runs for an op whose plan is known. Plans are
   looked up by the OpOverload's address in a table mirroring the interceptor's `_plans` (whose
   OpOverloads the interceptor keeps alive); an op without one takes the Python slow path, which
   makes and stores it. */
typedef struct {
    PyObject *func;             /* borrowed: the interceptor keeps it alive */
    PyObject *plan;             /* owned */
} PlanSlot;

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *sink, *plans, *slow, *plain, *set_eval_frame;
    PlanSlot *slots;
    Py_ssize_t cap, n;
} Dispatch;

static inline Py_ssize_t dp_hash(PyObject *func, Py_ssize_t cap) {
    return (Py_ssize_t)((((uintptr_t)func) >> 4) * 0x9E3779B97F4A7C15ULL >> 20) & (cap - 1);
}

static PyObject *dp_find(Dispatch *d, PyObject *func) {
    if (d->cap == 0)
        return NULL;
    for (Py_ssize_t i = dp_hash(func, d->cap);; i = (i + 1) & (d->cap - 1)) {
        if (d->slots[i].func == func)
            return d->slots[i].plan;
        if (d->slots[i].func == NULL)
            return NULL;
    }
}

static int dp_add(Dispatch *d, PyObject *func, PyObject *plan) {
    if (2 * (d->n + 1) > d->cap) {
        Py_ssize_t cap = d->cap ? 2 * d->cap : 64;
        PlanSlot *s = PyMem_Calloc((size_t)cap, sizeof(PlanSlot));
        if (s == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        for (Py_ssize_t k = 0; k < d->cap; k++) {
            if (d->slots[k].func == NULL)
                continue;
            Py_ssize_t i = dp_hash(d->slots[k].func, cap);
            while (s[i].func != NULL)
                i = (i + 1) & (cap - 1);
            s[i] = d->slots[k];
        }
        PyMem_Free(d->slots);
        d->slots = s;
        d->cap = cap;
    }
    Py_ssize_t i = dp_hash(func, d->cap);
    while (d->slots[i].func != NULL)
        i = (i + 1) & (d->cap - 1);
    Py_INCREF(plan);
    d->slots[i].func = func;
    d->slots[i].plan = plan;
    d->n++;
    return 0;
}

/* The plan of func (borrowed), from the table or the interceptor's dict; NULL: none yet */
static PyObject *dp_plan(Dispatch *d, PyObject *func) {
    PyObject *plan = dp_find(d, func);
    if (plan != NULL)
        return plan;
    PyObject *key = PyLong_FromVoidPtr(func);
    if (key == NULL)
        return NULL;
    plan = PyDict_GetItemWithError(d->plans, key);
    Py_DECREF(key);
    if (plan == NULL || dp_add(d, func, plan) < 0)
        return NULL;
    return plan;
}

static PyObject *dp_run(Dispatch *d, PyObject *func, PyObject *a, PyObject *kw) {
    int checking = attr_true(d->sink, s_checking);
    if (checking < 0)
        return NULL;
    PyObject *cargs[3] = {func, a, kw};
    if (!checking)
        return PyObject_Vectorcall(d->plain, cargs, 3, NULL);
    PyObject *plan = dp_plan(d, func);
    if (plan == NULL) {
        if (PyErr_Occurred())
            return NULL;
        return PyObject_Vectorcall(d->slow, cargs, 3, NULL);
    }
    if (Py_TYPE(plan) == &FastPlanType)
        return plan_call((FastPlan *)plan, func, a, kw);
    if (Py_TYPE(plan) == &SpecialPlanType)
        return sp_run((SpecialPlan *)plan, func, a, kw);
    return PyObject_Vectorcall(plan, cargs, 3, NULL);
}

static PyObject *dp_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf,
                               PyObject *kwnames) {
    Dispatch *d = (Dispatch *)self;
    Py_ssize_t n = PyVectorcall_NARGS(nargsf);
    if (n < 4 || n > 5 || kwnames != NULL || !PyTuple_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "__torch_dispatch__(mode, func, types, args, kwargs)");
        return NULL;
    }
    PyObject *func = args[1], *a = args[3], *kw = n > 4 ? args[4] : Py_None;
    PyObject *own = NULL;
    if (kw == Py_None) {
        if (!(own = kw = PyDict_New()))
            return NULL;
    } else if (!PyDict_Check(kw)) {
        PyErr_SetString(PyExc_TypeError, "__torch_dispatch__: kwargs must be a dict");
        return NULL;
    }
    PyObject *prior = NULL;
    if (d->set_eval_frame != Py_None) {
        /* Dynamo's frame callback off while racecheck runs (TorchDispatchMode's guarantee) */
        if (!(prior = PyObject_CallOneArg(d->set_eval_frame, Py_None))) {
            Py_XDECREF(own);
            return NULL;
        }
    }
    PyObject *result = dp_run(d, func, a, kw);
    if (prior != NULL) {
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
        PyObject *r = PyObject_CallOneArg(d->set_eval_frame, prior);
        Py_DECREF(prior);
        if (r == NULL) {
            if (et != NULL)
                PyErr_Clear();
            else
                Py_CLEAR(result);
        }
        Py_XDECREF(r);
        if (et != NULL)
            PyErr_Restore(et, ev, tb);
    }
    Py_XDECREF(own);
    return result;
}

static int dp_traverse(Dispatch *d, visitproc visit, void *arg) {
    Py_VISIT(d->sink); Py_VISIT(d->plans); Py_VISIT(d->slow); Py_VISIT(d->plain);
    Py_VISIT(d->set_eval_frame);
    for (Py_ssize_t k = 0; k < d->cap; k++)
        Py_VISIT(d->slots[k].plan);
    return 0;
}

static int dp_clear(Dispatch *d) {
    Py_CLEAR(d->sink); Py_CLEAR(d->plans); Py_CLEAR(d->slow); Py_CLEAR(d->plain);
    Py_CLEAR(d->set_eval_frame);
    for (Py_ssize_t k = 0; k < d->cap; k++) {
        d->slots[k].func = NULL;
        Py_CLEAR(d->slots[k].plan);
    }
    d->n = 0;
    return 0;
}

static void dp_dealloc(Dispatch *d) {
    PyObject_GC_UnTrack(d);
    dp_clear(d);
    PyMem_Free(d->slots);
    Py_TYPE(d)->tp_free((PyObject *)d);
}

static PyObject *dp_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"sink", "plans", "slow", "plain", "set_eval_frame", NULL};
    PyObject *sink, *plans, *slow, *plain, *sef;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO!OOO:Dispatch", kwlist, &sink, &PyDict_Type,
                                     &plans, &slow, &plain, &sef))
        return NULL;
    Dispatch *d = (Dispatch *)type->tp_alloc(type, 0);
    if (d == NULL)
        return NULL;
    Py_INCREF(sink); d->sink = sink;
    Py_INCREF(plans); d->plans = plans;
    Py_INCREF(slow); d->slow = slow;
    Py_INCREF(plain); d->plain = plain;
    Py_INCREF(sef); d->set_eval_frame = sef;
    d->vectorcall = dp_vectorcall;
    return (PyObject *)d;
}

static PyTypeObject DispatchType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "racecheck.instrumentation._speedups.Dispatch",
    .tp_basicsize = sizeof(Dispatch),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "Dispatch(sink, plans, slow, plain, set_eval_frame): Interceptor.__torch_dispatch__ "
              "in C, bound to the mode with types.MethodType",
    .tp_new = dp_new,
    .tp_dealloc = (destructor)dp_dealloc,
    .tp_traverse = (traverseproc)dp_traverse,
    .tp_clear = (inquiry)dp_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(Dispatch, vectorcall),
};

static PyMethodDef methods[] = {
#ifdef HAVE_FRAME_API
    {"stack_setup", (PyCFunction)stack_setup, METH_VARARGS,
     "stack_setup(internal, offsets, last, inside, last_limit): share stacks.py's caches"},
    {"capture", (PyCFunction)(void (*)(void))capture, METH_FASTCALL | METH_KEYWORDS,
     "capture(limit=6, skip=2): as instrumentation.stacks.capture"},
#endif
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_speedups",
                                    "racecheck's per-op hot path in C", -1, methods};

PyMODINIT_FUNC PyInit__speedups(void) {
    if (intern_all() < 0)
        return NULL;
    if (PyType_Ready(&FastPlanType) < 0 || PyType_Ready(&EmitterType) < 0 ||
        PyType_Ready(&FootprintsType) < 0 || PyType_Ready(&StreamOfType) < 0 ||
        PyType_Ready(&AllocEmitterType) < 0 || PyType_Ready(&DispatchType) < 0 ||
        PyType_Ready(&SpecialPlanType) < 0 || PyType_Ready(&SyncHookType) < 0)
        return NULL;
#ifdef HAVE_FRAME_API
    if (PyType_Ready(&DeathWatchType) < 0 || PyType_Ready(&RegistrarType) < 0)
        return NULL;
#endif
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
#ifdef HAVE_FRAME_API
    Py_INCREF(&RegistrarType);
    if (PyModule_AddObject(m, "Registrar", (PyObject *)&RegistrarType) < 0) {
        Py_DECREF(&RegistrarType);
        Py_DECREF(m);
        return NULL;
    }
#endif
    PyTypeObject *types[8] = {&FastPlanType, &EmitterType, &FootprintsType, &StreamOfType,
                              &AllocEmitterType, &DispatchType, &SpecialPlanType, &SyncHookType};
    const char *names[8] = {"FastPlan", "Emitter", "Footprints", "StreamOf", "AllocEmitter",
                            "Dispatch", "SpecialPlan", "SyncHook"};
    for (int i = 0; i < 8; i++) {
        Py_INCREF(types[i]);
        if (PyModule_AddObject(m, names[i], (PyObject *)types[i]) < 0) {
            Py_DECREF(types[i]);
            Py_DECREF(m);
            return NULL;
        }
    }
    return m;
}
