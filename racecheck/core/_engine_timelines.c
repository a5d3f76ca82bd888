/* Timelines (the checker's timelines concern: _Timeline, _new_host, _new_stream, _launch): vector
   clocks, the launch edge, context windows. */
#include "_engine.h"

/* ---- vector clocks: dense over timeline indices, with the keys a dict would hold ----------- */

int vc_reserve(VC *c, int n) {
    if (n <= c->n)
        return 0;
    int cap = c->n ? c->n : 4;
    while (cap < n)
        cap *= 2;
    int64_t *v = PyMem_Realloc(c->v, sizeof(int64_t) * (size_t)cap);
    if (v == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    c->v = v;
    uint8_t *h = PyMem_Realloc(c->has, (size_t)cap);
    if (h == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    c->has = h;
    memset(c->v + c->n, 0, sizeof(int64_t) * (size_t)(cap - c->n));
    memset(c->has + c->n, 0, (size_t)(cap - c->n));
    c->n = cap;
    return 0;
}

int vc_join(VC *dst, const VC *src) {
    for (int i = 0; i < src->n; i++) {
        if (src->v[i] > vc_get(dst, i) && vc_set(dst, i, src->v[i]) < 0)
            return -1;
    }
    return 0;
}

int vc_copy(VC *dst, const VC *src) {
    dst->v = NULL;
    dst->has = NULL;
    dst->n = 0;
    if (src->n == 0)
        return 0;
    if (vc_reserve(dst, src->n) < 0)
        return -1;
    memcpy(dst->v, src->v, sizeof(int64_t) * (size_t)src->n);
    memcpy(dst->has, src->has, (size_t)src->n);
    return 0;
}

void vc_free(VC *c) {
    PyMem_Free(c->v);
    PyMem_Free(c->has);
    c->v = NULL;
    c->has = NULL;
    c->n = 0;
}

/* ---- context windows ---------------------------------------------------------------------- */

void ctx_clear(CtxEnt *e) {
    if (e->type == CX_REC)
        rec_decref(e->rec);
    e->rec = NULL;
    Py_CLEAR(e->a);
    Py_CLEAR(e->b);
}

/* ---- timelines --------------------------------------------------------------------------- */

/* A new timeline for tid (Checker._new_host / _new_stream); its index, or -1 on error. */
int tl_new(Engine *e, PyObject *tid, int64_t ti, int is_host) {
    if (RESERVE(e->tls, e->tl_cap, e->ntl + 1, 8) < 0 ||
        (!is_host && RESERVE(e->streams, e->streams_cap, e->nstreams + 1, 8) < 0))
        return -1;
    int i = e->ntl;
    TL *t = &e->tls[i];
    memset(t, 0, sizeof(TL));
    t->jh = -1;
    t->jv = -1;
    t->is_host = is_host;
    t->tid_i = ti;
    if (e->window > 0 && (t->ctx = PyMem_Calloc((size_t)e->window, sizeof(CtxEnt))) == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    if (is_host) {
        if (e->main >= 0 && vc_copy(&t->vc, &e->tls[e->main].vc) < 0)
            goto fail;
        if (!(i < t->vc.n && t->vc.has[i]) && vc_set(&t->vc, i, 0) < 0)
            goto fail;
    } else if (vc_set(&t->vc, i, 0) < 0) {
        goto fail;
    }
    if (map_put(&e->tl_of, ti, (void *)(intptr_t)(i + 1), NULL) < 0)
        goto fail;
    if (!is_host)
        e->streams[e->nstreams++] = i;
    Py_INCREF(tid);
    t->tid = tid;
    e->ntl++;
    if (is_host && e->main < 0)
        e->main = i;
    return i;
fail:       /* nothing of the timeline stays: it is not counted in ntl */
    PyMem_Free(t->ctx);
    vc_free(&t->vc);
    return -1;
}

/* _join_launch where the host's clock changed since the stream last joined it: 0 / -1 */
int join_launch(Engine *e, int s, int h) {
    TL *st = &e->tls[s], *ht = &e->tls[h];
    if (st->jh == h && st->jv == ht->ver)
        return 0;
    if (vc_join(&st->vc, &ht->vc) < 0)
        return -1;
    st->jh = h;
    st->jv = ht->ver;
    return 0;
}

/* Checker._launch: the host and stream timelines, the stream joined with the host. */
int launch(Engine *e, PyObject *thread, PyObject *stream, int *hp) {
    int h = tl_get(e, thread, 1);
    if (h < 0)
        return h;
    int s = tl_get(e, stream, 0);
    if (s < 0)
        return s;
    if (join_launch(e, s, h) < 0)
        return -1;
    if (hp)
        *hp = h;
    return s;
}

void ctx_push(Engine *e, TL *t, CtxEnt *ent) {
    if (e->window <= 0) {
        ctx_clear(ent);
        return;
    }
    if (t->ctx_n == e->window) {
        CtxEnt *old = &t->ctx[t->ctx_head];
        ctx_clear(old);
        *old = *ent;
        t->ctx_head = (t->ctx_head + 1) % e->window;
    } else {
        t->ctx[(t->ctx_head + t->ctx_n) % e->window] = *ent;
        t->ctx_n++;
    }
}

void push_rec(Engine *e, TL *t, Rec *r) {
    CtxEnt c = {CX_REC, r->seq, r, NULL, NULL, 0, 0, -1, -1};
    rec_incref(r);
    ctx_push(e, t, &c);
}

/* A _Ctx entry; a and b are new references (or NULL), stolen. */
void push_ctx(Engine *e, TL *t, int64_t seq, int kind, int label, PyObject *a,
                     PyObject *b, int peer, int64_t edge) {
    CtxEnt c = {CX_CTX, seq, NULL, a, b, kind, label, peer, edge};
    ctx_push(e, t, &c);
}

void timelines_free(Engine *e) {
    for (int i = 0; i < e->ntl; i++) {
        TL *t = &e->tls[i];
        for (int k = 0; k < t->ctx_n; k++)
            ctx_clear(&t->ctx[(t->ctx_head + k) % e->window]);
        PyMem_Free(t->ctx);
        for (int k = 0; k < t->noop_n; k++) {
            Py_DECREF(t->noop[k].event);
            Py_DECREF(t->noop[k].stack);
        }
        PyMem_Free(t->noop);
        vc_free(&t->vc);
        Py_XDECREF(t->tid);
        Py_XDECREF(t->name);
        Py_XDECREF(t->device);
        Py_XDECREF(t->frees);
    }
    PyMem_Free(e->tls);
    PyMem_Free(e->streams);
    map_free(&e->tl_of);
}
