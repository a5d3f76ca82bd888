/* The engine's containers (the checker's state concern): int64 hash maps, growable arrays, access
   records, interval lists. */
#include "_engine.h"

char engine_tomb;

/* ---- a hash map from int64 keys to pointers (open addressing) ------------------------------ */

static int map_grow(Map *m) {
    Py_ssize_t cap = m->cap ? m->cap : 8;
    while (cap < 4 * (m->n + 1))
        cap *= 2;
    MapEnt *e = PyMem_Calloc((size_t)cap, sizeof(MapEnt));
    if (e == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    MapEnt *old = m->e;
    Py_ssize_t oldcap = m->cap;
    m->e = e;
    m->cap = cap;
    m->used = m->n;
    for (Py_ssize_t k = 0; k < oldcap; k++) {
        if (old[k].val == NULL || old[k].val == TOMB)
            continue;
        Py_ssize_t i = (Py_ssize_t)(mix64((uint64_t)old[k].key) & (uint64_t)(cap - 1));
        while (e[i].val != NULL)
            i = (i + 1) & (cap - 1);
        e[i] = old[k];
    }
    PyMem_Free(old);
    return 0;
}

int map_put(Map *m, int64_t key, void *val, void **old) {
    if (old)
        *old = NULL;
    if (2 * (m->used + 1) > m->cap && map_grow(m) < 0)
        return -1;
    Py_ssize_t mask = m->cap - 1, i = (Py_ssize_t)(mix64((uint64_t)key) & (uint64_t)mask);
    Py_ssize_t tomb = -1;
    for (;;) {
        MapEnt *e = &m->e[i];
        if (e->val == NULL)
            break;
        if (e->val == TOMB) {
            if (tomb < 0)
                tomb = i;
        } else if (e->key == key) {
            if (old)
                *old = e->val;
            e->val = val;
            return 0;
        }
        i = (i + 1) & mask;
    }
    if (tomb >= 0)
        i = tomb;
    else
        m->used++;
    m->e[i].key = key;
    m->e[i].val = val;
    m->n++;
    return 0;
}

void *map_del(Map *m, int64_t key) {
    if (m->n == 0)
        return NULL;
    Py_ssize_t mask = m->cap - 1, i = (Py_ssize_t)(mix64((uint64_t)key) & (uint64_t)mask);
    for (;;) {
        MapEnt *e = &m->e[i];
        if (e->val == NULL)
            return NULL;
        if (e->val != TOMB && e->key == key) {
            void *v = e->val;
            e->val = TOMB;
            m->n--;
            return v;
        }
        i = (i + 1) & mask;
    }
}

void *map_add_new(Map *m, int64_t key, size_t size) {
    void *v = PyMem_Calloc(1, size);
    if (v == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    if (map_put(m, key, v, NULL) < 0) {
        PyMem_Free(v);
        return NULL;
    }
    return v;
}

void map_free(Map *m) {
    PyMem_Free(m->e);
    m->e = NULL;
    m->cap = m->n = m->used = 0;
}

int reserve(void **v, int *cap, int need, size_t size, int first) {
    if (need <= *cap)
        return 0;
    int n = *cap ? 2 * *cap : first;
    while (n < need)
        n *= 2;
    void *p = PyMem_Realloc(*v, size * (size_t)n);
    if (p == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    *v = p;
    *cap = n;
    return 0;
}

/* ---- access records (checker state: the plain 7-tuple TL, CLOCK, SEQ, EV, SUB, HOST, GRAPH) ----- */

static Rec *rec_pool = NULL;
static Py_ssize_t rec_pool_n = 0;

Rec *rec_new(int tl, int64_t clock, int64_t seq, PyObject *ev, PyObject *sub, int host,
                    PyObject *graph, int64_t g) {
    Rec *r = rec_pool;
    if (r != NULL) {
        rec_pool = r->next_free;
        rec_pool_n--;
    } else {
        r = PyMem_Malloc(sizeof(Rec));
        if (r == NULL) {
            PyErr_NoMemory();
            return NULL;
        }
    }
    r->refs = 1;
    r->tl = tl;
    r->clock = clock;
    r->seq = seq;
    r->host = host;
    Py_INCREF(ev);
    r->ev = ev;
    Py_XINCREF(sub);
    r->sub = sub;
    Py_XINCREF(graph);
    r->graph = graph;
    r->g = g;
    r->out = NULL;
    r->next_free = NULL;
    return r;
}

/* the last reference to r went: its objects go, the record to the pool */
void rec_release(Rec *r) {
    Py_CLEAR(r->ev);
    Py_CLEAR(r->sub);
    Py_CLEAR(r->graph);
    if (rec_pool_n < 4096) {
        r->next_free = rec_pool;
        rec_pool = r;
        rec_pool_n++;
    } else {
        PyMem_Free(r);
    }
}

/* ---- interval lists (shadow.py) --------------------------------------------------------- */

static int ivl_reserve(IVL *l, int n) { return RESERVE(l->v, l->cap, n, 4); }

int ivl_add(IVL *l, int64_t lo, int64_t hi) {
    if (lo >= hi)
        return 0;
    int n = l->n;
    if (n == 1 && l->v[0].lo <= lo && hi <= l->v[0].hi)
        return 0;
    if (ivl_reserve(l, n + 1) < 0)
        return -1;
    /* general merge, in place: [before] [merged] [after] */
    IV *v = l->v;
    int out = 0, k = 0;
    int placed = 0;
    IV *res = PyMem_Malloc(sizeof(IV) * (size_t)(n + 1));
    if (res == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (k = 0; k < n; k++) {
        int64_t a = v[k].lo, b = v[k].hi;
        if (b < lo)
            res[out++] = v[k];
        else if (hi < a) {
            if (!placed) {
                res[out++] = (IV){lo, hi};
                placed = 1;
            }
            res[out++] = v[k];
        } else {
            lo = a < lo ? a : lo;
            hi = b > hi ? b : hi;
        }
    }
    if (!placed)
        res[out++] = (IV){lo, hi};
    memcpy(v, res, sizeof(IV) * (size_t)out);
    l->n = out;
    PyMem_Free(res);
    return 0;
}

int ivl_union(IVL *x, const IVL *y) {
    for (int k = 0; k < y->n; k++)
        if (ivl_add(x, y->v[k].lo, y->v[k].hi) < 0)
            return -1;
    return 0;
}

int ivl_intersect(const IVL *x, const IVL *y, IVL *out) {
    out->n = 0;
    int i = 0, j = 0;
    while (i < x->n && j < y->n) {
        int64_t lo = x->v[i].lo > y->v[j].lo ? x->v[i].lo : y->v[j].lo;
        int64_t hi = x->v[i].hi < y->v[j].hi ? x->v[i].hi : y->v[j].hi;
        if (lo < hi) {
            if (ivl_reserve(out, out->n + 1) < 0)
                return -1;
            out->v[out->n++] = (IV){lo, hi};
        }
        if (x->v[i].hi < y->v[j].hi)
            i++;
        else
            j++;
    }
    return 0;
}

int ivl_subtract_nonempty(const IVL *x, const IVL *y) {
    for (int k = 0; k < x->n; k++) {
        int64_t cur = x->v[k].lo, hi = x->v[k].hi;
        for (int m = 0; m < y->n; m++) {
            int64_t a = y->v[m].lo, b = y->v[m].hi;
            if (b <= cur || a >= hi)
                continue;
            if (a > cur)
                return 1;
            cur = cur > b ? cur : b;
            if (cur >= hi)
                break;
        }
        if (cur < hi)
            return 1;
    }
    return 0;
}

/* l ∪ ([lo, hi) less y): iv_subtract of one interval, added; 0, or -1 */
int ivl_add_minus(IVL *l, int64_t lo, int64_t hi, const IVL *y) {
    int64_t cur = lo;
    for (int m = 0; m < y->n; m++) {
        int64_t a = y->v[m].lo, b = y->v[m].hi;
        if (b <= cur || a >= hi)
            continue;
        if (a > cur && ivl_add(l, cur, a) < 0)
            return -1;
        cur = cur > b ? cur : b;
        if (cur >= hi)
            break;
    }
    return cur < hi ? ivl_add(l, cur, hi) : 0;
}

void ivl_free(IVL *l) {
    PyMem_Free(l->v);
    l->v = NULL;
    l->n = l->cap = 0;
}
