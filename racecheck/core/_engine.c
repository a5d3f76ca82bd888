/* racecheck.core._engine: the happens-before checker's state machine, in C.

   racecheck.core.checker's Checker is the reference: this engine keeps the same state (timelines
   with vector clocks, context windows, shadow memory, event records, allocations, graphs) in C
   structures and runs the same handlers on it for as long as the trace is clean. It never builds
   a finding. Before an event that would note anything (a race, an RC005 hazard, stale graph
   input, an RC007 candidate), or that it does not model, it stops without touching its state;
   `export` then builds the Python Checker's state exactly as the Python handlers would have left
   it, and the Python Checker goes on from that event (racecheck/core/fastchecker.py). A clean trace never
   leaves C; a racy one is reported by the reference code, from its first finding on.

   Every handler names the Checker method it ports; each lives in the file of its concern
   (_engine.h lists them). Each event is handled in two steps: the `*_clean` checks read the state
   and say whether the event can be handled here (nothing is changed before them but what the
   Python handler also does first and idempotently: creating the timelines the event names and
   joining the launch edge), then the update. This file is the loop, the type and the module. */
#include "_engine.h"

PyObject *str_stream, *str_event, *str_device, *s_append, *s_format, *s_index_into;

static PyTypeObject EngineType;

/* ---- event and footprint fields, read straight from their __slots__ ---------------------- */

static const char *const EVENT_CLASSES[E_N] = {
    "Kernel", "Copy", "EventRecord", "StreamWaitEvent", "StreamWaitStream", "HostSync",
    "HostAccess", "Alloc", "Free", "RecordStream", "GraphCapture", "GraphReplay", "NameTensor",
    "StaleTolerant", "NameTimeline"};

static const char *const FIELD_NAMES[F_N] = {
    "thread", "stack", "stream", "reads", "writes", "op", "src", "dst", "non_blocking", "event",
    "waiter", "waitee", "sync_kind", "target", "block", "host", "graph", "ops", "storage", "lo",
    "hi", "name", "row_bytes", "itemsize", "timeline", "is_host", "device"};

/* Footprint and CapturedOp fields */
static const char *const FP_FIELDS[P_N] = {"storage", "ranges", "host", "approx", "born"};
static const char *const COP_FIELDS[C_N] = {"reads", "writes", "op", "stack"};

/* Offset of a __slots__ member `name` of class `cls`, or -1 when it is not a plain slot. */
static Py_ssize_t slot_offset(PyObject *cls, const char *name) {
    PyObject *d = PyObject_GetAttrString(cls, name);
    if (d == NULL) {
        PyErr_Clear();
        return -1;
    }
    Py_ssize_t off = -1;
    if (Py_TYPE(d) == &PyMemberDescr_Type) {
        PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
        if (m->type == T_OBJECT_EX && !(m->flags & READONLY))
            off = m->offset;
    }
    Py_DECREF(d);
    return off;
}


/* ---- the loop ------------------------------------------------------------------------------ */

static const Handler HANDLERS[E_N] = {
    on_kernel, on_copy, on_record, on_wait_event, on_wait_stream, on_host_sync, on_host_access,
    on_alloc, on_free, on_record_stream, on_capture, on_replay, on_name_tensor,
    on_stale_tolerant, on_name_timeline};

/* One event: 1 handled, 0 left to the Python checker (nothing changed, not counted), 2 the
   engine is already inside an event (re-entered from the Python a cold handler calls), -1 error
   (counted, as Checker.process counts an event whose handler raised). */
static int process_one(Engine *e, PyObject *ev) {
    if (e->done)
        return 0;
    if (e->running)
        return 2;
    Py_CLEAR(e->raced);
    int k = event_kind(e, ev);
    if (k < 0)
        return 0;
    PyObject *op = NULL, *stack = NULL;
    int sited = e->nunsited && (k == E_KERNEL || k == E_COPY || k == E_HOST_ACCESS);
    if (sited) {
        op = field(e, k, ev, F_OP);
        stack = field(e, k, ev, F_STACK);
        if (op == NULL || stack == NULL || !PySequence_Check(stack))
            return 0;
    }
    e->nfps = e->nivs = 0;
    e->running = 1;
    int r = HANDLERS[k](e, ev, e->seq);
    e->running = 0;
    if (r == HANDOVER)
        return 0;
    e->seq++;
    if (r < 0 || (sited && assign_sites(e, op, stack) < 0))
        return -1;
    return 1;
}

/* process_all(iterator): None when every event was handled, else the first event the engine
   leaves to the Python checker (not counted; the iterator is left just past it). */
static PyObject *process_iter(Engine *e, PyObject *it) {
    for (;;) {
        PyObject *ev = PyIter_Next(it);
        if (ev == NULL) {
            if (PyErr_Occurred())
                return NULL;
            Py_RETURN_NONE;
        }
        int r = process_one(e, ev);
        if (r == 0)
            return ev;
        Py_DECREF(ev);
        if (r < 0)
            return NULL;
        if (r == 2) {
            PyErr_SetString(PyExc_RuntimeError, "the engine was re-entered");
            return NULL;
        }
    }
}

/* process_all(iterator, namer=None): the namer names tensors in the hazards a free opens */
static PyObject *eng_process_all(Engine *e, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "process_all(iterator, namer=None)");
        return NULL;
    }
    if (e->done) {
        PyErr_SetString(PyExc_RuntimeError, "the engine failed an export");
        return NULL;
    }
    PyObject *prev = e->namer;
    e->namer = nargs > 1 && args[1] != Py_None ? args[1] : NULL;
    PyObject *r = process_iter(e, args[0]);
    e->namer = prev;
    return r;
}

/* apply(event, namer=None): the event the engine last stopped at on a race, which the Python
   checker has judged: its update, as if it were clean (the Python handlers' updates do not
   depend on what they note). */
static PyObject *eng_apply(Engine *e, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "apply(event, namer=None)");
        return NULL;
    }
    if (e->done || e->raced == NULL || e->raced != args[0]) {
        PyErr_SetString(PyExc_RuntimeError, "apply() takes the event the engine last stopped at "
                                             "on a race");
        return NULL;
    }
    PyObject *prev = e->namer;
    e->namer = nargs > 1 && args[1] != Py_None ? args[1] : NULL;
    e->forced = 1;
    int r = process_one(e, args[0]);
    e->forced = 0;
    e->namer = prev;
    if (r < 0)
        return NULL;
    if (r != 1) {
        PyErr_SetString(PyExc_RuntimeError, "the engine stopped again at the event it applies");
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *eng_hazards_open(Engine *e, PyObject *unused) {
    return PyLong_FromSsize_t(PyList_GET_SIZE(e->frees_open));
}

/* ---- the type ------------------------------------------------------------------------------ */

/* export(checker, storages=None): give a Python Checker this state (again after the engine went
   on); with `storages`, the shadow memory of those only (what one event's handler reads) */
static PyObject *eng_export(Engine *e, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "export(checker, storages=None)");
        return NULL;
    }
    if (e->done) {
        PyErr_SetString(PyExc_RuntimeError, "the engine failed an export");
        return NULL;
    }
    if (export_checker(e, args[0], nargs > 1 && args[1] != Py_None ? args[1] : NULL) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* watch_frees(blocks): a Free of one of these blocks stops the engine as a race does (the
   Python checker judges the stale indices it holds open into them, racecheck/core/checker/graphs.py
   _settle_stale_indices) */
static PyObject *eng_watch_frees(Engine *e, PyObject *blocks) {
    PyObject *set = PySet_New(blocks);
    if (set == NULL)
        return NULL;
    Py_XSETREF(e->watched, set);
    Py_RETURN_NONE;
}

static PyObject *eng_keep_seen(Engine *e, PyObject *c) {
    if (keep_seen(e, c) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *eng_timeline_name(Engine *e, PyObject *tid) { return timeline_name(e, tid); }

static PyObject *eng_stats(Engine *e, PyObject *unused) {
    Py_ssize_t segments = 0;
    int64_t key;
    void *val;
    MAP_EACH(&e->shadows, key, val)
        segments += ((Shadow *)val)->n;
    return Py_BuildValue("{s:L,s:i,s:n,s:n,s:n,s:n,s:i}", "events", (long long)e->seq,
                         "timelines", e->ntl, "storages", e->shadows.n, "segments", segments,
                         "event_records", e->records.n, "graphs", e->graphs.n, "findings", 0);
}

static PyObject *eng_get_seq(Engine *e, void *closure) { return PyLong_FromLongLong(e->seq); }
static PyObject *eng_get_done(Engine *e, void *closure) { return PyBool_FromLong(e->done); }
static PyObject *eng_get_raced(Engine *e, void *closure) {
    PyObject *v = e->raced ? e->raced : Py_None;
    Py_INCREF(v);
    return v;
}

static void eng_dealloc(Engine *e) {
    timelines_free(e);
    shadows_free(e);
    blocks_free(e);
    records_free(e);
    graphs_free(e);
    Py_XDECREF(e->names);
    Py_XDECREF(e->tolerant);
    Py_XDECREF(e->kit);
    Py_XDECREF(e->frees_open);
    Py_XDECREF(e->raced);
    Py_XDECREF(e->watched);
    PyMem_Free(e->fps);
    PyMem_Free(e->ivs);
    Py_TYPE(e)->tp_free((PyObject *)e);
}

static PyObject *eng_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"window", "kit", NULL};
    int window;
    PyObject *kitd;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "iO!:Engine", kwlist, &window, &PyDict_Type, &kitd))
        return NULL;
    if (window < 0) {
        PyErr_SetString(PyExc_ValueError, "window must be >= 0");
        return NULL;
    }
    Engine *e = (Engine *)type->tp_alloc(type, 0);
    if (e == NULL)
        return NULL;
    e->window = window;
    e->main = -1;
    Py_INCREF(kitd);
    e->kit = kitd;
    e->names = PyDict_New();
    e->tolerant = PyDict_New();
    e->frees_open = PyList_New(0);
    if (e->names == NULL || e->tolerant == NULL || e->frees_open == NULL) {
        Py_DECREF(e);
        return NULL;
    }
    for (int k = 0; k < E_N; k++) {
        PyObject *cls = PyDict_GetItemString(kitd, EVENT_CLASSES[k]);
        if (cls == NULL || !PyType_Check(cls)) {
            PyErr_Format(PyExc_TypeError, "kit lacks the event class %s", EVENT_CLASSES[k]);
            Py_DECREF(e);
            return NULL;
        }
        e->etype[k] = (PyTypeObject *)cls;
        for (int f = 0; f < F_N; f++)
            e->off[k][f] = slot_offset(cls, FIELD_NAMES[f]);
    }
    PyObject *fpc = PyDict_GetItemString(kitd, "Footprint"), *copc = PyDict_GetItemString(kitd, "CapturedOp");
    if (fpc == NULL || copc == NULL || !PyType_Check(fpc) || !PyType_Check(copc)) {
        PyErr_SetString(PyExc_TypeError, "kit lacks Footprint or CapturedOp");
        Py_DECREF(e);
        return NULL;
    }
    e->fp_type = (PyTypeObject *)fpc;
    e->cop_type = (PyTypeObject *)copc;
    for (int f = 0; f < P_N; f++)
        if ((e->fp_off[f] = slot_offset(fpc, FP_FIELDS[f])) < 0) {
            PyErr_Format(PyExc_TypeError, "Footprint.%s is not a slot", FP_FIELDS[f]);
            Py_DECREF(e);
            return NULL;
        }
    for (int f = 0; f < C_N; f++)
        if ((e->cop_off[f] = slot_offset(copc, COP_FIELDS[f])) < 0) {
            PyErr_Format(PyExc_TypeError, "CapturedOp.%s is not a slot", COP_FIELDS[f]);
            Py_DECREF(e);
            return NULL;
        }
    return (PyObject *)e;
}

static PyMethodDef eng_methods[] = {
    {"process_all", (PyCFunction)(void (*)(void))eng_process_all, METH_FASTCALL,
     "process_all(iterator, namer=None) -> None, or the first event left to the Python checker"},
    {"apply", (PyCFunction)(void (*)(void))eng_apply, METH_FASTCALL,
     "apply(event, namer=None): update the state for the race the engine stopped at"},
    {"hazards_open", (PyCFunction)eng_hazards_open, METH_NOARGS,
     "RC005 hazards open now (Checker._frees_open)"},
    {"export", (PyCFunction)(void (*)(void))eng_export, METH_FASTCALL,
     "export(checker, storages=None): give a Checker this state (with storages: their shadows only)"},
    {"watch_frees", (PyCFunction)eng_watch_frees, METH_O,
     "watch_frees(blocks): stop at a Free of one of these blocks, as at a race"},
    {"keep_seen", (PyCFunction)eng_keep_seen, METH_O,
     "keep_seen(checker): keep the races noted per storage on a checker this engine exported to"},
    {"timeline_name", (PyCFunction)eng_timeline_name, METH_O, "Checker.timeline_name"},
    {"stats", (PyCFunction)eng_stats, METH_NOARGS, "Checker.stats"},
    {NULL}};

static PyGetSetDef eng_getset[] = {
    {"events_processed", (getter)eng_get_seq, NULL, "events handled so far", NULL},
    {"done", (getter)eng_get_done, NULL, "an export failed: the engine cannot go on", NULL},
    {"raced", (getter)eng_get_raced, NULL, "the event the engine last stopped at on a race, or None", NULL},
    {NULL}};

static PyTypeObject EngineType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "racecheck.core._engine.Engine",
    .tp_basicsize = sizeof(Engine),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Engine(window, kit): the happens-before checker's state machine for clean traces",
    .tp_new = eng_new,
    .tp_dealloc = (destructor)eng_dealloc,
    .tp_methods = eng_methods,
    .tp_getset = eng_getset,
};

static struct PyModuleDef engine_module = {PyModuleDef_HEAD_INIT, "racecheck.core._engine",
                                           "The checker's state machine in C (racecheck.core.fastchecker).",
                                           -1, NULL};

PyMODINIT_FUNC PyInit__engine(void) {
    if (PyType_Ready(&EngineType) < 0)
        return NULL;
    /* I: an attribute or method read by name (tests/test_cnames.py checks its Python side);
       V: a string compared against (HostSync.sync_kind values) */
#define I(var, text) if (!(var = PyUnicode_InternFromString(text))) return NULL
#define V(var, text) I(var, text)
    V(str_stream, "stream"); V(str_event, "event"); V(str_device, "device");
    I(s_append, "append"); I(s_format, "format"); I(s_index_into, "index_into");
#undef V
#undef I
    PyObject *m = PyModule_Create(&engine_module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&EngineType);
    if (PyModule_AddObject(m, "Engine", (PyObject *)&EngineType) < 0) {
        Py_DECREF(&EngineType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
