/* The hand-over: the Python Checker's state (racecheck/core/checker/state.py declares it), built as
   its own handlers would have left it. */
#include "_engine.h"

static const char *const KIND_NAMES[] = {"copy", "host", "sync", "record", "wait", "capture",
                                         "replay"};

/* The kit's entry `name` (borrowed), or NULL with KeyError (MemoryError: PyDict_GetItemString would
   hide it) */
PyObject *kit(Engine *e, const char *name) {
    PyObject *key = PyUnicode_FromString(name);
    if (key == NULL)
        return NULL;
    PyObject *v = PyDict_GetItemWithError(e->kit, key);
    Py_DECREF(key);
    if (v == NULL && !PyErr_Occurred())
        PyErr_Format(PyExc_KeyError, "engine kit lacks %s", name);
    return v;
}

/* An export of e's state: 0, or -1 with an exception (ex_end frees what was made either way) */
int ex_begin(Ex *x, Engine *e) {
    *x = (Ex){e, NULL, NULL, NULL, NULL, NULL, 0, 0};
    if ((x->keep = PyList_New(0)) == NULL || (x->ctx_cls = kit(e, "_Ctx")) == NULL ||
        (x->free_cls = kit(e, "_CtxFree")) == NULL)
        return -1;
    if ((x->tl_objs = PyMem_Calloc((size_t)(e->ntl + 1), sizeof(PyObject *))) == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

/* *slot = v, a cache of this export (borrowed: x->keep owns v) */
int ex_cache(Ex *x, PyObject **slot, PyObject *v) {
    if (RESERVE(x->cached, x->cached_cap, x->ncached + 1, 16) < 0)
        return -1;
    x->cached[x->ncached++] = slot;
    *slot = v;
    return 0;
}

void ex_end(Ex *x) {
    for (Py_ssize_t k = 0; k < x->ncached; k++)
        *x->cached[k] = NULL;
    PyMem_Free(x->cached);
    x->cached = NULL;
    x->ncached = x->cached_cap = 0;
    PyMem_Free(x->tl_objs);
    x->tl_objs = NULL;
    Py_CLEAR(x->keep);
}

static PyObject *tid_or_none(Ex *x, int i) {
    PyObject *v = i >= 0 ? x->e->tls[i].tid : Py_None;
    Py_INCREF(v);
    return v;
}

PyObject *rec_out(Ex *x, Rec *r) {
    if (r->out != NULL)
        return r->out;
    PyObject *t = PyTuple_New(7);
    if (t == NULL)
        return NULL;
    PyTuple_SET_ITEM(t, 0, tid_or_none(x, r->tl));
    PyObject *c = PyLong_FromLongLong(r->clock), *s = PyLong_FromLongLong(r->seq);
    if (c == NULL || s == NULL) {
        Py_XDECREF(c);
        Py_XDECREF(s);
        Py_DECREF(t);
        return NULL;
    }
    PyTuple_SET_ITEM(t, 1, c);
    PyTuple_SET_ITEM(t, 2, s);
    Py_INCREF(r->ev);
    PyTuple_SET_ITEM(t, 3, r->ev);
    PyObject *sub = r->sub ? r->sub : Py_None, *host = r->host ? Py_True : Py_False,
             *graph = r->graph ? r->graph : Py_None;
    Py_INCREF(sub);
    Py_INCREF(host);
    Py_INCREF(graph);
    PyTuple_SET_ITEM(t, 4, sub);
    PyTuple_SET_ITEM(t, 5, host);
    PyTuple_SET_ITEM(t, 6, graph);
    int rc = PyList_Append(x->keep, t);
    Py_DECREF(t);
    if (rc < 0 || ex_cache(x, &r->out, t) < 0)
        return NULL;
    return t;
}

static PyObject *vc_out(Ex *x, const VC *vc) {
    PyObject *d = PyDict_New();
    if (d == NULL)
        return NULL;
    for (int i = 0; i < vc->n; i++) {
        if (!vc->has[i])
            continue;
        PyObject *v = PyLong_FromLongLong(vc->v[i]);
        if (v == NULL || PyDict_SetItem(d, x->e->tls[i].tid, v) < 0) {
            Py_XDECREF(v);
            Py_DECREF(d);
            return NULL;
        }
        Py_DECREF(v);
    }
    return d;
}

static PyObject *fmt1(const char *tmpl, PyObject *a, PyObject *b) {
    PyObject *t = PyUnicode_FromString(tmpl);
    if (t == NULL)
        return NULL;
    PyObject *r = b ? PyObject_CallMethod(t, "format", "OO", a, b)
                    : a ? PyObject_CallMethodOneArg(t, s_format, a) : (Py_INCREF(t), t);
    Py_DECREF(t);
    return r;
}

static PyObject *ctx_label(CtxEnt *c) {
    switch (c->label) {
    case L_COPY: return fmt1("{} {}", c->a, c->b);
    case L_HOST: Py_INCREF(c->a); return c->a;
    case L_BLOCKING: return fmt1("blocking {} {}", c->a, c->b);
    case L_RECORD: return fmt1("record event #{}", c->a, NULL);
    case L_WAIT_NOOP: return fmt1("wait_event #{} (no-op: never recorded)", c->a, NULL);
    case L_WAIT: return fmt1("wait_event #{}", c->a, NULL);
    case L_WAIT_STREAM: return PyUnicode_FromString("wait_stream");
    case L_STREAM_SYNC: return PyUnicode_FromString("stream synchronize");
    case L_EVENT_SYNC_NOOP: return fmt1("event #{} synchronize (no-op: never recorded)", c->a, NULL);
    case L_EVENT_SYNC: return fmt1("event #{} synchronize", c->a, NULL);
    case L_DEVICE_SYNC: return PyUnicode_FromString("device synchronize");
    case L_CAPTURE: return fmt1("capture graph {} ({} ops)", c->a, c->b);
    case L_REPLAY: return fmt1("replay graph {}", c->a, NULL);
    }
    PyErr_SetString(PyExc_SystemError, "context label");
    return NULL;
}

static PyObject *ctx_out(Ex *x, CtxEnt *c) {
    if (c->type == CX_REC) {
        PyObject *t = rec_out(x, c->rec);
        Py_XINCREF(t);
        return t;
    }
    if (c->type == CX_FREE)
        return PyObject_CallFunction(x->free_cls, "LO", (long long)c->seq, c->a);
    PyObject *label = ctx_label(c);
    if (label == NULL)
        return NULL;
    PyObject *peer = tid_or_none(x, c->peer);
    PyObject *r = PyObject_CallFunction(x->ctx_cls, "LsOOL", (long long)c->seq, KIND_NAMES[c->kind],
                                        label, peer, (long long)c->edge);
    Py_DECREF(label);
    Py_DECREF(peer);
    return r;
}

static int set_attr_new(PyObject *o, const char *name, PyObject *v) {
    if (v == NULL)
        return -1;
    int rc = PyObject_SetAttrString(o, name, v);
    Py_DECREF(v);
    return rc;
}

static PyObject *ivl_out(const IVL *l) {
    PyObject *out = PyList_New(l->n);
    if (out == NULL)
        return NULL;
    for (int k = 0; k < l->n; k++) {
        PyObject *t = Py_BuildValue("(LL)", (long long)l->v[k].lo, (long long)l->v[k].hi);
        if (t == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, k, t);
    }
    return out;
}

static PyObject *input_out(Ex *x, GInput *inp) {
    if (inp->out != NULL)
        return inp->out;
    PyObject *cls = kit(x->e, "_GraphInput");
    PyObject *o = cls ? PyObject_CallOneArg(cls, inp->storage) : NULL;
    if (o == NULL)
        return NULL;
    int rc = PyList_Append(x->keep, o);
    Py_DECREF(o);
    if (rc < 0 || set_attr_new(o, "read", ivl_out(&inp->read)) < 0 ||
        set_attr_new(o, "ever", ivl_out(&inp->ever)) < 0 ||
        set_attr_new(o, "fresh", ivl_out(&inp->fresh)) < 0)
        return NULL;
    PyObject *ops = PyList_New(inp->nops);
    if (ops == NULL)
        return NULL;
    for (int k = 0; k < inp->nops; k++) {
        PyObject *v = PyLong_FromLong(inp->ops[k]);
        if (v == NULL) {
            Py_DECREF(ops);
            return NULL;
        }
        PyList_SET_ITEM(ops, k, v);
    }
    if (set_attr_new(o, "ops", ops) < 0 || ex_cache(x, &inp->out, o) < 0)
        return NULL;
    return o;
}

/* Every timeline, or (keep != NULL: a view for open_hazards) what Checker._context reads of
   them for accesses since `from_seq`: the whole window of the timelines kept, and the other
   timelines' sync entries into those since then; no clocks, no no-op waits. */
int export_timelines_of(Ex *x, PyObject *c, const char *keep, int64_t from_seq) {
    Engine *e = x->e;
    PyObject *tls = PyDict_New(), *streams = PyList_New(0);
    if (tls == NULL || streams == NULL || PyObject_SetAttrString(c, "_tl", tls) < 0 ||
        PyObject_SetAttrString(c, "_streams", streams) < 0) {
        Py_XDECREF(tls);
        Py_XDECREF(streams);
        return -1;
    }
    Py_DECREF(tls);
    Py_DECREF(streams);
    PyObject *cls = kit(e, "_Timeline");
    if (cls == NULL)
        return -1;
    for (int i = 0; i < e->ntl; i++) {
        TL *t = &e->tls[i];
        PyObject *vc = keep == NULL ? vc_out(x, &t->vc) : PyDict_New();
        if (vc == NULL)
            return -1;
        PyObject *o = PyObject_CallFunction(cls, "OOOi", t->tid, t->is_host ? Py_True : Py_False,
                                            vc, e->window);
        Py_DECREF(vc);
        if (o == NULL)
            return -1;
        int rc = PyDict_SetItem(tls, t->tid, o);
        Py_DECREF(o);
        if (rc < 0)
            return -1;
        x->tl_objs[i] = o;
        if (t->name && PyObject_SetAttrString(o, "name", t->name) < 0)
            return -1;
        if (t->device && PyObject_SetAttrString(o, "device", t->device) < 0)
            return -1;
        if (set_attr_new(o, "ver", PyLong_FromLongLong(t->ver)) < 0 ||
            set_attr_new(o, "jv", PyLong_FromLongLong(t->jv)) < 0)
            return -1;
    }
    for (int k = 0; k < e->nstreams; k++)
        if (PyList_Append(streams, x->tl_objs[e->streams[k]]) < 0)
            return -1;
    for (int i = 0; i < e->ntl; i++) {
        TL *t = &e->tls[i];
        PyObject *o = x->tl_objs[i];
        if (PyObject_SetAttrString(o, "jh", t->jh >= 0 ? x->tl_objs[t->jh] : Py_None) < 0)
            return -1;
        PyObject *ctx = PyObject_GetAttrString(o, "ctx");
        if (ctx == NULL)
            return -1;
        for (int k = 0; k < t->ctx_n; k++) {
            CtxEnt *ce = &t->ctx[(t->ctx_head + k) % e->window];
            if (keep != NULL && !keep[i] &&
                (ce->type != CX_CTX || ce->seq < from_seq || ce->peer < 0 || !keep[ce->peer]))
                continue;
            PyObject *ent = ctx_out(x, ce);
            PyObject *r = ent ? PyObject_CallMethodOneArg(ctx, s_append, ent) : NULL;
            Py_XDECREF(ent);
            if (r == NULL) {
                Py_DECREF(ctx);
                return -1;
            }
            Py_DECREF(r);
        }
        Py_DECREF(ctx);
        if (keep != NULL)
            continue;
        if (t->frees != NULL && set_attr_new(o, "frees", PyList_GetSlice(t->frees, 0, PY_SSIZE_T_MAX)) < 0)
            return -1;
        if (t->noop_made) {
            PyObject *d = PyDict_New(), *wcls = kit(e, "_NoopWait");
            if (d == NULL || wcls == NULL) {
                Py_XDECREF(d);
                return -1;
            }
            for (int k = 0; k < t->noop_n; k++) {
                Noop *n = &t->noop[k];
                PyObject *w = PyObject_CallFunction(wcls, "LOO", (long long)n->seq, n->stack,
                                                    n->host ? Py_True : Py_False);
                if (w == NULL || PyDict_SetItem(d, n->event, w) < 0) {
                    Py_XDECREF(w);
                    Py_DECREF(d);
                    return -1;
                }
                Py_DECREF(w);
            }
            if (set_attr_new(o, "noop", d) < 0)
                return -1;
        }
    }
    return PyObject_SetAttrString(c, "_main", e->main >= 0 ? x->tl_objs[e->main] : Py_None);
}

static int export_timelines(Ex *x, PyObject *c) { return export_timelines_of(x, c, NULL, 0); }

/* One storage's StorageShadow, as _new_shadow and the handlers would have left it, into the
   checker's `shadows` dict */
static int shadow_out(Ex *x, PyObject *shadows, PyObject *cls, Shadow *sh) {
    Engine *e = x->e;
    Readers *rd = readers_get(e, sh->st);
    PyObject *o = PyObject_CallFunction(cls, "OO", sh->storage, rd ? rd->out : Py_None);
    if (o == NULL)
        return -1;
    int rc = PyDict_SetItem(shadows, sh->storage, o);
    Py_DECREF(o);
    if (rc < 0)
        return -1;
    PyObject *bounds = PyList_New(nbounds(sh)), *states = PyList_New(sh->n);
    if (bounds == NULL || states == NULL) {
        Py_XDECREF(bounds);
        Py_XDECREF(states);
        return -1;
    }
    for (int k = 0; k < nbounds(sh); k++) {
        PyObject *v = PyLong_FromLongLong(sh->bounds[k]);
        if (v == NULL) {
            Py_DECREF(bounds);
            Py_DECREF(states);
            return -1;
        }
        PyList_SET_ITEM(bounds, k, v);
    }
    for (int k = 0; k < sh->n; k++) {
        Seg *s = &sh->segs[k];
        PyObject *st;
        if (s->gap) {
            Py_INCREF(Py_None);
            st = Py_None;
        } else {
            PyObject *w = s->w ? rec_out(x, s->w) : Py_None;
            PyObject *d = w ? PyDict_New() : NULL;
            for (int m = 0; d && m < s->nr; m++) {
                PyObject *r = rec_out(x, s->r[m].rec);
                if (r == NULL || PyDict_SetItem(d, e->tls[s->r[m].tl].tid, r) < 0)
                    Py_CLEAR(d);
            }
            st = d ? Py_BuildValue("[ON]", w, d) : NULL;
        }
        if (st == NULL) {
            Py_DECREF(bounds);
            Py_DECREF(states);
            return -1;
        }
        PyList_SET_ITEM(states, k, st);
    }
    if (set_attr_new(o, "bounds", bounds) < 0) {
        Py_DECREF(states);
        return -1;
    }
    if (set_attr_new(o, "states", states) < 0)
        return -1;
    if (sh->seen != NULL && PyObject_SetAttrString(o, "seen", sh->seen) < 0)
        return -1;
    return 0;
}

/* The readers of every graph input, and the shadow of every storage (or of those `only` lists) */
static int export_shadows(Ex *x, PyObject *c, PyObject *only) {
    Engine *e = x->e;
    PyObject *readers = PyDict_New();
    if (readers == NULL || PyObject_SetAttrString(c, "_readers", readers) < 0) {
        Py_XDECREF(readers);
        return -1;
    }
    Py_DECREF(readers);
    int64_t key;
    void *val;
    MAP_EACH(&e->readers, key, val) {
        Readers *rd = val;
        PyObject *lst = PyList_New(0);
        if (lst == NULL)
            return -1;
        PyObject *storage = NULL;
        for (int k = 0; k < rd->n; k++) {
            PyObject *inp = input_out(x, rd->v[k].inp);
            PyObject *t = inp ? Py_BuildValue("(LO)", (long long)rd->v[k].g, inp) : NULL;
            if (t == NULL || PyList_Append(lst, t) < 0) {
                Py_XDECREF(t);
                Py_DECREF(lst);
                return -1;
            }
            Py_DECREF(t);
            storage = rd->v[k].inp->storage;
        }
        PyObject *sk = storage ? (Py_INCREF(storage), storage) : PyLong_FromLongLong(key);
        int rc = sk ? PyDict_SetItem(readers, sk, lst) : -1;
        Py_XDECREF(sk);
        if (rc == 0)
            rc = PyList_Append(x->keep, lst);
        Py_DECREF(lst);
        if (rc < 0 || ex_cache(x, &rd->out, lst) < 0)
            return -1;
    }
    PyObject *shadows = PyDict_New();
    if (shadows == NULL || PyObject_SetAttrString(c, "_shadow", shadows) < 0) {
        Py_XDECREF(shadows);
        return -1;
    }
    Py_DECREF(shadows);
    PyObject *cls = kit(e, "StorageShadow");
    if (cls == NULL)
        return -1;
    if (only == NULL) {
        MAP_EACH(&e->shadows, key, val)
            if (shadow_out(x, shadows, cls, val) < 0)
                return -1;
        return 0;
    }
    PyObject *it = PyObject_GetIter(only), *storage;
    if (it == NULL)
        return -1;
    while ((storage = PyIter_Next(it)) != NULL) {
        int64_t st;
        Shadow *sh = as_i64(storage, &st) ? shadow_get(e, st) : NULL;
        Py_DECREF(storage);
        if (sh != NULL && shadow_out(x, shadows, cls, sh) < 0) {
            Py_DECREF(it);
            return -1;
        }
    }
    Py_DECREF(it);
    return PyErr_Occurred() ? -1 : 0;
}

/* keep_seen(checker): each shadow's `seen` of a checker the engine exported to, kept with the
   engine's shadow of that storage (the Python checker noted races on an export; the engine goes
   on and exports again). 0, or -1 with an exception. */
int keep_seen(Engine *e, PyObject *c) {
    PyObject *shadows = PyObject_GetAttrString(c, "_shadow");
    if (shadows == NULL)
        return -1;
    if (!PyDict_Check(shadows)) {
        Py_DECREF(shadows);
        PyErr_SetString(PyExc_TypeError, "the checker's _shadow is not a dict");
        return -1;
    }
    Py_ssize_t pos = 0;
    PyObject *storage, *o;
    int rc = 0;
    while (rc == 0 && PyDict_Next(shadows, &pos, &storage, &o)) {
        int64_t st;
        Shadow *sh = as_i64(storage, &st) ? shadow_get(e, st) : NULL;
        PyObject *seen = PyObject_GetAttrString(o, "seen");
        if (seen == NULL)
            rc = -1;
        else if (sh == NULL && seen != Py_None) {
            PyErr_SetString(PyExc_RuntimeError, "keep_seen: a storage the engine has no shadow of");
            rc = -1;
        } else if (sh != NULL)
            Py_XSETREF(sh->seen, seen == Py_None ? NULL : (Py_INCREF(seen), seen));
        Py_XDECREF(seen);
    }
    Py_DECREF(shadows);
    return rc;
}

static int export_graphs(Ex *x, PyObject *c) {
    Engine *e = x->e;
    PyObject *graphs = PyDict_New();
    if (graphs == NULL || PyObject_SetAttrString(c, "_graphs", graphs) < 0) {
        Py_XDECREF(graphs);
        return -1;
    }
    Py_DECREF(graphs);
    PyObject *cls = kit(e, "_Graph"), *rcls = cls ? kit(e, "_Replay") : NULL;
    if (rcls == NULL)
        return -1;
    int64_t key;
    void *val;
    MAP_EACH(&e->graphs, key, val) {
        Graph *gr = val;
        PyObject *o = PyObject_CallFunction(cls, "OOL", gr->gid, gr->ops, (long long)gr->captured);
        if (o == NULL)
            return -1;
        int rc = PyDict_SetItem(graphs, gr->gid, o);
        Py_DECREF(o);
        if (rc < 0)
            return -1;
        PyObject *inputs = PyObject_GetAttrString(o, "inputs");
        if (inputs == NULL)
            return -1;
        for (int k = 0; k < gr->ninputs; k++) {
            PyObject *inp = input_out(x, gr->inputs[k]);
            if (inp == NULL || PyDict_SetItem(inputs, gr->inputs[k]->storage, inp) < 0) {
                Py_DECREF(inputs);
                return -1;
            }
        }
        Py_DECREF(inputs);
        if (set_attr_new(o, "nreplays", PyLong_FromLongLong(gr->nreplays)) < 0)
            return -1;
        if (gr->first_replay != NONE_I64 &&
            set_attr_new(o, "first_replay", PyLong_FromLongLong(gr->first_replay)) < 0)
            return -1;
        if (gr->has_last) {
            PyObject *tid = tid_or_none(x, gr->last_tl);
            PyObject *r = PyObject_CallFunction(rcls, "LOO", (long long)gr->last_seq, tid, gr->last_ev);
            Py_DECREF(tid);
            if (set_attr_new(o, "last_replay", r) < 0)
                return -1;
        }
    }
    return 0;
}

static int export_rest(Ex *x, PyObject *c) {
    Engine *e = x->e;
    PyObject *records = PyDict_New(), *allocs = PyDict_New(), *sites = PyDict_New(),
             *recstreams = PyDict_New(), *unsited = PyList_New(0);
    int rc = -1;
    if (!records || !allocs || !sites || !recstreams || !unsited)
        goto done;
    PyObject *rcls = kit(e, "_Recorded");
    if (rcls == NULL)
        goto done;
    int64_t key;
    void *val;
    MAP_EACH(&e->records, key, val) {
        Recorded *r = val;
        PyObject *vc = vc_out(x, &r->vc);
        PyObject *o = vc ? PyObject_CallFunction(rcls, "OOLO", e->tls[r->tl].tid, vc,
                                                 (long long)r->seq, r->stack) : NULL;
        Py_XDECREF(vc);
        if (o == NULL || PyDict_SetItem(records, r->event, o) < 0) {
            Py_XDECREF(o);
            goto done;
        }
        Py_DECREF(o);
    }
    MAP_EACH(&e->blocks, key, val) {
        Block *bl = val;
        if (bl->has_alloc) {
            PyObject *t = Py_BuildValue("(OO)", bl->stream, bl->host ? Py_True : Py_False);
            if (t == NULL || PyDict_SetItem(allocs, bl->block, t) < 0) {
                Py_XDECREF(t);
                goto done;
            }
            Py_DECREF(t);
        }
        if (bl->has_site) {
            PyObject *first = PySequence_GetSlice(bl->site_stack, 0, 1);
            PyObject *t = first ? Py_BuildValue("(ON)", bl->site_op, first) : NULL;
            if (t == NULL || PyDict_SetItem(sites, bl->block, t) < 0) {
                Py_XDECREF(t);
                goto done;
            }
            Py_DECREF(t);
        }
        if (bl->rs != NULL) {
            PyObject *rs = PySet_New(bl->rs);
            int bad = rs == NULL || PyDict_SetItem(recstreams, bl->block, rs) < 0;
            Py_XDECREF(rs);
            if (bad)
                goto done;
        }
    }
    for (int k = 0; k < e->nunsited; k++)
        if (PyList_Append(unsited, e->unsited[k]) < 0)
            goto done;
    if (PyObject_SetAttrString(c, "_records", records) < 0 ||
        PyObject_SetAttrString(c, "_allocs", allocs) < 0 ||
        PyObject_SetAttrString(c, "_sites", sites) < 0 ||
        PyObject_SetAttrString(c, "_recstreams", recstreams) < 0 ||
        PyObject_SetAttrString(c, "_unsited", unsited) < 0 ||
        set_attr_new(c, "_names", PyDict_Copy(e->names)) < 0 ||
        set_attr_new(c, "_tolerant", PyDict_Copy(e->tolerant)) < 0 ||
        set_attr_new(c, "_name_order", PyLong_FromLongLong(e->name_order)) < 0 ||
        set_attr_new(c, "_seq", PyLong_FromLongLong(e->seq)) < 0)
        goto done;
    rc = 0;
done:
    Py_XDECREF(records);
    Py_XDECREF(allocs);
    Py_XDECREF(sites);
    Py_XDECREF(recstreams);
    Py_XDECREF(unsited);
    return rc;
}

/* export(checker): give a Python Checker this state: 0, or -1 with an exception (the engine is
   done after a failure). The engine may go on after an export (FastChecker's resume), so the
   Checker gets its own containers: what it shares with the engine is only the storages' `seen`
   sets, on purpose (keep_seen), and the lists of names, which only NameTensor changes, an event
   the engine never leaves to the Python while it goes on. */
int export_checker(Engine *e, PyObject *c, PyObject *only) {
    Ex x;
    int rc = ex_begin(&x, e);
    if (rc == 0)
        rc = export_timelines(&x, c);
    if (rc == 0)
        rc = export_shadows(&x, c, only);
    if (rc == 0)
        rc = export_graphs(&x, c);
    if (rc == 0)
        rc = export_rest(&x, c);
    if (rc == 0) {
        PyObject *open = PyList_New(0);
        rc = open == NULL ? -1 : 0;
        for (Py_ssize_t k = 0; rc == 0 && k < PyList_GET_SIZE(e->frees_open); k++) {
            PyObject *ent = PyList_GET_ITEM(e->frees_open, k);
            PyObject *o = Py_BuildValue("(OO)", x.tl_objs[PyLong_AsLong(PyTuple_GET_ITEM(ent, 0))],
                                        PyTuple_GET_ITEM(ent, 1));
            if (o == NULL || PyList_Append(open, o) < 0)
                rc = -1;
            Py_XDECREF(o);
        }
        if (rc == 0)
            rc = set_attr_new(c, "_frees_open", open);
        else
            Py_XDECREF(open);
    }
    ex_end(&x);
    if (rc < 0)
        e->done = 1;
    return rc;
}
