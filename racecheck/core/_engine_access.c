/* Accesses (the checker's access concern: _on_kernel, _on_copy, _on_host_access, _read, _write):
   shadow memory, footprints, the race and RC007 checks, and the updates. */
#include "_engine.h"

/* ---- shadow memory -------------------------------------------------------------------------- */

static void seg_release(Seg *s) {
    rec_decref(s->w);
    s->w = NULL;
    for (int k = 0; k < s->nr; k++)
        rec_decref(s->r[k].rec);
    PyMem_Free(s->r);
    s->r = NULL;
    s->nr = s->cap = 0;
}

/* st[1][tid] = rec: replace in place, or append */
static int seg_set_read(Seg *s, int tl, Rec *rec) {
    for (int k = 0; k < s->nr; k++) {
        if (s->r[k].tl == tl) {
            rec_incref(rec);
            rec_decref(s->r[k].rec);
            s->r[k].rec = rec;
            return 0;
        }
    }
    if (RESERVE(s->r, s->cap, s->nr + 1, 2) < 0)
        return -1;
    rec_incref(rec);
    s->r[s->nr++] = (Rd){tl, rec};
    return 0;
}

static void seg_clear_reads(Seg *s) {
    for (int k = 0; k < s->nr; k++)
        rec_decref(s->r[k].rec);
    s->nr = 0;
}

/* _copy_state */
static int seg_copy(Seg *dst, const Seg *src) {
    memset(dst, 0, sizeof(Seg));
    dst->gap = src->gap;
    if (src->gap)
        return 0;
    dst->w = src->w;
    if (dst->w)
        rec_incref(dst->w);
    if (src->nr) {
        dst->r = PyMem_Malloc(sizeof(Rd) * (size_t)src->nr);
        if (dst->r == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        dst->cap = dst->nr = src->nr;
        for (int k = 0; k < src->nr; k++) {
            dst->r[k] = src->r[k];
            rec_incref(dst->r[k].rec);
        }
    }
    return 0;
}

/* Checker._new_shadow (the readers list is looked up when written, see fresh_readers) */
static Shadow *shadow_make(Engine *e, PyObject *storage, int64_t st) {
    int made;
    Shadow *sh = map_make(&e->shadows, st, sizeof(Shadow), &made);
    if (sh != NULL && made) {
        Py_INCREF(storage);
        sh->storage = storage;
        sh->st = st;
    }
    return sh;
}

void shadow_free(Shadow *sh) {
    for (int k = 0; k < sh->n; k++)
        seg_release(&sh->segs[k]);
    PyMem_Free(sh->segs);
    PyMem_Free(sh->bounds);
    Py_XDECREF(sh->seen);
    Py_XDECREF(sh->storage);
    PyMem_Free(sh);
}

static int shadow_reserve(Shadow *sh, int nseg) {
    if (nseg <= sh->cap)
        return 0;
    int cap = sh->cap ? 2 * sh->cap : 2;
    while (cap < nseg)
        cap *= 2;
    Seg *s = PyMem_Realloc(sh->segs, sizeof(Seg) * (size_t)cap);
    if (s == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    sh->segs = s;
    int64_t *b = PyMem_Realloc(sh->bounds, sizeof(int64_t) * (size_t)(cap + 1));
    if (b == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    sh->bounds = b;
    sh->cap = cap;
    return 0;
}

/* bisect_left over bounds[lo_i, nb) */
static inline int bisect_b(const Shadow *sh, int64_t x, int from) {
    int lo = from, hi = nbounds(sh);
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (sh->bounds[mid] < x)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Insert bound x at position i and segment `seg` at position si (StorageShadow._cut's inserts). */
static int shadow_insert(Shadow *sh, int bi, int64_t x, int si, Seg *seg) {
    if (shadow_reserve(sh, sh->n + 1) < 0)
        return -1;
    int nb = nbounds(sh);
    memmove(&sh->bounds[bi + 1], &sh->bounds[bi], sizeof(int64_t) * (size_t)(nb - bi));
    sh->bounds[bi] = x;
    memmove(&sh->segs[si + 1], &sh->segs[si], sizeof(Seg) * (size_t)(sh->n - si));
    sh->segs[si] = *seg;
    sh->n++;
    return 0;
}

/* StorageShadow._cut: make x a boundary (bounds not empty); its index, -1 on error */
static int shadow_cut(Shadow *sh, int64_t x) {
    int nb = nbounds(sh);
    int i = bisect_b(sh, x, 0);
    if (i < nb && sh->bounds[i] == x)
        return i;
    Seg seg;
    memset(&seg, 0, sizeof(Seg));
    if (i == 0) {
        seg.gap = 1;
        return shadow_insert(sh, 0, x, 0, &seg) < 0 ? -1 : 0;
    }
    if (i == nb) {
        seg.gap = 1;
        /* append: bound at the end, segment at the end */
        if (shadow_reserve(sh, sh->n + 1) < 0)
            return -1;
        sh->bounds[nb] = x;
        sh->segs[sh->n] = seg;
        sh->n++;
        return i;
    }
    if (seg_copy(&seg, &sh->segs[i - 1]) < 0)
        return -1;
    if (shadow_insert(sh, i, x, i, &seg) < 0) {
        seg_release(&seg);
        return -1;
    }
    return i;
}

/* StorageShadow.span: segment indices [i, j) covering exactly [lo, hi) (lo < hi) */
static int shadow_span(Shadow *sh, int64_t lo, int64_t hi, int *pi, int *pj) {
    int nb = nbounds(sh);
    int i = bisect_b(sh, lo, 0);
    if (i < nb && sh->bounds[i] == lo) {
        if (i + 1 < nb && sh->bounds[i + 1] == hi) {
            *pi = i;
            *pj = i + 1;
            return 0;
        }
        int j = bisect_b(sh, hi, i + 1);
        if (j < nb && sh->bounds[j] == hi) {
            *pi = i;
            *pj = j;
            return 0;
        }
        j = shadow_cut(sh, hi);
        if (j < 0)
            return -1;
        *pi = i;
        *pj = j;
        return 0;
    }
    if (nb == 0) {
        if (shadow_reserve(sh, 1) < 0)
            return -1;
        sh->bounds[0] = lo;
        sh->bounds[1] = hi;
        memset(&sh->segs[0], 0, sizeof(Seg));
        sh->segs[0].gap = 1;
        sh->n = 1;
        *pi = 0;
        *pj = 1;
        return 0;
    }
    i = shadow_cut(sh, lo);
    if (i < 0)
        return -1;
    int j = shadow_cut(sh, hi);
    if (j < 0)
        return -1;
    *pi = i;
    *pj = j;
    return 0;
}

/* delete segment k and bound bk */
static void shadow_delete(Shadow *sh, int bk, int k) {
    int nb = nbounds(sh);
    seg_release(&sh->segs[k]);
    memmove(&sh->bounds[bk], &sh->bounds[bk + 1], sizeof(int64_t) * (size_t)(nb - bk - 1));
    memmove(&sh->segs[k], &sh->segs[k + 1], sizeof(Seg) * (size_t)(sh->n - k - 1));
    sh->n--;
}

/* StorageShadow.collapse(i, j, [rec, {}]) */
static void shadow_collapse(Shadow *sh, int i, int j, Rec *rec) {
    if (j - i > 1) {
        int nb = nbounds(sh);
        for (int k = i + 1; k < j; k++)
            seg_release(&sh->segs[k]);
        memmove(&sh->bounds[i + 1], &sh->bounds[j], sizeof(int64_t) * (size_t)(nb - j));
        memmove(&sh->segs[i + 1], &sh->segs[j], sizeof(Seg) * (size_t)(sh->n - j));
        sh->n -= j - i - 1;
    }
    seg_release(&sh->segs[i]);
    sh->segs[i].gap = 0;
    sh->segs[i].w = rec;
    rec_incref(rec);
    if (i + 1 < sh->n) {
        Seg *nb = &sh->segs[i + 1];
        if (!nb->gap && nb->w == rec && nb->nr == 0)
            shadow_delete(sh, i + 1, i + 1);
    }
    if (i > 0) {
        Seg *nb = &sh->segs[i - 1];
        if (!nb->gap && nb->w == rec && nb->nr == 0)
            shadow_delete(sh, i, i);
    }
}

/* ---- footprints -------------------------------------------------------------------------- */

int scratch_iv(Engine *e, int64_t lo, int64_t hi) {
    if (RESERVE(e->ivs, e->ivs_cap, e->nivs + 1, 64) < 0)
        return -1;
    e->ivs[e->nivs++] = (IV){lo, hi};
    return 0;
}

/* Parse footprint fp into the scratch list: 1 ok, 0 hand over (not a footprint the engine
   reads: the Python handler decides), -1 error. */
static int parse_fp(Engine *e, PyObject *fp) {
    if (!PyObject_TypeCheck(fp, e->fp_type))
        return 0;
    PyObject *storage = fp_field(e, fp, P_STORAGE), *ranges = fp_field(e, fp, P_RANGES),
             *born = fp_field(e, fp, P_BORN), *host = fp_field(e, fp, P_HOST);
    if (storage == NULL || ranges == NULL || born == NULL || host == NULL)
        return 0;
    FPv v;
    v.fp = fp;
    if (!as_i64(storage, &v.st))
        return 0;
    if (born == Py_None)
        v.born = NONE_I64;
    else if (!as_i64(born, &v.born))
        return 0;
    if (host == Py_True || host == Py_False)
        v.host = host == Py_True;
    else
        return 0;
    if (!PyTuple_Check(ranges) && !PyList_Check(ranges))
        return 0;
    v.r0 = e->nivs;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(ranges);
    PyObject **items = PySequence_Fast_ITEMS(ranges);
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *pair = items[k];
        if (!(PyTuple_Check(pair) || PyList_Check(pair)) || PySequence_Fast_GET_SIZE(pair) != 2)
            return 0;
        int64_t lo, hi;
        if (!as_i64(PySequence_Fast_ITEMS(pair)[0], &lo) ||
            !as_i64(PySequence_Fast_ITEMS(pair)[1], &hi))
            return 0;
        if (scratch_iv(e, lo, hi) < 0)
            return -1;
    }
    v.nr = (int)n;
    if (RESERVE(e->fps, e->fps_cap, e->nfps + 1, 16) < 0)
        return -1;
    e->fps[e->nfps++] = v;
    return 1;
}

/* Parse a sequence of footprints (reads or writes): 1 ok, 0 hand over, -1 error. */
int parse_fps(Engine *e, PyObject *seq, int *first, int *count) {
    *first = e->nfps;
    *count = 0;
    if (seq == NULL)
        return 0;
    if (!PyTuple_Check(seq) && !PyList_Check(seq))
        return 0;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    for (Py_ssize_t k = 0; k < n; k++) {
        int r = parse_fp(e, PySequence_Fast_ITEMS(seq)[k]);
        if (r <= 0)
            return r;
    }
    *count = (int)n;
    return 1;
}

/* ---- the checks: would the Python handler note anything? ---------------------------------- */

/* 1: a race the reference would report (unordered, not host vs host) */
static inline int conflicts(const Rec *prev, const VC *vc, int cur_host) {
    return prev->clock > vc_get(vc, prev->tl) && !(prev->host && cur_host);
}

/* Checker._check_rc007 would note (w, cur) */
static int rc007_candidate(Engine *e, const Rec *w, int64_t born) {
    if (w->graph == NULL || born == NONE_I64 || w->seq < born)
        return 0;
    Graph *gr = w->g != NONE_I64 ? graph_get(e, w->g) : NULL;
    if (gr == NULL && w->g == NONE_I64)
        return 1;           /* a graph id the engine does not index: let Python decide */
    return gr != NULL && gr->first_replay != NONE_I64 && gr->first_replay < born;
}

/* report.py _site(rec): the event's innermost frame (else its op, else its type's name), with
   the captured op's for a replayed one. New reference, or NULL with an exception. */
static PyObject *site_of(Engine *e, PyObject *ev, PyObject *sub) {
    int k = event_kind(e, ev);
    PyObject *stack = k >= 0 ? field(e, k, ev, F_STACK) : NULL;
    if (stack == NULL) {
        PyErr_SetString(PyExc_TypeError, "an event without a stack the engine reads");
        return NULL;
    }
    int any = PyObject_IsTrue(stack);
    if (any < 0)
        return NULL;
    PyObject *first, *op = field(e, k, ev, F_OP);
    if (any)
        first = PySequence_GetItem(stack, 0);
    else if (op != NULL)
        first = (Py_INCREF(op), op);
    else
#if PY_VERSION_HEX >= 0x030B0000
        first = PyType_GetName(Py_TYPE(ev));
#else
        first = PyObject_GetAttrString((PyObject *)Py_TYPE(ev), "__name__");
#endif
    if (first == NULL || sub == NULL)
        return first;
    PyObject *sop = SLOT(sub, e->cop_off[C_OP]), *sstack = SLOT(sub, e->cop_off[C_STACK]);
    int sany = sop != NULL && sstack != NULL ? PyObject_IsTrue(sstack) : -1;
    PyObject *inner = sany > 0 ? PySequence_GetItem(sstack, 0)
                               : sany == 0 ? (Py_INCREF(Py_None), Py_None) : NULL;
    if (sany < 0 && !PyErr_Occurred())
        PyErr_SetString(PyExc_TypeError, "a captured op without its op or stack");
    PyObject *t = inner != NULL ? PyTuple_Pack(3, first, sop, inner) : NULL;
    Py_DECREF(first);
    Py_XDECREF(inner);
    return t;
}

/* The Python checker noted this conflict before, so noting it again adds nothing (report.py
   _note: the key `qk` is in the storage's `seen`): 1, else 0 (an error is cleared: the Python
   decides). `prev` conflicts with the current access's range [lo, hi) on segment k. Only for an
   event that reaches the storage through one range in all: then the Python handler visits
   exactly the segments seen here, cut only at that range's ends, so its `qk` is this one. */
static int noted_before(Engine *e, const Cur *cur, Shadow *sh, int k, int64_t lo, int64_t hi,
                        const Rec *prev, int prev_writes, int cur_host, int write) {
    if (cur == NULL || sh->seen == NULL)
        return 0;
    if (sh->bounds[k] > lo)
        lo = sh->bounds[k];
    if (sh->bounds[k + 1] < hi)
        hi = sh->bounds[k + 1];
    int ranges = 0;
    for (int j = cur->rf; j < cur->rf + cur->rn; j++)
        ranges += e->fps[j].st == sh->st ? e->fps[j].nr : 0;
    for (int j = cur->wf; j < cur->wf + cur->wn; j++)
        ranges += e->fps[j].st == sh->st ? e->fps[j].nr : 0;
    if (ranges != 1)
        return 0;
    const char *rule = prev->host || cur_host ? "RC004" : !write ? "RC001" : prev_writes ? "RC003"
                                                                                          : "RC002";
    Py_ssize_t names = 0;
    PyObject *named = PyDict_GetItemWithError(e->names, sh->storage);
    if (named != NULL)
        names = PyObject_Length(named);
    const TL *t = &e->tls[cur->tl];
    PyObject *key = NULL, *site = NULL, *psite = NULL;
    int found = 0;
    if (!PyErr_Occurred() && names >= 0 && (site = site_of(e, cur->ev, NULL)) != NULL &&
        (psite = site_of(e, prev->ev, prev->sub)) != NULL)
        key = Py_BuildValue("(sLLOOni)", rule, (long long)lo, (long long)hi, site, psite, names,
                            t->noop_made ? t->noop_n : 0);
    if (key != NULL)
        found = PySet_Contains(sh->seen, key);
    Py_XDECREF(key);
    Py_XDECREF(site);
    Py_XDECREF(psite);
    if (found < 0 || PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    return found;
}

/* Checker._read / _read_span (write 0) or _write / _write_span (write 1) would note nothing on
   footprint f (or, with `cur`, nothing it has not noted before): 1, else 0. Every segment under
   each range counts (splitting one copies its state). */
int access_clean(Engine *e, const FPv *f, const VC *vc, int cur_host, int write, const Cur *cur) {
    Shadow *sh = shadow_get(e, f->st);
    if (sh == NULL || sh->n == 0)
        return 1;
    for (int q = 0; q < f->nr; q++) {
        int64_t lo = e->ivs[f->r0 + q].lo, hi = e->ivs[f->r0 + q].hi;
        if (lo >= hi)
            continue;
        int k = bisect_b(sh, lo, 0);
        if (k > 0 && (k >= nbounds(sh) || sh->bounds[k] > lo))
            k--;
        for (; k < sh->n && sh->bounds[k] < hi; k++) {
            if (sh->bounds[k + 1] <= lo)
                continue;
            Seg *s = &sh->segs[k];
            if (s->gap)
                continue;
            if (s->w != NULL) {
                if (!write && rc007_candidate(e, s->w, f->born))
                    return 0;
                if (conflicts(s->w, vc, cur_host) &&
                    !noted_before(e, cur, sh, k, lo, hi, s->w, 1, cur_host, write))
                    return 0;
            }
            for (int m = 0; write && m < s->nr; m++)
                if (conflicts(s->r[m].rec, vc, cur_host) &&
                    !noted_before(e, cur, sh, k, lo, hi, s->r[m].rec, 0, cur_host, write))
                    return 0;
        }
    }
    return 1;
}

/* ---- the updates (Checker._read/_read_span/_write/_write_span, nothing noted) ------------- */

int apply_read(Engine *e, const FPv *f, PyObject *storage, Rec *rec) {
    Shadow *sh = shadow_make(e, storage, f->st);
    if (sh == NULL)
        return -1;
    int tl = rec->tl;
    for (int q = 0; q < f->nr; q++) {
        int64_t lo = e->ivs[f->r0 + q].lo, hi = e->ivs[f->r0 + q].hi;
        int nb = nbounds(sh);
        int i = bisect_b(sh, lo, 0);
        if (i + 1 < nb && sh->bounds[i] == lo && sh->bounds[i + 1] == hi && !sh->segs[i].gap) {
            if (seg_set_read(&sh->segs[i], tl, rec) < 0)
                return -1;
            continue;
        }
        if (lo >= hi)
            continue;
        int j;
        if (shadow_span(sh, lo, hi, &i, &j) < 0)
            return -1;
        for (int k = i; k < j; k++) {
            Seg *s = &sh->segs[k];
            if (s->gap) {
                s->gap = 0;
                s->w = NULL;
            }
            if (seg_set_read(s, tl, rec) < 0)
                return -1;
        }
    }
    return 0;
}

/* Checker._fresh_readers */
static int fresh_readers(Engine *e, int64_t st, int64_t lo, int64_t hi, int64_t graph) {
    Readers *rd = readers_get(e, st);
    if (rd == NULL)
        return 0;
    for (int k = 0; k < rd->n; k++)
        if (rd->v[k].g != graph && ivl_add(&rd->v[k].inp->fresh, lo, hi) < 0)
            return -1;
    return 0;
}

int apply_write(Engine *e, const FPv *f, PyObject *storage, Rec *rec, int64_t graph) {
    Shadow *sh = shadow_make(e, storage, f->st);
    if (sh == NULL)
        return -1;
    for (int q = 0; q < f->nr; q++) {
        int64_t lo = e->ivs[f->r0 + q].lo, hi = e->ivs[f->r0 + q].hi;
        if (lo >= hi)
            continue;
        int nb = nbounds(sh);
        int i = bisect_b(sh, lo, 0);
        if (nb == 0) {
            if (shadow_reserve(sh, 1) < 0)
                return -1;
            sh->bounds[0] = lo;
            sh->bounds[1] = hi;
            memset(&sh->segs[0], 0, sizeof(Seg));
            sh->segs[0].w = rec;
            rec_incref(rec);
            sh->n = 1;
        } else if (i + 1 < nb && sh->bounds[i] == lo && sh->bounds[i + 1] == hi &&
                   !sh->segs[i].gap) {
            Seg *s = &sh->segs[i];
            seg_clear_reads(s);
            rec_incref(rec);
            rec_decref(s->w);
            s->w = rec;
        } else {
            int j;
            if (shadow_span(sh, lo, hi, &i, &j) < 0)
                return -1;
            shadow_collapse(sh, i, j, rec);
        }
        if (e->readers.n && fresh_readers(e, f->st, lo, hi, graph) < 0)
            return -1;
    }
    return 0;
}

/* storage objects of parsed footprints are read again from the footprint when applied */
static inline PyObject *fp_storage(Engine *e, const FPv *f) { return fp_field(e, f->fp, P_STORAGE); }

static int apply_reads(Engine *e, int first, int count, Rec *rec) {
    for (int k = first; k < first + count; k++)
        if (apply_read(e, &e->fps[k], fp_storage(e, &e->fps[k]), rec) < 0)
            return -1;
    return 0;
}

static int apply_writes(Engine *e, int first, int count, Rec *rec, int64_t graph) {
    for (int k = first; k < first + count; k++)
        if (apply_write(e, &e->fps[k], fp_storage(e, &e->fps[k]), rec, graph) < 0)
            return -1;
    return 0;
}

/* Every footprint of the current access (ev on timeline tl) checks clean: nothing noted, or
   nothing the Python checker has not noted before (always, for an event apply() forces). */
static int all_clean(Engine *e, PyObject *ev, int tl, int rfirst, int rcount, int wfirst,
                     int wcount, const VC *vc, int cur_host) {
    if (e->forced)
        return 1;
    Cur cur = {ev, tl, rfirst, rcount, wfirst, wcount};
    for (int k = rfirst; k < rfirst + rcount; k++)
        if (!access_clean(e, &e->fps[k], vc, cur_host, 0, &cur))
            return 0;
    for (int k = wfirst; k < wfirst + wcount; k++)
        if (!access_clean(e, &e->fps[k], vc, cur_host, 1, &cur))
            return 0;
    return 1;
}

/* An access or replay whose checks would note something: the handover, remembering the event
   (the Python checker may judge it alone, and the engine then apply it: FastChecker's resume). */
int raced(Engine *e, PyObject *ev) {
    Py_INCREF(ev);
    Py_XSETREF(e->raced, ev);
    return HANDOVER;
}

/* Checker._on_kernel */
int on_kernel(Engine *e, PyObject *ev, int64_t seq) {
    int s = launch(e, field(e, E_KERNEL, ev, F_THREAD), field(e, E_KERNEL, ev, F_STREAM), NULL);
    if (s < 0)
        return s == -2 ? HANDOVER : -1;
    TRY(settle_frees(e, s));
    PyObject *reads = field(e, E_KERNEL, ev, F_READS), *writes = field(e, E_KERNEL, ev, F_WRITES);
    int rf, rn, wf, wn;
    TRY(parse_fps(e, reads, &rf, &rn));
    TRY(parse_fps(e, writes, &wf, &wn));
    TL *t = &e->tls[s];
    if (!all_clean(e, ev, s, rf, rn, wf, wn, &t->vc, 0))
        return raced(e, ev);
    int64_t c = vc_get(&t->vc, s) + 1;
    if (vc_set(&t->vc, s, c) < 0)
        return -1;
    Rec *rec = rec_new(s, c, seq, ev, NULL, 0, NULL, NONE_I64);
    if (rec == NULL)
        return -1;
    push_rec(e, t, rec);
    int rc = apply_reads(e, rf, rn, rec) < 0 || apply_writes(e, wf, wn, rec, NONE_I64) < 0 ? -1 : 1;
    rec_decref(rec);
    return rc;
}

/* Checker._on_host_access */
int on_host_access(Engine *e, PyObject *ev, int64_t seq) {
    int h = tl_get(e, field(e, E_HOST_ACCESS, ev, F_THREAD), 1);
    if (h < 0)
        return h == -2 ? HANDOVER : -1;
    PyObject *op = field(e, E_HOST_ACCESS, ev, F_OP);
    if (op == NULL)
        return HANDOVER;
    int rf, rn, wf, wn;
    TRY(parse_fps(e, field(e, E_HOST_ACCESS, ev, F_READS), &rf, &rn));
    TRY(parse_fps(e, field(e, E_HOST_ACCESS, ev, F_WRITES), &wf, &wn));
    TL *t = &e->tls[h];
    if (!all_clean(e, ev, h, rf, rn, wf, wn, &t->vc, 1))
        return raced(e, ev);
    int64_t c = vc_get(&t->vc, h) + 1;
    if (vc_set(&t->vc, h, c) < 0)
        return -1;
    t->ver++;
    Py_INCREF(op);
    push_ctx(e, t, seq, K_HOST, L_HOST, op, NULL, -1, -1);
    Rec *rec = rec_new(h, c, seq, ev, NULL, 1, NULL, NONE_I64);
    if (rec == NULL)
        return -1;
    int rc = apply_reads(e, rf, rn, rec) < 0 || apply_writes(e, wf, wn, rec, NONE_I64) < 0 ? -1 : 1;
    rec_decref(rec);
    return rc;
}

/* Checker._on_copy */
int on_copy(Engine *e, PyObject *ev, int64_t seq) {
    int h = -1;
    int s = launch(e, field(e, E_COPY, ev, F_THREAD), field(e, E_COPY, ev, F_STREAM), &h);
    if (s < 0)
        return s == -2 ? HANDOVER : -1;
    TRY(settle_frees(e, s));
    PyObject *src = field(e, E_COPY, ev, F_SRC), *dst = field(e, E_COPY, ev, F_DST),
             *op = field(e, E_COPY, ev, F_OP), *nb = field(e, E_COPY, ev, F_NON_BLOCKING);
    if (src == NULL || dst == NULL || op == NULL || nb == NULL)
        return HANDOVER;
    int rf = e->nfps;
    TRY(parse_fp(e, src));
    int wf = e->nfps;
    TRY(parse_fp(e, dst));
    int non_blocking = PyObject_IsTrue(nb);
    if (non_blocking < 0)
        return -1;
    TL *t = &e->tls[s];
    if (!all_clean(e, ev, s, rf, 1, wf, 1, &t->vc, 0))
        return raced(e, ev);
    int sh = e->fps[rf].host, dh = e->fps[wf].host;
    const char *dir = sh ? (dh ? "H2H" : "H2D") : (dh ? "D2H" : "D2D");
    int64_t c = vc_get(&t->vc, s) + 1;
    if (vc_set(&t->vc, s, c) < 0)
        return -1;
    PyObject *dirs = PyUnicode_FromString(dir);
    if (dirs == NULL)
        return -1;
    Py_INCREF(op);
    push_ctx(e, t, seq, K_COPY, L_COPY, op, dirs, -1, -1);
    Rec *rec = rec_new(s, c, seq, ev, NULL, 0, NULL, NONE_I64);
    if (rec == NULL)
        return -1;
    int rc = apply_reads(e, rf, 1, rec) < 0 || apply_writes(e, wf, 1, rec, NONE_I64) < 0 ? -1 : 1;
    rec_decref(rec);
    if (rc < 0)
        return -1;
    if (!non_blocking && (sh || dh)) {
        TL *ht = &e->tls[h];
        if (vc_join(&ht->vc, &e->tls[s].vc) < 0)
            return -1;
        ht->ver++;
        dirs = PyUnicode_FromString(dir);
        if (dirs == NULL)
            return -1;
        Py_INCREF(op);
        push_ctx(e, ht, seq, K_SYNC, L_BLOCKING, op, dirs, s, seq);
    }
    return 1;
}

void shadows_free(Engine *e) {
    int64_t key;
    void *val;
    MAP_EACH(&e->shadows, key, val)
        shadow_free(val);
    map_free(&e->shadows);
}
