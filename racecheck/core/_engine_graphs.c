/* Graphs (the checker's graphs concern: _on_capture, _on_replay, _check_rc006): captured ops,
   the inputs they read and those inputs' freshness. */
#include "_engine.h"

static void ginput_decref(GInput *inp) {
    if (--inp->refs > 0)
        return;
    Py_XDECREF(inp->storage);
    ivl_free(&inp->read);
    ivl_free(&inp->ever);
    ivl_free(&inp->fresh);
    PyMem_Free(inp->ops);
    PyMem_Free(inp);
}

static void cops_free(COp *c, int n) {
    for (int k = 0; k < n; k++) {
        for (int m = 0; m < c[k].nreads; m++)
            PyMem_Free(c[k].reads[m].r);
        for (int m = 0; m < c[k].nwrites; m++)
            PyMem_Free(c[k].writes[m].r);
        PyMem_Free(c[k].reads);
        PyMem_Free(c[k].writes);
    }
    PyMem_Free(c);
}

static void graph_free(Graph *g) {
    Py_XDECREF(g->gid);
    Py_XDECREF(g->ops);
    Py_XDECREF(g->last_ev);
    cops_free(g->cops, g->nops);
    for (int k = 0; k < g->ninputs; k++)
        ginput_decref(g->inputs[k]);
    PyMem_Free(g->inputs);
    PyMem_Free(g);
}

/* Footprints of one side of a captured op, copied out of the scratch list: 1 / 0 / -1 */
static int captured_side(Engine *e, PyObject *seq, Acc **out, int *n) {
    *out = NULL;
    *n = 0;
    int first, count;
    int r = parse_fps(e, seq, &first, &count);
    if (r <= 0)
        return r;
    if (count == 0)
        return 1;
    Acc *a = PyMem_Calloc((size_t)count, sizeof(Acc));
    if (a == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    *out = a;
    *n = count;
    for (int k = 0; k < count; k++) {
        FPv *f = &e->fps[first + k];
        a[k].fp = f->fp;
        a[k].st = f->st;
        a[k].born = f->born;
        a[k].nr = f->nr;
        if (f->nr) {
            a[k].r = PyMem_Malloc(sizeof(IV) * (size_t)f->nr);
            if (a[k].r == NULL) {
                PyErr_NoMemory();
                return -1;
            }
            memcpy(a[k].r, &e->ivs[f->r0], sizeof(IV) * (size_t)f->nr);
        }
    }
    return 1;
}

static GInput *graph_input(Graph *gr, PyObject *storage, int64_t st) {
    for (int k = 0; k < gr->ninputs; k++)
        if (gr->inputs[k]->st == st)
            return gr->inputs[k];
    GInput *inp = PyMem_Calloc(1, sizeof(GInput));
    if (inp == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    GInput **v = PyMem_Realloc(gr->inputs, sizeof(GInput *) * (size_t)(gr->ninputs + 1));
    if (v == NULL) {
        PyMem_Free(inp);
        PyErr_NoMemory();
        return NULL;
    }
    gr->inputs = v;
    Py_INCREF(storage);
    inp->storage = storage;
    inp->st = st;
    inp->refs = 1;
    gr->inputs[gr->ninputs++] = inp;
    return inp;
}

static int readers_add(Engine *e, int64_t st, int64_t g, GInput *inp) {
    int made;
    Readers *rd = map_make(&e->readers, st, sizeof(Readers), &made);
    if (rd == NULL)
        return -1;
    if (RESERVE(rd->v, rd->cap, rd->n + 1, 2) < 0)
        return -1;
    inp->refs++;
    rd->v[rd->n++] = (Reader){g, inp};
    return 0;
}

/* Per storage, the bytes a graph's captured ops wrote so far (on_capture) */
typedef struct {
    int64_t st;
    IVL w;
} MadeBy;

typedef struct {
    MadeBy *v;
    int n, cap;
} Made;

static IVL *made_get(Made *m, int64_t st) {
    for (int k = 0; k < m->n; k++)
        if (m->v[k].st == st)
            return &m->v[k].w;
    return NULL;
}

static IVL *made_add(Made *m, int64_t st) {
    IVL *w = made_get(m, st);
    if (w != NULL)
        return w;
    if (RESERVE(m->v, m->cap, m->n + 1, 4) < 0)
        return NULL;
    m->v[m->n] = (MadeBy){st, {NULL, 0, 0}};
    return &m->v[m->n++].w;
}

static void made_free(Made *m) {
    for (int k = 0; k < m->n; k++)
        ivl_free(&m->v[k].w);
    PyMem_Free(m->v);
    *m = (Made){0};
}

/* Checker._on_capture */
int on_capture(Engine *e, PyObject *ev, int64_t seq) {
    PyObject *gid = field(e, E_CAPTURE, ev, F_GRAPH), *ops = field(e, E_CAPTURE, ev, F_OPS);
    int64_t g;
    if (gid == NULL || ops == NULL || !as_i64(gid, &g))
        return HANDOVER;
    PyObject *list = PySequence_List(ops);
    if (list == NULL)
        return -1;
    Py_ssize_t nops = PyList_GET_SIZE(list);
    Graph *gr = PyMem_Calloc(1, sizeof(Graph));
    COp *cops = nops ? PyMem_Calloc((size_t)nops, sizeof(COp)) : NULL;
    if (gr == NULL || (nops && cops == NULL)) {
        PyMem_Free(gr);
        PyMem_Free(cops);
        Py_DECREF(list);
        PyErr_NoMemory();
        return -1;
    }
    gr->cops = cops;
    gr->nops = (int)nops;
    gr->ops = list;
    Py_INCREF(gid);
    gr->gid = gid;
    gr->g = g;
    gr->captured = seq;
    gr->first_replay = NONE_I64;
    /* bytes earlier captured ops write, per storage: the graph's own product, not inputs */
    Made made = {0};
    IVL rest = {0};
    int ok = 1;
    for (Py_ssize_t k = 0; ok == 1 && k < nops; k++) {
        PyObject *op = PyList_GET_ITEM(list, k);
        cops[k].obj = op;
        if (!PyObject_TypeCheck(op, e->cop_type)) {
            ok = 0;
            break;
        }
        PyObject *rd = SLOT(op, e->cop_off[C_READS]), *wr = SLOT(op, e->cop_off[C_WRITES]);
        e->nfps = e->nivs = 0;
        ok = captured_side(e, rd, &cops[k].reads, &cops[k].nreads);
        if (ok == 1) {
            e->nfps = e->nivs = 0;
            ok = captured_side(e, wr, &cops[k].writes, &cops[k].nwrites);
        }
        /* the graph's inputs: reads of exact footprints, less what the graph made before */
        for (int m = 0; ok == 1 && m < cops[k].nreads; m++) {
            Acc *a = &cops[k].reads[m];
            PyObject *approx = fp_field(e, a->fp, P_APPROX);
            int t = approx == NULL ? -1 : PyObject_IsTrue(approx);
            if (t < 0) {
                ok = approx == NULL ? 0 : -1;
                break;
            }
            if (t)
                continue;
            const IVL *own = made_get(&made, a->st);
            if (own != NULL) {
                rest.n = 0;
                for (int q = 0; q < a->nr; q++)
                    if (ivl_add_minus(&rest, a->r[q].lo, a->r[q].hi, own) < 0) {
                        ok = -1;
                        break;
                    }
                if (ok != 1)
                    break;
                if (rest.n == 0)
                    continue;
            }
            GInput *inp = graph_input(gr, fp_field(e, a->fp, P_STORAGE), a->st);
            if (inp == NULL) {
                ok = -1;
                break;
            }
            if (own != NULL) {
                if (ivl_union(&inp->read, &rest) < 0) {
                    ok = -1;
                    break;
                }
            } else {
                for (int q = 0; q < a->nr; q++)
                    if (ivl_add(&inp->read, a->r[q].lo, a->r[q].hi) < 0) {
                        ok = -1;
                        break;
                    }
            }
            if (ok == 1 && (inp->nops == 0 || inp->ops[inp->nops - 1] != (int)k)) {
                if (RESERVE(inp->ops, inp->ops_cap, inp->nops + 1, 4) < 0) {
                    ok = -1;
                    break;
                }
                inp->ops[inp->nops++] = (int)k;
            }
        }
        for (int m = 0; ok == 1 && m < cops[k].nwrites; m++) {
            Acc *a = &cops[k].writes[m];
            IVL *own = made_add(&made, a->st);
            if (own == NULL) {
                ok = -1;
                break;
            }
            for (int q = 0; q < a->nr; q++)
                if (ivl_add(own, a->r[q].lo, a->r[q].hi) < 0) {
                    ok = -1;
                    break;
                }
        }
    }
    made_free(&made);
    ivl_free(&rest);
    if (ok != 1) {
        graph_free(gr);
        return ok;
    }
    int h = tl_get(e, field(e, E_CAPTURE, ev, F_THREAD), 1);
    if (h < 0) {
        graph_free(gr);
        return h == -2 ? HANDOVER : -1;
    }
    /* the graph captured again: its old inputs leave the readers lists */
    Graph *old = graph_get(e, g);
    if (old != NULL) {
        for (int k = 0; k < old->ninputs; k++) {
            GInput *inp = old->inputs[k];
            Readers *rd = readers_get(e, inp->st);
            if (rd == NULL)
                continue;
            int w = 0;
            for (int m = 0; m < rd->n; m++) {
                if (rd->v[m].inp == inp)
                    ginput_decref(inp);
                else
                    rd->v[w++] = rd->v[m];
            }
            rd->n = w;
        }
    }
    for (int k = 0; k < gr->ninputs; k++)
        if (readers_add(e, gr->inputs[k]->st, g, gr->inputs[k]) < 0) {
            graph_free(gr);
            return -1;
        }
    void *prev;
    if (map_put(&e->graphs, g, gr, &prev) < 0) {
        graph_free(gr);
        return -1;
    }
    if (prev != NULL)
        graph_free(prev);
    PyObject *n = PyLong_FromSsize_t(nops);
    if (n == NULL)
        return -1;
    Py_INCREF(gid);
    push_ctx(e, &e->tls[h], seq, K_CAPTURE, L_CAPTURE, gid, n, -1, -1);
    return 1;
}

/* Checker._check_rc006 on an input with stale bytes (`both` less `fresh`): nothing reported
   when every stale byte is declared stale-tolerant and no captured op reads this input as
   indices (Checker._stale_indices then does nothing): 1; else 0 (hand over), -1 on error. */
static int stale_tolerated(Engine *e, Graph *gr, GInput *inp, const IVL *both, const IVL *fresh,
                           IVL *tol) {
    if (!PyDict_GET_SIZE(e->tolerant))
        return 0;
    PyObject *lst = PyDict_GetItemWithError(e->tolerant, inp->storage);
    if (lst == NULL)
        return PyErr_Occurred() ? -1 : 0;
    if (!PyList_Check(lst))
        return 0;
    tol->n = 0;
    for (Py_ssize_t k = 0; k < PyList_GET_SIZE(lst); k++) {
        PyObject *iv = PyList_GET_ITEM(lst, k);
        int64_t lo, hi;
        if (!PyTuple_Check(iv) || PyTuple_GET_SIZE(iv) != 2 || !as_i64(PyTuple_GET_ITEM(iv, 0), &lo) ||
            !as_i64(PyTuple_GET_ITEM(iv, 1), &hi))
            return 0;
        if (ivl_add(tol, lo, hi) < 0)
            return -1;
    }
    if (ivl_union(tol, fresh) < 0)
        return -1;
    if (ivl_subtract_nonempty(both, tol))
        return 0;
    for (int j = 0; j < inp->nops; j++) {
        COp *c = &gr->cops[inp->ops[j]];
        for (int m = 0; m < c->nreads; m++) {
            if (c->reads[m].st != inp->st)
                continue;
            PyObject *into = PyObject_GetAttr(c->reads[m].fp, s_index_into);
            if (into == NULL)
                return -1;
            int indices = into != Py_None;
            Py_DECREF(into);
            if (indices)
                return 0;
        }
    }
    return 1;
}

/* Checker._check_rc006 would report nothing for this replay: 1; 0: it might; -1 */
static int rc006_clean(Engine *e, Graph *gr) {
    IVL fresh = {NULL, 0, 0}, both = {NULL, 0, 0}, tol = {NULL, 0, 0};
    int rc = 1;
    for (int k = 0; rc == 1 && k < gr->ninputs; k++) {
        GInput *inp = gr->inputs[k];
        if (inp->fresh.n == 0)
            continue;
        if (ivl_intersect(&inp->fresh, &inp->read, &fresh) < 0) {
            rc = -1;
            break;
        }
        if (fresh.n && gr->nreplays > 0) {
            if (ivl_intersect(&inp->read, &inp->ever, &both) < 0) {
                rc = -1;
                break;
            }
            if (ivl_subtract_nonempty(&both, &fresh))
                rc = stale_tolerated(e, gr, inp, &both, &fresh, &tol);
        }
    }
    ivl_free(&fresh);
    ivl_free(&both);
    ivl_free(&tol);
    return rc;
}

/* Checker._check_rc006's updates, nothing reported */
static int rc006_update(Graph *gr) {
    IVL fresh = {NULL, 0, 0};
    for (int k = 0; k < gr->ninputs; k++) {
        GInput *inp = gr->inputs[k];
        if (inp->fresh.n == 0)
            continue;
        if (ivl_intersect(&inp->fresh, &inp->read, &fresh) < 0 || ivl_union(&inp->ever, &fresh) < 0) {
            ivl_free(&fresh);
            return -1;
        }
        inp->fresh.n = 0;
    }
    ivl_free(&fresh);
    return 0;
}

static inline FPv acc_view(Engine *e, Acc *a) {
    FPv v;
    v.fp = a->fp;
    v.st = a->st;
    v.born = a->born;
    v.host = 0;
    v.nr = a->nr;
    v.r0 = e->nivs;
    return v;
}

/* Captured accesses read by the shared read/write code through the scratch list */
static int acc_load(Engine *e, Acc *a, FPv *v) {
    *v = acc_view(e, a);
    for (int q = 0; q < a->nr; q++)
        if (scratch_iv(e, a->r[q].lo, a->r[q].hi) < 0)
            return -1;
    return 0;
}

/* Checker._on_replay (with _replay_ops: a merged replay leaves the same state) */
int on_replay(Engine *e, PyObject *ev, int64_t seq) {
    PyObject *gid = field(e, E_REPLAY, ev, F_GRAPH);
    int64_t g;
    if (gid == NULL || !as_i64(gid, &g))
        return HANDOVER;
    int s = launch(e, field(e, E_REPLAY, ev, F_THREAD), field(e, E_REPLAY, ev, F_STREAM), NULL);
    if (s < 0)
        return s == -2 ? HANDOVER : -1;
    TRY(settle_frees(e, s));
    Graph *gr = graph_get(e, g);
    if (gr != NULL && !e->forced) {
        int r = rc006_clean(e, gr);
        if (r < 0)
            return r;
        if (r == 0)
            return raced(e, ev);
        const VC *vc = &e->tls[s].vc;
        for (int k = 0; k < gr->nops; k++) {
            COp *c = &gr->cops[k];
            for (int m = 0; m < c->nreads; m++) {
                FPv v;
                e->nivs = 0;
                if (acc_load(e, &c->reads[m], &v) < 0)
                    return -1;
                if (!read_clean(e, &v, vc, 0))
                    return raced(e, ev);
                /* a read after this replay's own write of the same bytes (Checker._check_rc007
                   on this replay's record) */
                if (v.born != NONE_I64 && gr->first_replay != NONE_I64 &&
                    gr->first_replay < v.born && seq >= v.born)
                    return raced(e, ev);
            }
            for (int m = 0; m < c->nwrites; m++) {
                FPv v;
                e->nivs = 0;
                if (acc_load(e, &c->writes[m], &v) < 0)
                    return -1;
                if (!write_clean(e, &v, vc, 0))
                    return raced(e, ev);
            }
        }
    }
    TL *t = &e->tls[s];
    int64_t c = vc_get(&t->vc, s) + 1;
    if (vc_set(&t->vc, s, c) < 0)
        return -1;
    Py_INCREF(gid);
    push_ctx(e, t, seq, K_REPLAY, L_REPLAY, gid, NULL, -1, -1);
    if (gr == NULL)
        return 1;
    if (gr->ninputs && rc006_update(gr) < 0)
        return -1;
    for (int k = 0; k < gr->nops; k++) {
        COp *cp = &gr->cops[k];
        Rec *rec = rec_new(s, c, seq, ev, cp->obj, 0, gid, g);
        if (rec == NULL)
            return -1;
        int rc = 0;
        for (int m = 0; rc == 0 && m < cp->nreads; m++) {
            FPv v;
            e->nivs = 0;
            rc = acc_load(e, &cp->reads[m], &v);
            if (rc == 0)
                rc = apply_read(e, &v, fp_field(e, v.fp, P_STORAGE), rec);
        }
        for (int m = 0; rc == 0 && m < cp->nwrites; m++) {
            FPv v;
            e->nivs = 0;
            rc = acc_load(e, &cp->writes[m], &v);
            if (rc == 0)
                rc = apply_write(e, &v, fp_field(e, v.fp, P_STORAGE), rec, g);
        }
        rec_decref(rec);
        if (rc < 0)
            return -1;
    }
    gr->nreplays++;
    if (gr->first_replay == NONE_I64)
        gr->first_replay = seq;
    gr->has_last = 1;
    gr->last_seq = seq;
    gr->last_tl = s;
    Py_INCREF(ev);
    Py_XSETREF(gr->last_ev, ev);
    return 1;
}

void graphs_free(Engine *e) {
    int64_t key;
    void *val;
    MAP_EACH(&e->readers, key, val) {
        Readers *rd = val;
        for (int k = 0; k < rd->n; k++)
            ginput_decref(rd->v[k].inp);
        PyMem_Free(rd->v);
        PyMem_Free(rd);
    }
    map_free(&e->readers);
    MAP_EACH(&e->graphs, key, val)
        graph_free(val);
    map_free(&e->graphs);
}
