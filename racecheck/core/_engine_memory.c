/* Allocations (the checker's memory concern: _on_alloc, _on_free, _on_record_stream, _assign_sites)
   and the RC005 hazards a free opens. */
#include "_engine.h"

static Block *block_make(Engine *e, PyObject *blk, int64_t b) {
    int made;
    Block *bl = map_make(&e->blocks, b, sizeof(Block), &made);
    if (bl != NULL && made) {
        Py_INCREF(blk);
        bl->block = blk;
    }
    return bl;
}

/* drop the entry when nothing is left in it */
static void block_tidy(Engine *e, Block *bl, int64_t b) {
    if (bl->has_alloc || bl->has_site || bl->rs != NULL)
        return;
    map_del(&e->blocks, b);
    Py_XDECREF(bl->block);
    PyMem_Free(bl);
}

static void block_clear_site(Block *bl) {
    bl->has_site = 0;
    Py_CLEAR(bl->site_op);
    Py_CLEAR(bl->site_stack);
}

/* Checker._on_alloc */
int on_alloc(Engine *e, PyObject *ev, int64_t seq) {
    PyObject *thread = field(e, E_ALLOC, ev, F_THREAD), *stream = field(e, E_ALLOC, ev, F_STREAM),
             *blk = field(e, E_ALLOC, ev, F_BLOCK), *host = field(e, E_ALLOC, ev, F_HOST);
    int64_t b, si;
    if (blk == NULL || host == NULL || stream == NULL || !as_i64(blk, &b))
        return HANDOVER;
    if (stream != Py_None && !as_i64(stream, &si))
        return HANDOVER;
    int ishost = PyObject_IsTrue(host);
    if (ishost < 0)
        return -1;
    int h = tl_get(e, thread, 1);
    if (h < 0)
        return h == -2 ? HANDOVER : -1;
    if (stream != Py_None && tl_get(e, stream, 0) < 0)
        return -1;
    Block *bl = block_make(e, blk, b);
    if (bl == NULL)
        return -1;
    Py_INCREF(stream);
    Py_XSETREF(bl->stream, stream);
    bl->has_alloc = 1;
    bl->host = ishost;
    if (RESERVE(e->unsited, e->unsited_cap, e->nunsited + 1, 8) < 0)
        return -1;
    Py_INCREF(blk);
    e->unsited[e->nunsited++] = blk;
    Shadow *sh = map_del(&e->shadows, b);
    if (sh != NULL)
        shadow_free(sh);
    Py_CLEAR(bl->rs);
    return 1;
}

/* _only_on(sh, tid): every access in the shadow was made on timeline index a */
static int only_on(Shadow *sh, int a) {
    for (int k = 0; k < sh->n; k++) {
        Seg *s = &sh->segs[k];
        if (s->gap)
            continue;
        if (s->w != NULL && s->w->tl != a)
            return 0;
        for (int m = 0; m < s->nr; m++)
            if (s->r[m].tl != a)
                return 0;
    }
    return 1;
}

/* A record in a freed block's shadow that Checker._check_rc005 lists: another stream's device
   access, not covered by record_stream, unordered with the freeing host and the allocation
   stream a: 1 / 0 / -1 */
static int unordered_at_free(Engine *e, Rec *rec, int a, TL *h, const VC *avc, PyObject *rs) {
    if (rec == NULL || rec->tl == a || rec->host)
        return 0;
    TL *t = &e->tls[rec->tl];
    if (rs != NULL) {
        int in = PySet_Contains(rs, t->tid);
        if (in != 0)
            return in < 0 ? -1 : 0;
    }
    if (t->is_host)
        return 0;
    return rec->clock > vc_get(&h->vc, rec->tl) && rec->clock > vc_get(avc, rec->tl);
}

/* Checker._check_rc005 would open a hazard for this free: 1 / 0 / -1 */
static int rc005_hazard(Engine *e, Shadow *sh, int a, TL *h, PyObject *rs) {
    VC empty = {NULL, NULL, 0};
    const VC *avc = a >= 0 ? &e->tls[a].vc : &empty;
    for (int k = 0; k < sh->n; k++) {
        Seg *s = &sh->segs[k];
        if (s->gap)
            continue;
        for (int m = -1; m < s->nr; m++) {
            int u = unordered_at_free(e, m < 0 ? s->w : s->r[m].rec, a, h, avc, rs);
            if (u != 0)
                return u;
        }
    }
    return 0;
}

/* Checker._check_rc005 for a free that opens hazards: the accesses it is unordered with, listed
   as the Python loop lists them, and the hazards the reference code makes of them on a Checker
   given this engine's timelines (fastchecker.py _open_hazards). A new list of _OpenFree, or NULL. */
static PyObject *open_hazards(Engine *e, PyObject *ev, int64_t seq, int h, PyObject *blk,
                              Block *bl, Shadow *sh, int a) {
    PyObject *result = NULL, *items = NULL, *view = NULL, *site = NULL, *seqo = NULL;
    char *keep = NULL;      /* timelines whose whole context window the view gets */
    PyObject *cls = kit(e, "Checker"), *fn = cls ? kit(e, "open_hazards") : NULL;
    Ex x = {e, NULL, NULL, NULL, NULL};
    if (fn == NULL || ex_begin(&x, e) < 0 || (items = PyList_New(0)) == NULL)
        goto done;
    if ((keep = PyMem_Calloc((size_t)e->ntl + 1, 1)) == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    keep[a] = keep[h] = 1;
    int64_t from_seq = INT64_MAX;
    TL *ht = &e->tls[h];
    const VC *avc = &e->tls[a].vc;
    for (int k = 0; k < sh->n; k++) {
        Seg *sg = &sh->segs[k];
        if (sg->gap)
            continue;
        for (int m = -1; m < sg->nr; m++) {
            Rec *rec = m < 0 ? sg->w : sg->r[m].rec;
            int u = unordered_at_free(e, rec, a, ht, avc, bl->rs);
            if (u < 0)
                goto done;
            if (u == 0)
                continue;
            keep[rec->tl] = 1;
            if (rec->seq < from_seq)
                from_seq = rec->seq;
            PyObject *r = rec_out(&x, rec);
            PyObject *item = r ? Py_BuildValue("(OsLL)", r, m < 0 ? "write" : "read",
                                               (long long)sh->bounds[k], (long long)sh->bounds[k + 1])
                               : NULL;
            if (item == NULL || PyList_Append(items, item) < 0) {
                Py_XDECREF(item);
                goto done;
            }
            Py_DECREF(item);
        }
    }
    if ((view = PyObject_CallFunction(cls, "i", e->window)) == NULL ||
        export_timelines_of(&x, view, keep, from_seq) < 0)
        goto done;
    PyObject *names = PyDict_GetItemWithError(e->names, blk);
    if (names == NULL && PyErr_Occurred())
        goto done;
    if (bl->has_site) {
        PyObject *first = PySequence_GetSlice(bl->site_stack, 0, 1);
        if (first == NULL || (site = Py_BuildValue("(ON)", bl->site_op, first)) == NULL)
            goto done;
    }
    if ((seqo = PyLong_FromLongLong(seq)) == NULL)
        goto done;
    PyObject *args[10] = {view, e->namer ? e->namer : Py_None, ev, seqo, ht->tid, blk,
                          e->tls[a].tid, items, names ? names : Py_None, site ? site : Py_None};
    result = PyObject_Vectorcall(fn, args, 10, NULL);
    if (result != NULL && !PyList_Check(result)) {
        Py_CLEAR(result);
        PyErr_SetString(PyExc_TypeError, "open_hazards must return a list");
    }
done:
    ex_end(&x);
    PyMem_Free(keep);
    Py_XDECREF(items);
    Py_XDECREF(view);
    Py_XDECREF(site);
    Py_XDECREF(seqo);
    return result;
}

/* Checker._on_free */
int on_free(Engine *e, PyObject *ev, int64_t seq) {
    PyObject *blk = field(e, E_FREE, ev, F_BLOCK);
    int64_t b;
    if (blk == NULL || !as_i64(blk, &b))
        return HANDOVER;
    int h = tl_get(e, field(e, E_FREE, ev, F_THREAD), 1);
    if (h < 0)
        return h == -2 ? HANDOVER : -1;
    Block *bl = block_get(e, b);
    Shadow *sh = shadow_get(e, b);
    int a = -1, hazard = 0;
    if (sh != NULL && bl != NULL && bl->has_alloc && !bl->host && bl->stream != NULL &&
        bl->stream != Py_None) {
        int64_t si = 0;
        as_i64(bl->stream, &si);
        a = tl_index(e, si);
        if (a < 0)
            return HANDOVER;
        if (!only_on(sh, a)) {
            hazard = rc005_hazard(e, sh, a, &e->tls[h], bl->rs);
            if (hazard < 0)
                return -1;
        }
    }
    if (e->watched != NULL && !e->forced && PySet_GET_SIZE(e->watched)) {
        int w = PySet_Contains(e->watched, blk);    /* stale indices into it are judged now */
        if (w < 0)
            return -1;
        if (w)
            return raced(e, ev);
    }
    TL *ht = &e->tls[h];
    Py_INCREF(blk);
    CtxEnt c = {CX_FREE, seq, NULL, blk, NULL, 0, 0, -1, -1};
    ctx_push(e, ht, &c);
    if (hazard) {       /* kept open on the allocation stream (Checker._open_free) */
        PyObject *opened = open_hazards(e, ev, seq, h, blk, bl, sh, a);
        if (opened == NULL)
            return -1;
        TL *at = &e->tls[a];
        int rc = 0;
        if (at->frees == NULL && (at->frees = PyList_New(0)) == NULL)
            rc = -1;
        for (Py_ssize_t k = 0; rc == 0 && k < PyList_GET_SIZE(opened); k++) {
            PyObject *hz = PyList_GET_ITEM(opened, k);
            PyObject *ent = Py_BuildValue("(iO)", a, hz);
            if (ent == NULL || PyList_Append(at->frees, hz) < 0 ||
                PyList_Append(e->frees_open, ent) < 0)
                rc = -1;
            Py_XDECREF(ent);
        }
        Py_DECREF(opened);
        if (rc < 0)
            return -1;
    }
    if (sh != NULL) {
        map_del(&e->shadows, b);
        shadow_free(sh);
    }
    if (PyDict_GET_SIZE(e->names) && PyDict_DelItem(e->names, blk) < 0) {
        if (!PyErr_ExceptionMatches(PyExc_KeyError))
            return -1;
        PyErr_Clear();
    }
    if (PyDict_GET_SIZE(e->tolerant) && PyDict_DelItem(e->tolerant, blk) < 0) {
        if (!PyErr_ExceptionMatches(PyExc_KeyError))
            return -1;
        PyErr_Clear();
    }
    if (bl != NULL) {
        bl->has_alloc = 0;
        Py_CLEAR(bl->stream);
        Py_CLEAR(bl->rs);
        block_clear_site(bl);
        block_tidy(e, bl, b);
    }
    Readers *rd = e->readers.n ? readers_get(e, b) : NULL;
    if (rd != NULL) {
        for (int k = 0; k < rd->n; k++) {
            rd->v[k].inp->ever.n = 0;
            rd->v[k].inp->fresh.n = 0;
        }
    }
    return 1;
}

/* settle_frees where stream s has open hazards */
int settle_open_frees(Engine *e, int s) {
    TL *t = &e->tls[s];
    if (t->frees == NULL)
        return 1;
    for (Py_ssize_t k = 0; k < PyList_GET_SIZE(t->frees); k++) {
        PyObject *hz = PyList_GET_ITEM(t->frees, k);
        int64_t ti, clock;
        if (!PyTuple_Check(hz) || PyTuple_GET_SIZE(hz) < 2 || !as_i64(PyTuple_GET_ITEM(hz, 0), &ti) ||
            !as_i64(PyTuple_GET_ITEM(hz, 1), &clock))
            return HANDOVER;
        int i = tl_index(e, ti);
        if (clock > (i >= 0 ? vc_get(&t->vc, i) : 0))
            return HANDOVER;
    }
    Py_CLEAR(t->frees);
    PyObject *kept = PyList_New(0);
    if (kept == NULL)
        return -1;
    for (Py_ssize_t k = 0; k < PyList_GET_SIZE(e->frees_open); k++) {
        PyObject *ent = PyList_GET_ITEM(e->frees_open, k);
        if (PyLong_AsLong(PyTuple_GET_ITEM(ent, 0)) != s && PyList_Append(kept, ent) < 0) {
            Py_DECREF(kept);
            return -1;
        }
    }
    Py_SETREF(e->frees_open, kept);
    return 1;
}

/* Checker._on_record_stream */
int on_record_stream(Engine *e, PyObject *ev, int64_t seq) {
    PyObject *blk = field(e, E_RECORD_STREAM, ev, F_BLOCK), *stream = field(e, E_RECORD_STREAM, ev, F_STREAM);
    int64_t b;
    if (blk == NULL || stream == NULL || !as_i64(blk, &b) || PyObject_Hash(stream) == -1) {
        PyErr_Clear();
        return HANDOVER;
    }
    int h = tl_get(e, field(e, E_RECORD_STREAM, ev, F_THREAD), 1);
    if (h < 0)
        return h == -2 ? HANDOVER : -1;
    Block *bl = block_make(e, blk, b);
    if (bl == NULL)
        return -1;
    if (bl->rs == NULL && (bl->rs = PySet_New(NULL)) == NULL)
        return -1;
    return PySet_Add(bl->rs, stream) < 0 ? -1 : 1;
}

/* Checker._assign_sites, for a Kernel, Copy or HostAccess (op and stack checked present) */
int assign_sites(Engine *e, PyObject *op, PyObject *stack) {
    for (int k = 0; k < e->nunsited; k++) {
        PyObject *blk = e->unsited[k];
        int64_t b = 0;
        as_i64(blk, &b);
        Block *bl = block_make(e, blk, b);
        if (bl == NULL)
            return -1;
        Py_INCREF(op);
        Py_XSETREF(bl->site_op, op);
        Py_INCREF(stack);
        Py_XSETREF(bl->site_stack, stack);
        bl->has_site = 1;
    }
    for (int k = 0; k < e->nunsited; k++)
        Py_DECREF(e->unsited[k]);
    e->nunsited = 0;
    return 0;
}

void blocks_free(Engine *e) {
    int64_t key;
    void *val;
    MAP_EACH(&e->blocks, key, val) {
        Block *bl = val;
        Py_XDECREF(bl->block);
        Py_XDECREF(bl->stream);
        Py_XDECREF(bl->site_op);
        Py_XDECREF(bl->site_stack);
        Py_XDECREF(bl->rs);
        PyMem_Free(bl);
    }
    map_free(&e->blocks);
    for (int k = 0; k < e->nunsited; k++)
        Py_DECREF(e->unsited[k]);
    PyMem_Free(e->unsited);
}
