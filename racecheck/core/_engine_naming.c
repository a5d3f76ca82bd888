/* Names (the checker's naming concern: _on_name_tensor, _on_stale_tolerant, _on_name_timeline,
   timeline_name): cold, so kept in the Python checker's own form. */
#include "_engine.h"

/* Checker._on_name_tensor */
int on_name_tensor(Engine *e, PyObject *ev, int64_t seq) {
    PyObject *storage = field(e, E_NAME_TENSOR, ev, F_STORAGE), *lo = field(e, E_NAME_TENSOR, ev, F_LO),
             *hi = field(e, E_NAME_TENSOR, ev, F_HI), *name = field(e, E_NAME_TENSOR, ev, F_NAME),
             *rb = field(e, E_NAME_TENSOR, ev, F_ROW_BYTES), *is = field(e, E_NAME_TENSOR, ev, F_ITEMSIZE);
    int64_t st;
    if (!storage || !lo || !hi || !name || !rb || !is || !as_i64(storage, &st))
        return HANDOVER;
    int rbt = PyObject_IsTrue(rb), ist = PyObject_IsTrue(is);
    if (rbt < 0 || ist < 0)
        return -1;
    int h = tl_get(e, field(e, E_NAME_TENSOR, ev, F_THREAD), 1);
    if (h < 0)
        return h == -2 ? HANDOVER : -1;
    PyObject *lst = PyDict_GetItemWithError(e->names, storage);
    if (lst == NULL) {
        if (PyErr_Occurred())
            return -1;
        lst = PyList_New(0);
        if (lst == NULL || PyDict_SetItem(e->names, storage, lst) < 0) {
            Py_XDECREF(lst);
            return -1;
        }
        Py_DECREF(lst);
    }
    e->name_order++;
    PyObject *zero = PyLong_FromLong(0), *one = PyLong_FromLong(1),
             *order = PyLong_FromLongLong(e->name_order);
    PyObject *cls = kit(e, "_Name");
    PyObject *entry = NULL;
    if (zero && one && order && cls) {
        PyObject *args[6] = {lo, hi, name, rbt ? rb : zero, ist ? is : one, order};
        entry = PyObject_Vectorcall(cls, args, 6, NULL);
    }
    Py_XDECREF(zero);
    Py_XDECREF(one);
    Py_XDECREF(order);
    if (entry == NULL)
        return -1;
    for (Py_ssize_t k = 0; k < PyList_GET_SIZE(lst); k++) {
        PyObject *old = PyList_GET_ITEM(lst, k);
        PyObject *olo = PyTuple_GET_ITEM(old, 0), *ohi = PyTuple_GET_ITEM(old, 1);
        int a = PyObject_RichCompareBool(olo, lo, Py_EQ);
        int b = a > 0 ? PyObject_RichCompareBool(ohi, hi, Py_EQ) : a;
        if (a < 0 || b < 0) {
            Py_DECREF(entry);
            return -1;
        }
        if (a && b)
            return PyList_SetItem(lst, k, entry) < 0 ? -1 : 1;
    }
    int rc = PyList_Append(lst, entry);
    Py_DECREF(entry);
    return rc < 0 ? -1 : 1;
}

/* Checker._on_stale_tolerant */
int on_stale_tolerant(Engine *e, PyObject *ev, int64_t seq) {
    PyObject *storage = field(e, E_STALE_TOLERANT, ev, F_STORAGE), *lo = field(e, E_STALE_TOLERANT, ev, F_LO),
             *hi = field(e, E_STALE_TOLERANT, ev, F_HI);
    int64_t st;
    if (!storage || !lo || !hi || !as_i64(storage, &st))
        return HANDOVER;
    int h = tl_get(e, field(e, E_STALE_TOLERANT, ev, F_THREAD), 1);
    if (h < 0)
        return h == -2 ? HANDOVER : -1;
    PyObject *cur = PyDict_GetItemWithError(e->tolerant, storage);
    if (cur == NULL && PyErr_Occurred())
        return -1;
    PyObject *empty = cur ? NULL : PyList_New(0);
    if (!cur && !empty)
        return -1;
    PyObject *add = kit(e, "iv_add");
    PyObject *args[3] = {cur ? cur : empty, lo, hi};
    PyObject *r = add ? PyObject_Vectorcall(add, args, 3, NULL) : NULL;
    Py_XDECREF(empty);
    if (r == NULL)
        return -1;
    int rc = PyDict_SetItem(e->tolerant, storage, r);
    Py_DECREF(r);
    return rc < 0 ? -1 : 1;
}

/* Checker._on_name_timeline */
int on_name_timeline(Engine *e, PyObject *ev, int64_t seq) {
    PyObject *tid = field(e, E_NAME_TIMELINE, ev, F_TIMELINE), *name = field(e, E_NAME_TIMELINE, ev, F_NAME),
             *is_host = field(e, E_NAME_TIMELINE, ev, F_IS_HOST), *device = field(e, E_NAME_TIMELINE, ev, F_DEVICE);
    int64_t ti;
    if (!tid || !name || !is_host || !device || !as_i64(tid, &ti))
        return HANDOVER;
    int host = PyObject_IsTrue(is_host);
    if (host < 0)
        return -1;
    int h = tl_get(e, field(e, E_NAME_TIMELINE, ev, F_THREAD), 1);
    if (h < 0)
        return h == -2 ? HANDOVER : -1;
    int t = tl_index(e, ti);
    if (t < 0 && (t = tl_new(e, tid, ti, host)) < 0)
        return -1;
    TL *tl = &e->tls[t];
    Py_INCREF(name);
    Py_XSETREF(tl->name, name);
    if (device != Py_None) {
        Py_INCREF(device);
        Py_XSETREF(tl->device, device);
    }
    return 1;
}

/* Checker.timeline_name */
PyObject *timeline_name(Engine *e, PyObject *tid) {
    int64_t ti;
    int i = as_i64(tid, &ti) ? tl_index(e, ti) : -1;
    if (i >= 0) {
        TL *t = &e->tls[i];
        if (t->name != NULL) {
            int truth = PyObject_IsTrue(t->name);
            if (truth < 0)
                return NULL;
            if (truth) {
                Py_INCREF(t->name);
                return t->name;
            }
        }
        return PyUnicode_FromFormat(t->is_host ? "host %S" : "stream %S", tid);
    }
    return PyUnicode_FromFormat("stream %S", tid);
}

