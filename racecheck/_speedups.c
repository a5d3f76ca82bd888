/* racecheck._speedups: the per-op hot path in C.

   Two pieces, each a line-by-line port of a Python function that stays the reference (and the
   fallback where this module is not built, or RACECHECK_PURE_PYTHON=1):

   - capture(limit=6, skip=2): instrumentation/stacks.py's capture() and _walk(), sharing their
     caches (the dicts are handed over by stack_setup);
   - on_kernel / read / write: racecheck/checker.py's Checker._on_kernel, _read and _write fast
     paths (one existing segment matching the access exactly, a new storage's first write).
     Anything else calls back into the checker's Python (_read_span, _write_span, _race, ...),
     so the rare paths have one implementation.

   Both work on the same Python objects as the Python code (dicts, lists, tuples), so the two
   implementations can be mixed and compared on one trace. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <frameobject.h>
#include <stddef.h>

#if PY_VERSION_HEX >= 0x030B0000
#define HAVE_FRAME_API 1
#endif

/* ---- interned attribute names ------------------------------------------------------------ */

static PyObject *s_tl, *s_shadow, *s_thread, *s_stream, *s_reads, *s_writes, *s_jh, *s_jv,
    *s_ver, *s_vc, *s_tid, *s_frees, *s_ctx, *s_storage, *s_ranges, *s_born, *s_states,
    *s_bounds, *s_readers, *s_new_host, *s_new_stream, *s_settle_frees, *s_new_shadow,
    *s_race, *s_check_rc007, *s_read_span, *s_write_span, *s_fresh, *s_append, *one;

static PyObject *s_handlers, *s_seq, *s_handler_for, *s_pend, *s_flush, *s_unsited,
    *s_assign_sites;
static PyObject *s_capture_attr, *s_tid_attr, *s_before_launch, *s_host, *s_data_ptr,
    *s_dict, *s_pin_memory, *s_op, *s_stack, *s_thread_tid, *empty_tuple;

static int intern_all(void) {
#define I(var, text) if (!(var = PyUnicode_InternFromString(text))) return -1
    I(s_tl, "_tl"); I(s_shadow, "_shadow"); I(s_thread, "thread"); I(s_stream, "stream");
    I(s_reads, "reads"); I(s_writes, "writes"); I(s_jh, "jh"); I(s_jv, "jv"); I(s_ver, "ver");
    I(s_vc, "vc"); I(s_tid, "tid"); I(s_frees, "frees"); I(s_ctx, "ctx");
    I(s_storage, "storage"); I(s_ranges, "ranges"); I(s_born, "born"); I(s_states, "states");
    I(s_bounds, "bounds"); I(s_readers, "readers"); I(s_new_host, "_new_host");
    I(s_new_stream, "_new_stream"); I(s_settle_frees, "_settle_frees");
    I(s_new_shadow, "_new_shadow"); I(s_race, "_race"); I(s_check_rc007, "_check_rc007");
    I(s_read_span, "_read_span"); I(s_write_span, "_write_span"); I(s_fresh, "_fresh_readers");
    I(s_append, "append");
    I(s_handlers, "_handlers"); I(s_seq, "_seq"); I(s_handler_for, "_handler_for");
    I(s_pend, "_pend"); I(s_flush, "_flush"); I(s_unsited, "_unsited");
    I(s_assign_sites, "_assign_sites"); I(s_capture_attr, "capture"); I(s_tid_attr, "tid");
    I(s_before_launch, "before_launch"); I(s_host, "host"); I(s_data_ptr, "data_ptr");
    I(s_dict, "__dict__"); I(s_pin_memory, "pin_memory"); I(s_op, "op"); I(s_stack, "stack");
    I(s_thread_tid, "thread_tid");
#undef I
    if (!(one = PyLong_FromLong(1)) || !(empty_tuple = PyTuple_New(0)))
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
    PyObject *site = Py_BuildValue("(Ni)", PyLong_FromVoidPtr(code), lasti);
    PyObject *out = NULL, *result = NULL;
    PyFrameObject *f = NULL;
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
    PyFrameObject *f = frame_at(skip - 1);
    if (f == NULL) {
        Py_DECREF(key);
        return PyTuple_New(0);
    }
    PyObject *out = PyList_New(0);
    Py_ssize_t depth = 0, first = -1;
    while (out != NULL && f != NULL) {
        int in = frame_inside(f);
        if (in < 0)
            Py_CLEAR(out);
        else if (!in) {
            if (first < 0)
                first = depth;
            PyObject *e = frame_entry(f);
            if (e == NULL || PyList_Append(out, e) < 0)
                Py_CLEAR(out);
            Py_XDECREF(e);
            if (out != NULL && PyList_GET_SIZE(out) >= limit)
                break;
        }
        if (out == NULL)
            break;
        PyFrameObject *b = PyFrame_GetBack(f);
        Py_DECREF(f);
        f = b;
        depth++;
    }
    Py_XDECREF(f);
    PyObject *result = NULL;
    if (out != NULL) {
        result = PyList_AsTuple(out);
        Py_DECREF(out);
        if (result != NULL && first >= 0) {
            PyObject *v = PyLong_FromSsize_t(first);
            if (v == NULL || PyDict_SetItem(st_offsets, key, v) < 0)
                Py_CLEAR(result);
            Py_XDECREF(v);
        }
    }
    Py_DECREF(key);
    return result;
}
#endif /* HAVE_FRAME_API */

/* ---- checker: shadow memory ---------------------------------------------------------------- */

enum { TL, CLOCK, SEQ, EV, SUB, HOST, GRAPH };

/* Is access record `a` unordered with the point whose clock is vc: a[CLOCK] > vc.get(a[TL], 0)?
   1 / 0 / -1 (error) */
static int unordered(PyObject *a, PyObject *vc) {
    PyObject *clock = PyTuple_GET_ITEM(a, CLOCK);
    PyObject *seen = PyDict_GetItemWithError(vc, PyTuple_GET_ITEM(a, TL));
    if (seen == NULL) {
        if (PyErr_Occurred())
            return -1;
        long long c = PyLong_AsLongLong(clock);
        if (c == -1 && PyErr_Occurred())
            return -1;
        return c > 0;
    }
    return PyObject_RichCompareBool(clock, seen, Py_GT);
}

static int call_void(PyObject *obj, PyObject *name, PyObject *const *args, size_t n) {
    PyObject *stack[10];
    stack[0] = obj;
    for (size_t i = 0; i < n; i++)
        stack[i + 1] = args[i];
    PyObject *r = PyObject_VectorcallMethod(name, stack, (n + 1) | PY_VECTORCALL_ARGUMENTS_OFFSET,
                                            NULL);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return 0;
}

/* bisect_left over a list of ints */
static Py_ssize_t bisect(PyObject *bounds, long long x, int *err) {
    Py_ssize_t lo = 0, hi = PyList_GET_SIZE(bounds);
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        long long v = PyLong_AsLongLong(PyList_GET_ITEM(bounds, mid));
        if (v == -1 && PyErr_Occurred()) {
            *err = 1;
            return 0;
        }
        if (v < x)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static long long item_ll(PyObject *list, Py_ssize_t i, int *err) {
    long long v = PyLong_AsLongLong(PyList_GET_ITEM(list, i));
    if (v == -1 && PyErr_Occurred())
        *err = 1;
    return v;
}

/* The shadow of fp's storage (new reference), made by the checker if there is none. */
static PyObject *shadow_of(PyObject *checker, PyObject *shadows, PyObject *storage) {
    PyObject *sh = PyDict_GetItemWithError(shadows, storage);
    if (sh != NULL) {
        Py_INCREF(sh);
        return sh;
    }
    if (PyErr_Occurred())
        return NULL;
    return PyObject_CallMethodOneArg(checker, s_new_shadow, storage);
}

/* The exact single segment [lo, hi) of a shadow: its index, -1 when there is none, -2 error */
static Py_ssize_t exact_segment(PyObject *bounds, long long lo, long long hi) {
    int err = 0;
    Py_ssize_t n = PyList_GET_SIZE(bounds);
    Py_ssize_t i = bisect(bounds, lo, &err);
    if (err)
        return -2;
    if (i + 1 < n) {
        long long a = item_ll(bounds, i, &err), b = item_ll(bounds, i + 1, &err);
        if (err)
            return -2;
        if (a == lo && b == hi)
            return i;
    }
    return -1;
}

typedef struct {
    PyObject *fp, *sh, *lo, *hi;
} Where;

static int race(PyObject *checker, PyObject *prev, PyObject *rec, int pw, int cw, Where *w) {
    PyObject *args[8] = {prev, rec, pw ? Py_True : Py_False, cw ? Py_True : Py_False,
                         w->fp, w->sh, w->lo, w->hi};
    return call_void(checker, s_race, args, 8);
}

static int read_range(PyObject *checker, PyObject *rec, PyObject *vc, PyObject *tid,
                      PyObject *states, PyObject *bounds, Where *at) {
    long long lo = PyLong_AsLongLong(at->lo), hi = PyLong_AsLongLong(at->hi);
    if (PyErr_Occurred())
        return -1;
    if (lo >= hi)
        return 0;
    Py_ssize_t i = exact_segment(bounds, lo, hi);
    if (i == -2)
        return -1;
    if (i >= 0) {
        PyObject *st = PyList_GET_ITEM(states, i);
        if (st != Py_None) {
            Py_INCREF(st);
            int rc = 0;
            PyObject *w = PyList_GET_ITEM(st, 0);
            Py_INCREF(w);
            if (w != Py_None) {
                int u = unordered(w, vc);
                if (u < 0 || (u && race(checker, w, rec, 1, 0, at) < 0))
                    rc = -1;
                if (rc == 0 && PyTuple_GET_ITEM(w, GRAPH) != Py_None) {
                    PyObject *born = PyObject_GetAttr(at->fp, s_born);
                    if (born == NULL)
                        rc = -1;
                    else if (born != Py_None) {
                        PyObject *args[6] = {w, rec, at->fp, at->sh, at->lo, at->hi};
                        rc = call_void(checker, s_check_rc007, args, 6);
                    }
                    Py_XDECREF(born);
                }
            }
            Py_DECREF(w);
            if (rc == 0 && PyDict_SetItem(PyList_GET_ITEM(st, 1), tid, rec) < 0)
                rc = -1;
            Py_DECREF(st);
            return rc;
        }
    }
    PyObject *args[6] = {at->fp, at->sh, at->lo, at->hi, rec, vc};
    return call_void(checker, s_read_span, args, 6);
}

static int do_read(PyObject *checker, PyObject *shadows, PyObject *fps, PyObject *rec,
                   PyObject *vc) {
    PyObject *seq = PySequence_Fast(fps, "footprints");
    if (seq == NULL)
        return -1;
    PyObject *tid = PyTuple_GET_ITEM(rec, TL);
    int rc = 0;
    for (Py_ssize_t k = 0; rc == 0 && k < PySequence_Fast_GET_SIZE(seq); k++) {
        PyObject *fp = PySequence_Fast_GET_ITEM(seq, k);
        PyObject *storage = PyObject_GetAttr(fp, s_storage);
        if (storage == NULL) {
            rc = -1;
            break;
        }
        PyObject *sh = shadow_of(checker, shadows, storage);
        Py_DECREF(storage);
        if (sh == NULL) {
            rc = -1;
            break;
        }
        PyObject *states = PyObject_GetAttr(sh, s_states);
        PyObject *bounds = PyObject_GetAttr(sh, s_bounds);
        PyObject *ranges = PyObject_GetAttr(fp, s_ranges);
        PyObject *rs = ranges ? PySequence_Fast(ranges, "ranges") : NULL;
        if (states == NULL || bounds == NULL || rs == NULL || !PyList_Check(states) ||
            !PyList_Check(bounds)) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "shadow states/bounds must be lists");
            rc = -1;
        }
        for (Py_ssize_t r = 0; rc == 0 && r < PySequence_Fast_GET_SIZE(rs); r++) {
            PyObject *pair = PySequence_Fast_GET_ITEM(rs, r);
            Where at = {fp, sh, PySequence_GetItem(pair, 0), PySequence_GetItem(pair, 1)};
            if (at.lo == NULL || at.hi == NULL)
                rc = -1;
            else
                rc = read_range(checker, rec, vc, tid, states, bounds, &at);
            Py_XDECREF(at.lo);
            Py_XDECREF(at.hi);
        }
        Py_XDECREF(rs);
        Py_XDECREF(ranges);
        Py_XDECREF(states);
        Py_XDECREF(bounds);
        Py_DECREF(sh);
    }
    Py_DECREF(seq);
    return rc;
}

static int write_range(PyObject *checker, PyObject *rec, PyObject *vc, PyObject *states,
                       PyObject *bounds, Where *at) {
    long long lo = PyLong_AsLongLong(at->lo), hi = PyLong_AsLongLong(at->hi);
    if (PyErr_Occurred())
        return -1;
    if (lo >= hi)
        return 1;       /* nothing written: no readers' note either */
    if (PyList_GET_SIZE(bounds) == 0) {       /* a storage's first access (a new temporary) */
        PyObject *st = Py_BuildValue("[ON]", rec, PyDict_New());
        if (st == NULL || PyList_Append(bounds, at->lo) < 0 || PyList_Append(bounds, at->hi) < 0 ||
            PyList_Append(states, st) < 0) {
            Py_XDECREF(st);
            return -1;
        }
        Py_DECREF(st);
        return 0;
    }
    Py_ssize_t i = exact_segment(bounds, lo, hi);
    if (i == -2)
        return -1;
    if (i >= 0 && PyList_GET_ITEM(states, i) != Py_None) {
        PyObject *st = PyList_GET_ITEM(states, i);
        Py_INCREF(st);
        int rc = 0;
        PyObject *w = PyList_GET_ITEM(st, 0);
        Py_INCREF(w);
        if (w != Py_None) {
            int u = unordered(w, vc);
            if (u < 0 || (u && race(checker, w, rec, 1, 1, at) < 0))
                rc = -1;
        }
        Py_DECREF(w);
        PyObject *readers = PyList_GET_ITEM(st, 1);
        Py_INCREF(readers);
        if (rc == 0 && PyDict_GET_SIZE(readers)) {
            PyObject *vals = PyDict_Values(readers);
            if (vals == NULL)
                rc = -1;
            for (Py_ssize_t k = 0; rc == 0 && k < PyList_GET_SIZE(vals); k++) {
                PyObject *pr = PyList_GET_ITEM(vals, k);
                int u = unordered(pr, vc);
                if (u < 0 || (u && race(checker, pr, rec, 0, 1, at) < 0))
                    rc = -1;
            }
            Py_XDECREF(vals);
            if (rc == 0)
                PyDict_Clear(readers);
        }
        Py_DECREF(readers);
        if (rc == 0) {
            Py_INCREF(rec);
            if (PyList_SetItem(st, 0, rec) < 0)
                rc = -1;
        }
        Py_DECREF(st);
        return rc;
    }
    PyObject *args[6] = {at->fp, at->sh, at->lo, at->hi, rec, vc};
    return call_void(checker, s_write_span, args, 6);
}

static int do_write(PyObject *checker, PyObject *shadows, PyObject *fps, PyObject *rec,
                    PyObject *vc, PyObject *graph) {
    PyObject *seq = PySequence_Fast(fps, "footprints");
    if (seq == NULL)
        return -1;
    int rc = 0;
    for (Py_ssize_t k = 0; rc == 0 && k < PySequence_Fast_GET_SIZE(seq); k++) {
        PyObject *fp = PySequence_Fast_GET_ITEM(seq, k);
        PyObject *storage = PyObject_GetAttr(fp, s_storage);
        if (storage == NULL) {
            rc = -1;
            break;
        }
        PyObject *sh = shadow_of(checker, shadows, storage);
        Py_DECREF(storage);
        if (sh == NULL) {
            rc = -1;
            break;
        }
        PyObject *states = PyObject_GetAttr(sh, s_states);
        PyObject *bounds = PyObject_GetAttr(sh, s_bounds);
        PyObject *rd = PyObject_GetAttr(sh, s_readers);
        PyObject *ranges = PyObject_GetAttr(fp, s_ranges);
        PyObject *rs = ranges ? PySequence_Fast(ranges, "ranges") : NULL;
        int has_rd = rd ? PyObject_IsTrue(rd) : -1;
        if (states == NULL || bounds == NULL || rs == NULL || has_rd < 0 ||
            !PyList_Check(states) || !PyList_Check(bounds)) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "shadow states/bounds must be lists");
            rc = -1;
        }
        for (Py_ssize_t r = 0; rc == 0 && r < PySequence_Fast_GET_SIZE(rs); r++) {
            PyObject *pair = PySequence_Fast_GET_ITEM(rs, r);
            Where at = {fp, sh, PySequence_GetItem(pair, 0), PySequence_GetItem(pair, 1)};
            int w = (at.lo == NULL || at.hi == NULL) ? -1
                    : write_range(checker, rec, vc, states, bounds, &at);
            if (w < 0)
                rc = -1;
            else if (w == 0 && has_rd) {
                PyObject *args[4] = {rd, at.lo, at.hi, graph};
                rc = call_void(checker, s_fresh, args, 4);
            }
            Py_XDECREF(at.lo);
            Py_XDECREF(at.hi);
        }
        Py_XDECREF(rs);
        Py_XDECREF(ranges);
        Py_XDECREF(rd);
        Py_XDECREF(states);
        Py_XDECREF(bounds);
        Py_DECREF(sh);
    }
    Py_DECREF(seq);
    return rc;
}

static PyObject *c_read(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4 || !PyTuple_Check(args[2]) || !PyDict_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "read(checker, fps, rec, vc)");
        return NULL;
    }
    PyObject *shadows = PyObject_GetAttr(args[0], s_shadow);
    if (shadows == NULL)
        return NULL;
    int rc = do_read(args[0], shadows, args[1], args[2], args[3]);
    Py_DECREF(shadows);
    if (rc < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *c_write(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5 || !PyTuple_Check(args[2]) || !PyDict_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "write(checker, fps, rec, vc, graph)");
        return NULL;
    }
    PyObject *shadows = PyObject_GetAttr(args[0], s_shadow);
    if (shadows == NULL)
        return NULL;
    int rc = do_write(args[0], shadows, args[1], args[2], args[3], args[4]);
    Py_DECREF(shadows);
    if (rc < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* clocks.join(dst, src): pointwise max in place */
static int join(PyObject *dst, PyObject *src) {
    Py_ssize_t pos = 0;
    PyObject *k, *v;
    while (PyDict_Next(src, &pos, &k, &v)) {
        PyObject *d = PyDict_GetItemWithError(dst, k);
        int gt;
        if (d == NULL) {
            if (PyErr_Occurred())
                return -1;
            long long c = PyLong_AsLongLong(v);
            if (c == -1 && PyErr_Occurred())
                return -1;
            gt = c > 0;
        } else {
            gt = PyObject_RichCompareBool(v, d, Py_GT);
            if (gt < 0)
                return -1;
        }
        if (gt && PyDict_SetItem(dst, k, v) < 0)
            return -1;
    }
    return 0;
}

/* The timeline of `tid` in tls (new reference), made by `maker` when it is new. */
static PyObject *timeline(PyObject *checker, PyObject *tls, PyObject *tid, PyObject *maker) {
    PyObject *t = PyDict_GetItemWithError(tls, tid);
    if (t != NULL) {
        Py_INCREF(t);
        return t;
    }
    if (PyErr_Occurred())
        return NULL;
    return PyObject_CallMethodOneArg(checker, maker, tid);
}

/* Checker._on_kernel */
static PyObject *c_on_kernel(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "on_kernel(checker, ev, seq)");
        return NULL;
    }
    PyObject *checker = args[0], *ev = args[1], *seq = args[2];
    PyObject *tls = NULL, *thread = NULL, *stream = NULL, *h = NULL, *s = NULL, *jh = NULL,
             *jv = NULL, *ver = NULL, *vc = NULL, *tid = NULL, *c = NULL, *frees = NULL,
             *rec = NULL, *ctx = NULL, *fps = NULL, *shadows = NULL;
    PyObject *result = NULL;
    if (!(tls = PyObject_GetAttr(checker, s_tl)) || !(thread = PyObject_GetAttr(ev, s_thread)) ||
        !(stream = PyObject_GetAttr(ev, s_stream)))
        goto done;
    if (!(h = timeline(checker, tls, thread, s_new_host)) ||
        !(s = timeline(checker, tls, stream, s_new_stream)))
        goto done;
    if (!(jh = PyObject_GetAttr(s, s_jh)) || !(jv = PyObject_GetAttr(s, s_jv)) ||
        !(ver = PyObject_GetAttr(h, s_ver)))
        goto done;
    int same = jh == h ? PyObject_RichCompareBool(jv, ver, Py_EQ) : 0;
    if (same < 0)
        goto done;
    if (!(vc = PyObject_GetAttr(s, s_vc)) || !PyDict_Check(vc))
        goto done;
    if (!same) {
        PyObject *hvc = PyObject_GetAttr(h, s_vc);
        if (hvc == NULL)
            goto done;
        int rc = PyDict_Check(hvc) ? join(vc, hvc) : -1;
        Py_DECREF(hvc);
        if (rc < 0 || PyObject_SetAttr(s, s_jh, h) < 0 || PyObject_SetAttr(s, s_jv, ver) < 0)
            goto done;
    }
    if (!(tid = PyObject_GetAttr(s, s_tid)))
        goto done;
    PyObject *old = PyDict_GetItemWithError(vc, tid);
    if (old == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetObject(PyExc_KeyError, tid);
        goto done;
    }
    if (!(c = PyNumber_Add(old, one)) || PyDict_SetItem(vc, tid, c) < 0)
        goto done;
    if (!(frees = PyObject_GetAttr(s, s_frees)))
        goto done;
    int any = PyObject_IsTrue(frees);
    if (any < 0)
        goto done;
    if (any) {
        PyObject *a[2] = {s, ev};
        if (call_void(checker, s_settle_frees, a, 2) < 0)
            goto done;
    }
    if (!(rec = PyTuple_Pack(7, tid, c, seq, ev, Py_None, Py_False, Py_None)))
        goto done;
    if (!(ctx = PyObject_GetAttr(s, s_ctx)))
        goto done;
    PyObject *r = PyObject_CallMethodOneArg(ctx, s_append, rec);
    if (r == NULL)
        goto done;
    Py_DECREF(r);
    if (!(shadows = PyObject_GetAttr(checker, s_shadow)))
        goto done;
    if (!(fps = PyObject_GetAttr(ev, s_reads)))
        goto done;
    any = PyObject_IsTrue(fps);
    if (any < 0 || (any && do_read(checker, shadows, fps, rec, vc) < 0))
        goto done;
    Py_CLEAR(fps);
    if (!(fps = PyObject_GetAttr(ev, s_writes)))
        goto done;
    any = PyObject_IsTrue(fps);
    if (any < 0 || (any && do_write(checker, shadows, fps, rec, vc, Py_None) < 0))
        goto done;
    result = Py_None;
    Py_INCREF(result);
done:
    Py_XDECREF(tls); Py_XDECREF(thread); Py_XDECREF(stream); Py_XDECREF(h); Py_XDECREF(s);
    Py_XDECREF(jh); Py_XDECREF(jv); Py_XDECREF(ver); Py_XDECREF(vc); Py_XDECREF(tid);
    Py_XDECREF(c); Py_XDECREF(frees); Py_XDECREF(rec); Py_XDECREF(ctx); Py_XDECREF(fps);
    Py_XDECREF(shadows);
    if (result == NULL && !PyErr_Occurred())
        PyErr_SetString(PyExc_TypeError, "on_kernel: unexpected checker state");
    return result;
}

/* Checker.process_all */

static PyObject *c_process_all(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "process_all(checker, sited_types, events)");
        return NULL;
    }
    PyObject *checker = args[0], *sited = args[1];
    PyObject *handlers = PyObject_GetAttr(checker, s_handlers);
    PyObject *seq_obj = handlers ? PyObject_GetAttr(checker, s_seq) : NULL;
    PyObject *events = seq_obj ? PySequence_Fast(args[2], "events") : NULL;
    if (events == NULL) {
        Py_XDECREF(handlers);
        Py_XDECREF(seq_obj);
        return NULL;
    }
    long long seq = PyLong_AsLongLong(seq_obj);
    Py_DECREF(seq_obj);
    int ok = !(seq == -1 && PyErr_Occurred());
    for (Py_ssize_t k = 0; ok && k < PySequence_Fast_GET_SIZE(events); k++) {
        PyObject *ev = PySequence_Fast_GET_ITEM(events, k);
        PyObject *s = PyLong_FromLongLong(seq);
        seq++;              /* counted even if the handler raises, as in process() */
        if (s == NULL) {
            ok = 0;
            break;
        }
        PyObject *h = PyDict_GetItemWithError(handlers, (PyObject *)Py_TYPE(ev));
        if (h != NULL)
            Py_INCREF(h);
        else if (!PyErr_Occurred())
            h = PyObject_CallMethodOneArg(checker, s_handler_for, ev);
        if (h == NULL) {
            Py_DECREF(s);
            ok = 0;
            break;
        }
        if (h != Py_None) {
            PyObject *cargs[2] = {ev, s};
            PyObject *r = PyObject_Vectorcall(h, cargs, 2, NULL);
            ok = r != NULL;
            Py_XDECREF(r);
            PyObject *pend = ok ? PyObject_GetAttr(checker, s_pend) : NULL;
            int any = pend ? PyObject_IsTrue(pend) : -1;
            Py_XDECREF(pend);
            if (ok && (any < 0 || (any && call_void(checker, s_flush, NULL, 0) < 0)))
                ok = 0;
            PyObject *uns = ok ? PyObject_GetAttr(checker, s_unsited) : NULL;
            any = uns ? PyObject_IsTrue(uns) : -1;
            Py_XDECREF(uns);
            if (ok && any < 0)
                ok = 0;
            if (ok && any) {
                int is = PyObject_IsInstance(ev, sited);
                if (is < 0 || (is && call_void(checker, s_assign_sites, &ev, 1) < 0))
                    ok = 0;
            }
        }
        Py_DECREF(h);
        Py_DECREF(s);
    }
    Py_DECREF(events);
    Py_DECREF(handlers);
    /* the counter is stored once, also when a handler raised (the recorder reads it to name
       the failing event) */
    PyObject *exc_type, *exc_value, *exc_tb;
    PyErr_Fetch(&exc_type, &exc_value, &exc_tb);
    PyObject *n = PyLong_FromLongLong(seq);
    int set = n != NULL && PyObject_SetAttr(checker, s_seq, n) == 0;
    Py_XDECREF(n);
    if (exc_type != NULL) {
        if (!set)
            PyErr_Clear();
        PyErr_Restore(exc_type, exc_value, exc_tb);
        return NULL;
    }
    if (!ok || !set)
        return NULL;
    Py_INCREF(checker);
    return checker;
}

/* ---- the dispatch mode's plan for a plain kernel (instrumentation/interceptor.py) ----------- */


enum { ROLE_READ = 0, ROLE_WRITE = 1, ROLE_READ_WRITE = 2 };

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *pinned, *names, *kernel, *oc, *tls, *attr, *tok, *fp, *capture, *stream_fn,
        *backend, *call, *execute, *outs, *sink, *emit, *kernel_type, *name, *tensor;
    int by_device, direct, out_mode;
    Py_ssize_t need, nspec;
    Py_ssize_t index[16];
    int role[16];
} FastPlan;

static int fp_traverse(FastPlan *p, visitproc visit, void *arg) {
    Py_VISIT(p->pinned); Py_VISIT(p->names); Py_VISIT(p->kernel); Py_VISIT(p->oc);
    Py_VISIT(p->tls); Py_VISIT(p->attr); Py_VISIT(p->tok); Py_VISIT(p->fp);
    Py_VISIT(p->capture); Py_VISIT(p->stream_fn); Py_VISIT(p->backend); Py_VISIT(p->call);
    Py_VISIT(p->execute); Py_VISIT(p->outs); Py_VISIT(p->sink); Py_VISIT(p->emit);
    Py_VISIT(p->kernel_type); Py_VISIT(p->name); Py_VISIT(p->tensor);
    return 0;
}

static int fp_clear(FastPlan *p) {
    Py_CLEAR(p->pinned); Py_CLEAR(p->names); Py_CLEAR(p->kernel); Py_CLEAR(p->oc);
    Py_CLEAR(p->tls); Py_CLEAR(p->attr); Py_CLEAR(p->tok); Py_CLEAR(p->fp);
    Py_CLEAR(p->capture); Py_CLEAR(p->stream_fn); Py_CLEAR(p->backend); Py_CLEAR(p->call);
    Py_CLEAR(p->execute); Py_CLEAR(p->outs); Py_CLEAR(p->sink); Py_CLEAR(p->emit);
    Py_CLEAR(p->kernel_type); Py_CLEAR(p->name); Py_CLEAR(p->tensor);
    return 0;
}

static void fp_dealloc(FastPlan *p) {
    PyObject_GC_UnTrack(p);
    fp_clear(p);
    Py_TYPE(p)->tp_free((PyObject *)p);
}

static PyObject *fallback(FastPlan *p, PyObject *func, PyObject *a, PyObject *kw) {
    PyObject *args[4] = {func, a, kw, p->oc};
    return PyObject_Vectorcall(p->kernel, args, 4, NULL);
}

/* The footprint of tensor t from its cache (new reference), else from fp(t); NULL + no error:
   fall back to the generic path. */
static PyObject *cached_fp(FastPlan *p, PyObject *t, int *fallback_needed) {
    PyObject *d = PyObject_GetAttr(t, s_dict);
    if (d == NULL)
        return NULL;
    PyObject *hit = PyDict_Check(d) ? PyDict_GetItemWithError(d, p->attr) : NULL;
    PyObject *f = NULL;
    if (hit != NULL && PyTuple_Check(hit) && PyTuple_GET_SIZE(hit) == 3) {
        int same = PyObject_RichCompareBool(PyTuple_GET_ITEM(hit, 0), p->tok, Py_EQ);
        if (same > 0) {
            PyObject *ptr = PyObject_CallMethodNoArgs(t, s_data_ptr);
            same = ptr ? PyObject_RichCompareBool(PyTuple_GET_ITEM(hit, 1), ptr, Py_EQ) : -1;
            Py_XDECREF(ptr);
        }
        if (same < 0) {
            Py_DECREF(d);
            return NULL;
        }
        if (same) {
            f = PyTuple_GET_ITEM(hit, 2);
            Py_INCREF(f);
        }
    }
    Py_DECREF(d);
    if (f == NULL) {
        if (PyErr_Occurred())
            return NULL;
        f = PyObject_CallOneArg(p->fp, t);
        if (f == NULL)
            return NULL;
        if (f == Py_None) {
            Py_DECREF(f);
            *fallback_needed = 1;
            return NULL;
        }
    }
    PyObject *host = PyObject_GetAttr(f, s_host);
    int h = host ? PyObject_IsTrue(host) : -1;
    Py_XDECREF(host);
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
    PyTypeObject *tp = (PyTypeObject *)p->kernel_type;
    PyObject *ev = tp->tp_new(tp, empty_tuple, NULL);
    if (ev == NULL)
        return NULL;
    if (PyObject_SetAttr(ev, s_thread, thread) < 0 || PyObject_SetAttr(ev, s_stream, stream) < 0 ||
        PyObject_SetAttr(ev, s_reads, reads) < 0 || PyObject_SetAttr(ev, s_writes, writes) < 0 ||
        PyObject_SetAttr(ev, s_op, p->name) < 0 || PyObject_SetAttr(ev, s_stack, stack) < 0) {
        Py_DECREF(ev);
        return NULL;
    }
    return ev;
}

static PyObject *plan_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf,
                                 PyObject *kwnames) {
    FastPlan *p = (FastPlan *)self;
    if (PyVectorcall_NARGS(nargsf) != 3 || kwnames != NULL || !PyTuple_Check(args[1]) ||
        !PyDict_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "plan(func, args, kwargs)");
        return NULL;
    }
    PyObject *func = args[0], *a = args[1], *kw = args[2];
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
        int is = PyObject_IsInstance(t, p->tensor);
        if (is < 0)
            goto done;
        if (is) {
            int fb = 0;
            fps[k] = cached_fp(p, t, &fb);
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
    if (!(stack = PyObject_CallNoArgs(p->capture)))
        goto done;
    if (p->by_device) {
        PyObject *sargs[2] = {a, kw};
        stream = PyObject_Vectorcall(p->stream_fn, sargs, 2, NULL);
    } else {
        stream = PyObject_CallNoArgs(p->stream_fn);
    }
    if (stream == NULL)
        goto done;
    PyObject *hook = PyObject_GetAttr(p->backend, s_before_launch);
    if (hook == NULL)
        goto done;
    if (hook != Py_None) {
        PyObject *hargs[2] = {stream, p->name};
        PyObject *r = PyObject_Vectorcall(hook, hargs, 2, NULL);
        Py_DECREF(hook);
        if (r == NULL)
            goto done;
        Py_DECREF(r);
    } else {
        Py_DECREF(hook);
    }
    if (p->direct) {
        out = PyObject_Call(p->call, a, PyDict_GET_SIZE(kw) ? kw : NULL);
    } else {
        PyObject *eargs[4] = {stream, func, a, kw};
        out = PyObject_Vectorcall(p->execute, eargs, 4, NULL);
    }
    if (out == NULL)
        goto done;
    PyObject *extra = NULL;
    if (p->out_mode == 1 && PyObject_IsInstance(out, p->tensor) == 1) {
        PyObject *f = PyObject_CallOneArg(p->fp, out);
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
        if (PyErr_Occurred())
            goto done;
        extra = PyObject_CallOneArg(p->outs, out);
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
    if (!(thread = PyObject_GetAttr(p->tls, s_tid_attr)))
        goto done;
    if (thread == Py_None) {
        Py_DECREF(thread);
        if (!(thread = PyObject_CallMethodNoArgs(p->sink, s_thread_tid)))
            goto done;
    }
    if (!(ev = make_kernel(p, thread, stream, reads, writes, stack)))
        goto done;
    PyObject *r = PyObject_CallOneArg(p->emit, ev);
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

static PyObject *plan_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"pinned", "names", "kernel", "oc", "tls", "attr", "tok", "fp",
                             "capture", "stream_fn", "by_device", "backend", "call", "direct",
                             "execute", "out_mode", "outs", "sink", "emit", "kernel_type",
                             "name", "tensor", "need", "spec", NULL};
    FastPlan *p = (FastPlan *)type->tp_alloc(type, 0);
    if (p == NULL)
        return NULL;
    PyObject *spec;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO!OOOO!OOOOpOOpOiOOOOO!OnO!:FastPlan", kwlist,
                                     &p->pinned, &PyFrozenSet_Type, &p->names, &p->kernel,
                                     &p->oc, &p->tls, &PyUnicode_Type, &p->attr, &p->tok, &p->fp,
                                     &p->capture, &p->stream_fn, &p->by_device, &p->backend,
                                     &p->call, &p->direct, &p->execute, &p->out_mode, &p->outs,
                                     &p->sink, &p->emit, &p->kernel_type, &PyUnicode_Type,
                                     &p->name, &p->tensor, &p->need, &PyTuple_Type, &spec)) {
        p->pinned = p->names = p->kernel = p->oc = p->tls = p->attr = p->tok = p->fp = NULL;
        p->capture = p->stream_fn = p->backend = p->call = p->execute = p->outs = NULL;
        p->sink = p->emit = p->kernel_type = p->name = p->tensor = NULL;
        Py_DECREF(p);
        return NULL;
    }
    Py_INCREF(p->pinned); Py_INCREF(p->names); Py_INCREF(p->kernel); Py_INCREF(p->oc);
    Py_INCREF(p->tls); Py_INCREF(p->attr); Py_INCREF(p->tok); Py_INCREF(p->fp);
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
    p->vectorcall = plan_vectorcall;
    return (PyObject *)p;
}

static PyObject *plan_call(PyObject *self, PyObject *args, PyObject *kwargs) {
    return PyVectorcall_Call(self, args, kwargs);
}

static PyTypeObject FastPlanType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "racecheck._speedups.FastPlan",
    .tp_basicsize = sizeof(FastPlan),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "The plan of a plain kernel (interceptor._fast_kernel's source, in C)",
    .tp_new = plan_new,
    .tp_dealloc = (destructor)fp_dealloc,
    .tp_traverse = (traverseproc)fp_traverse,
    .tp_clear = (inquiry)fp_clear,
    .tp_call = plan_call,
    .tp_vectorcall_offset = offsetof(FastPlan, vectorcall),
};

static PyMethodDef methods[] = {
#ifdef HAVE_FRAME_API
    {"stack_setup", (PyCFunction)stack_setup, METH_VARARGS,
     "stack_setup(internal, offsets, last, inside, last_limit): share stacks.py's caches"},
    {"capture", (PyCFunction)(void (*)(void))capture, METH_FASTCALL | METH_KEYWORDS,
     "capture(limit=6, skip=2): as instrumentation.stacks.capture"},
#endif
    {"on_kernel", (PyCFunction)(void (*)(void))c_on_kernel, METH_FASTCALL,
     "on_kernel(checker, ev, seq): as Checker._on_kernel"},
    {"read", (PyCFunction)(void (*)(void))c_read, METH_FASTCALL,
     "read(checker, fps, rec, vc): as Checker._read"},
    {"process_all", (PyCFunction)(void (*)(void))c_process_all, METH_FASTCALL,
     "process_all(checker, sited_types, events): as Checker.process_all"},
    {"write", (PyCFunction)(void (*)(void))c_write, METH_FASTCALL,
     "write(checker, fps, rec, vc, graph): as Checker._write"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_speedups",
                                    "racecheck's per-op hot path in C", -1, methods};

PyMODINIT_FUNC PyInit__speedups(void) {
    if (intern_all() < 0)
        return NULL;
    if (PyType_Ready(&FastPlanType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&FastPlanType);
    if (PyModule_AddObject(m, "FastPlan", (PyObject *)&FastPlanType) < 0) {
        Py_DECREF(&FastPlanType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
