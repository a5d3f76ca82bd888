/* racecheck.core._engine: the happens-before checker's state machine, in C.

   racecheck/core/checker.py's Checker is the reference: this engine keeps the same state (timelines
   with vector clocks, context windows, shadow memory, event records, allocations, graphs) in C
   structures and runs the same handlers on it for as long as the trace is clean. It never builds
   a finding. Before an event that would note anything (a race, an RC005 hazard, stale graph
   input, an RC007 candidate), or that it does not model, it stops without touching its state;
   `export` then builds the Python Checker's state exactly as the Python handlers would have left
   it, and the Python Checker goes on from that event (racecheck/core/fastchecker.py). A clean trace never
   leaves C; a racy one is reported by the reference code, from its first finding on.

   Every handler below names the Checker method it ports. Each event is handled in two steps:
   the `*_clean` checks read the state and say whether the event can be handled here (nothing is
   changed before them but what the Python handler also does first and idempotently: creating
   the timelines the event names and joining the launch edge), then the update. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>

#define NONE_I64 INT64_MIN      /* "None" for optional integers */

/* ---- a hash map from int64 keys to pointers (open addressing) ------------------------------ */

typedef struct {
    int64_t key;
    void *val;              /* NULL: empty slot; TOMB: deleted */
} MapEnt;

typedef struct {
    MapEnt *e;
    Py_ssize_t cap, n, used;    /* slots, live entries, live + tombstones */
} Map;

static char tomb_;
#define TOMB ((void *)&tomb_)

static inline uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

static void *map_get(const Map *m, int64_t key) {
    if (m->n == 0)
        return NULL;
    Py_ssize_t mask = m->cap - 1, i = (Py_ssize_t)(mix64((uint64_t)key) & (uint64_t)mask);
    for (;;) {
        MapEnt *e = &m->e[i];
        if (e->val == NULL)
            return NULL;
        if (e->val != TOMB && e->key == key)
            return e->val;
        i = (i + 1) & mask;
    }
}

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

/* Set key -> val (val not NULL); the previous value is returned through *old (NULL if none). */
static int map_put(Map *m, int64_t key, void *val, void **old) {
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

static void *map_del(Map *m, int64_t key) {
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

/* The entry of key, a zeroed block of `size` bytes made when there is none (*made says so) */
static void *map_make(Map *m, int64_t key, size_t size, int *made) {
    void *v = map_get(m, key);
    *made = 0;
    if (v != NULL)
        return v;
    v = PyMem_Calloc(1, size);
    if (v == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    if (map_put(m, key, v, NULL) < 0) {
        PyMem_Free(v);
        return NULL;
    }
    *made = 1;
    return v;
}

static void map_free(Map *m) {
    PyMem_Free(m->e);
    m->e = NULL;
    m->cap = m->n = m->used = 0;
}

#define MAP_EACH(m, k_, v_)                                                             \
    for (Py_ssize_t k_##i = 0; k_##i < (m)->cap; k_##i++)                              \
        if ((m)->e[k_##i].val != NULL && (m)->e[k_##i].val != TOMB &&                  \
            ((k_ = (m)->e[k_##i].key), (void)k_, (v_ = (m)->e[k_##i].val), 1))

/* Room for `need` elements of `size` bytes in the array *v of capacity *cap (doubling, at least
   `first`): 0, or -1 with MemoryError. */
static int reserve(void **v, int *cap, int need, size_t size, int first) {
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

#define RESERVE(arr, cap, need, first) reserve((void **)&(arr), &(cap), (need), sizeof(*(arr)), (first))

/* A Python int as int64: 1 ok, 0 not an int that fits (no exception left). */
static inline int as_i64(PyObject *o, int64_t *out) {
    if (!PyLong_CheckExact(o) && !PyLong_Check(o))
        return 0;
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow || (v == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    if (v == NONE_I64)
        return 0;
    *out = (int64_t)v;
    return 1;
}

/* ---- vector clocks: dense over timeline indices, with the keys a dict would hold ----------- */

typedef struct {
    int64_t *v;
    uint8_t *has;
    int n;
} VC;

static inline int64_t vc_get(const VC *c, int i) { return i < c->n ? c->v[i] : 0; }

static int vc_reserve(VC *c, int n) {
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

static inline int vc_set(VC *c, int i, int64_t x) {
    if (i >= c->n && vc_reserve(c, i + 1) < 0)
        return -1;
    c->v[i] = x;
    c->has[i] = 1;
    return 0;
}

/* clocks.join: dst ⊔= src */
static int vc_join(VC *dst, const VC *src) {
    for (int i = 0; i < src->n; i++) {
        if (src->v[i] > vc_get(dst, i) && vc_set(dst, i, src->v[i]) < 0)
            return -1;
    }
    return 0;
}

static int vc_copy(VC *dst, const VC *src) {
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

static void vc_free(VC *c) {
    PyMem_Free(c->v);
    PyMem_Free(c->has);
    c->v = NULL;
    c->has = NULL;
    c->n = 0;
}

/* ---- access records (checker.py: the plain 7-tuple TL, CLOCK, SEQ, EV, SUB, HOST, GRAPH) ----- */

typedef struct Rec {
    Py_ssize_t refs;
    int64_t clock, seq;
    int tl;                 /* timeline index */
    int host;
    PyObject *ev;           /* owned */
    PyObject *sub;          /* owned CapturedOp, or NULL for None */
    PyObject *graph;        /* owned graph id, or NULL for None */
    int64_t g;              /* the graph id as an integer (NONE_I64 without one) */
    PyObject *out;          /* export: the tuple made for this record (borrowed) */
    struct Rec *next_free;
} Rec;

static Rec *rec_pool = NULL;
static Py_ssize_t rec_pool_n = 0;

static Rec *rec_new(int tl, int64_t clock, int64_t seq, PyObject *ev, PyObject *sub, int host,
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

static inline void rec_incref(Rec *r) { r->refs++; }

static void rec_decref(Rec *r) {
    if (r == NULL || --r->refs > 0)
        return;
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

/* ---- context windows (checker.py: _Timeline.ctx, a deque of records, _Ctx and _CtxFree) ----- */

enum { CX_REC, CX_FREE, CX_CTX };
enum { K_COPY, K_HOST, K_SYNC, K_RECORD, K_WAIT, K_CAPTURE, K_REPLAY };
enum {
    L_COPY, L_HOST, L_BLOCKING, L_RECORD, L_WAIT_NOOP, L_WAIT, L_WAIT_STREAM, L_STREAM_SYNC,
    L_EVENT_SYNC_NOOP, L_EVENT_SYNC, L_DEVICE_SYNC, L_CAPTURE, L_REPLAY
};
static const char *const KIND_NAMES[] = {"copy", "host", "sync", "record", "wait", "capture",
                                         "replay"};

typedef struct {
    int type;
    int64_t seq;
    Rec *rec;               /* CX_REC */
    PyObject *a, *b;        /* CX_FREE: a = block; CX_CTX: label arguments (owned) */
    int kind, label;        /* CX_CTX */
    int peer;               /* timeline index, -1 for None */
    int64_t edge;
} CtxEnt;

static void ctx_clear(CtxEnt *e) {
    if (e->type == CX_REC)
        rec_decref(e->rec);
    e->rec = NULL;
    Py_CLEAR(e->a);
    Py_CLEAR(e->b);
}

/* ---- timelines (checker.py: _Timeline) ---------------------------------------------------- */

typedef struct {
    PyObject *event;        /* owned */
    int64_t seq;
    PyObject *stack;        /* owned */
    int host;
} Noop;

#define NOOP_WAITS_KEPT 64

typedef struct {
    PyObject *tid;          /* owned */
    int64_t tid_i;
    int is_host;
    PyObject *name;         /* owned or NULL */
    PyObject *device;       /* owned or NULL */
    VC vc;
    int64_t ver;
    int jh;                 /* host timeline joined at the last launch, -1 none */
    int64_t jv;
    CtxEnt *ctx;            /* ring of `window` entries */
    int ctx_head, ctx_n;
    Noop *noop;             /* insertion order, at most NOOP_WAITS_KEPT */
    int noop_n, noop_cap;
    int noop_made;          /* the dict exists (Checker._remember_noop ran once) */
    PyObject *frees;        /* allocation streams: open RC005 hazards (_OpenFree list), or NULL */
} TL;

/* ---- shadow memory (racecheck/core/shadow.py: StorageShadow) ------------------------------------- */

typedef struct {
    int tl;
    Rec *rec;
} Rd;

typedef struct {
    int gap;                /* the state is None: bytes never accessed */
    Rec *w;                 /* last write, or NULL */
    int nr, cap;            /* reads: timeline -> record, in dict insertion order */
    Rd *r;
} Seg;

typedef struct {
    PyObject *storage;      /* owned */
    int64_t st;
    int n, cap;             /* segments */
    int64_t *bounds;        /* n + 1 entries when n > 0 */
    Seg *segs;
} Shadow;

/* ---- interval lists (shadow.py: iv_*) ------------------------------------------------------ */

typedef struct {
    int64_t lo, hi;
} IV;

typedef struct {
    IV *v;
    int n, cap;
} IVL;

/* ---- graphs (checker.py: _Graph, _GraphInput) ----------------------------------------------- */

typedef struct {
    PyObject *fp;           /* borrowed from the CapturedOp the graph holds */
    int64_t st;
    IV *r;                  /* byte ranges */
    int nr;
    int64_t born;           /* NONE_I64 for None */
} Acc;

typedef struct {
    PyObject *obj;          /* the CapturedOp (owned by the graph's ops list) */
    Acc *reads, *writes;
    int nreads, nwrites;
} COp;

typedef struct GInput {
    PyObject *storage;      /* owned */
    int64_t st;
    IVL read, ever, fresh;
    int *ops;
    int nops, ops_cap;
    PyObject *out;          /* export: the _GraphInput made for it (borrowed) */
    Py_ssize_t refs;        /* the graph, and each readers list holding it */
} GInput;

typedef struct {
    PyObject *gid;          /* owned */
    int64_t g;
    PyObject *ops;          /* owned list(ev.ops) */
    COp *cops;
    int nops;
    GInput **inputs;        /* insertion order */
    int ninputs;
    int64_t captured, nreplays, first_replay;   /* first_replay NONE_I64 for None */
    int has_last;
    int64_t last_seq;
    int last_tl;
    PyObject *last_ev;      /* owned */
} Graph;

typedef struct {
    int64_t g;
    GInput *inp;
} Reader;

typedef struct {
    Reader *v;
    int n, cap;
    PyObject *out;          /* export: the list made for it (borrowed) */
} Readers;

/* ---- allocations (checker.py: _allocs, _sites, _recstreams) -------------------------------- */

typedef struct {
    PyObject *block;        /* owned */
    int has_alloc;          /* in _allocs */
    PyObject *stream;       /* owned, or NULL for None (with has_alloc) */
    int host;
    int has_site;           /* in _sites */
    PyObject *site_op, *site_stack;     /* owned: (op, stack[:1]) */
    PyObject *rs;           /* owned set of stream tids (_recstreams), or NULL */
} Block;

typedef struct {
    int tl;
    VC vc;
    int64_t seq;
    PyObject *stack;        /* owned */
    PyObject *event;        /* owned: the key */
} Recorded;

/* ---- event and footprint fields, read straight from their __slots__ ---------------------- */

enum {
    E_KERNEL, E_COPY, E_RECORD, E_WAIT_EVENT, E_WAIT_STREAM, E_HOST_SYNC, E_HOST_ACCESS, E_ALLOC,
    E_FREE, E_RECORD_STREAM, E_CAPTURE, E_REPLAY, E_NAME_TENSOR, E_STALE_TOLERANT,
    E_NAME_TIMELINE, E_N
};
static const char *const EVENT_CLASSES[E_N] = {
    "Kernel", "Copy", "EventRecord", "StreamWaitEvent", "StreamWaitStream", "HostSync",
    "HostAccess", "Alloc", "Free", "RecordStream", "GraphCapture", "GraphReplay", "NameTensor",
    "StaleTolerant", "NameTimeline"};

enum {
    F_THREAD, F_STACK, F_STREAM, F_READS, F_WRITES, F_OP, F_SRC, F_DST, F_NON_BLOCKING, F_EVENT,
    F_WAITER, F_WAITEE, F_SYNC_KIND, F_TARGET, F_BLOCK, F_HOST, F_GRAPH, F_OPS, F_STORAGE, F_LO,
    F_HI, F_NAME, F_ROW_BYTES, F_ITEMSIZE, F_TIMELINE, F_IS_HOST, F_DEVICE, F_N
};
static const char *const FIELD_NAMES[F_N] = {
    "thread", "stack", "stream", "reads", "writes", "op", "src", "dst", "non_blocking", "event",
    "waiter", "waitee", "sync_kind", "target", "block", "host", "graph", "ops", "storage", "lo",
    "hi", "name", "row_bytes", "itemsize", "timeline", "is_host", "device"};

/* Footprint and CapturedOp fields */
enum { P_STORAGE, P_RANGES, P_HOST, P_APPROX, P_BORN, P_N };
static const char *const FP_FIELDS[P_N] = {"storage", "ranges", "host", "approx", "born"};
enum { C_READS, C_WRITES, C_N };
static const char *const COP_FIELDS[C_N] = {"reads", "writes"};

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

#define SLOT(o, off) (*(PyObject **)((char *)(o) + (off)))

/* ---- the engine -------------------------------------------------------------------------- */

typedef struct {
    PyObject *fp;           /* borrowed (the event holds it) */
    int64_t st;
    int r0, nr;             /* ranges in the engine's scratch list */
    int64_t born;
    int host;               /* the footprint's host flag (copies) */
} FPv;

typedef struct {
    PyObject_HEAD
    int window;
    int64_t seq;
    int done;                   /* exported: the Python checker owns the state now */
    int running;                /* inside a handler */
    TL *tls;
    int ntl, tl_cap;
    Map tl_of;                  /* tid -> timeline index + 1 */
    int main;                   /* first host timeline, -1 */
    int *streams;               /* stream timelines in first-seen order */
    int nstreams, streams_cap;
    Map shadows;                /* storage -> Shadow* */
    Map blocks;                 /* block -> Block* */
    PyObject **unsited;         /* owned block ids allocated since the last op */
    int nunsited, unsited_cap;
    Map records;                /* event id -> Recorded* */
    Map graphs;                 /* graph id -> Graph* */
    Map readers;                /* storage -> Readers* */
    PyObject *names;            /* storage -> [_Name] (the Python checker's own form) */
    int64_t name_order;
    PyObject *tolerant;         /* storage -> byte intervals */
    PyObject *kit;              /* classes and helpers for export (a dict) */
    PyObject *frees_open;       /* [(allocation stream index, _OpenFree)] in free order */
    PyObject *namer;            /* the checker's namer during process_all (borrowed) */
    PyTypeObject *etype[E_N];
    Py_ssize_t off[E_N][F_N];
    PyTypeObject *fp_type;
    Py_ssize_t fp_off[P_N];
    PyTypeObject *cop_type;
    Py_ssize_t cop_off[C_N];
    /* per-event scratch */
    FPv *fps;
    int nfps, fps_cap;
    IV *ivs;
    int nivs, ivs_cap;
} Engine;

static PyTypeObject EngineType;
static PyObject *str_stream, *str_event, *str_device, *s_append, *s_format, *s_index_into;

/* A field of event `ev` of kind k (borrowed), NULL when unset (the caller hands over). */
static inline PyObject *field(Engine *e, int k, PyObject *ev, int f) {
    Py_ssize_t off = e->off[k][f];
    return off >= 0 ? SLOT(ev, off) : NULL;
}

static inline PyObject *fp_field(Engine *e, PyObject *fp, int f) {
    return SLOT(fp, e->fp_off[f]);
}

/* ---- timelines --------------------------------------------------------------------------- */

static int tl_index(Engine *e, int64_t tid) {
    void *v = map_get(&e->tl_of, tid);
    return v ? (int)((intptr_t)v - 1) : -1;
}

/* A new timeline for tid (Checker._new_host / _new_stream); its index, or -1 on error. */
static int tl_new(Engine *e, PyObject *tid, int64_t ti, int is_host) {
    if (RESERVE(e->tls, e->tl_cap, e->ntl + 1, 8) < 0)
        return -1;
    int i = e->ntl;
    TL *t = &e->tls[i];
    memset(t, 0, sizeof(TL));
    t->jh = -1;
    t->jv = -1;
    t->is_host = is_host;
    t->tid_i = ti;
    if (e->window > 0) {
        t->ctx = PyMem_Calloc((size_t)e->window, sizeof(CtxEnt));
        if (t->ctx == NULL) {
            PyErr_NoMemory();
            return -1;
        }
    }
    if (is_host) {
        if (e->main >= 0 && vc_copy(&t->vc, &e->tls[e->main].vc) < 0)
            return -1;
        if (!(i < t->vc.n && t->vc.has[i]) && vc_set(&t->vc, i, 0) < 0)
            return -1;
    } else {
        if (vc_set(&t->vc, i, 0) < 0)
            return -1;
        if (RESERVE(e->streams, e->streams_cap, e->nstreams + 1, 8) < 0)
            return -1;
        e->streams[e->nstreams++] = i;
    }
    if (map_put(&e->tl_of, ti, (void *)(intptr_t)(i + 1), NULL) < 0)
        return -1;
    Py_INCREF(tid);
    t->tid = tid;
    e->ntl++;
    if (is_host && e->main < 0)
        e->main = i;
    return i;
}

/* The timeline of tid, made as a host or stream timeline when new: index, -1 error, -2 hand over
   (tid is not an int). */
static int tl_get(Engine *e, PyObject *tid, int as_host) {
    int64_t ti;
    if (tid == NULL || !as_i64(tid, &ti))
        return -2;
    int i = tl_index(e, ti);
    return i >= 0 ? i : tl_new(e, tid, ti, as_host);
}

/* _join_launch where the host's clock changed since the stream last joined it: 0 / -1 */
static int join_launch(Engine *e, int s, int h) {
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
static int launch(Engine *e, PyObject *thread, PyObject *stream, int *hp) {
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

static void ctx_push(Engine *e, TL *t, CtxEnt *ent) {
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

static inline int64_t ctx_last_seq(Engine *e, TL *t) {
    if (t->ctx_n == 0)
        return -1;
    return t->ctx[(t->ctx_head + t->ctx_n - 1) % e->window].seq;
}

static void push_rec(Engine *e, TL *t, Rec *r) {
    CtxEnt c = {CX_REC, r->seq, r, NULL, NULL, 0, 0, -1, -1};
    rec_incref(r);
    ctx_push(e, t, &c);
}

/* A _Ctx entry; a and b are new references (or NULL), stolen. */
static void push_ctx(Engine *e, TL *t, int64_t seq, int kind, int label, PyObject *a,
                     PyObject *b, int peer, int64_t edge) {
    CtxEnt c = {CX_CTX, seq, NULL, a, b, kind, label, peer, edge};
    ctx_push(e, t, &c);
}

/* Checker._remember_noop */
static int remember_noop(TL *t, PyObject *event, int64_t seq, PyObject *stack, int host) {
    for (int k = 0; k < t->noop_n; k++) {
        int eq = PyObject_RichCompareBool(t->noop[k].event, event, Py_EQ);
        if (eq < 0)
            return -1;
        if (eq) {
            Py_DECREF(t->noop[k].event);
            Py_DECREF(t->noop[k].stack);
            memmove(&t->noop[k], &t->noop[k + 1], sizeof(Noop) * (size_t)(t->noop_n - k - 1));
            t->noop_n--;
            break;
        }
    }
    if (RESERVE(t->noop, t->noop_cap, t->noop_n + 1, 4) < 0)
        return -1;
    Py_INCREF(event);
    Py_INCREF(stack);
    t->noop[t->noop_n++] = (Noop){event, seq, stack, host};
    t->noop_made = 1;
    if (t->noop_n > NOOP_WAITS_KEPT) {
        Py_DECREF(t->noop[0].event);
        Py_DECREF(t->noop[0].stack);
        memmove(&t->noop[0], &t->noop[1], sizeof(Noop) * (size_t)(t->noop_n - 1));
        t->noop_n--;
    }
    return 0;
}

/* ---- interval lists (shadow.py) --------------------------------------------------------- */

static int ivl_reserve(IVL *l, int n) { return RESERVE(l->v, l->cap, n, 4); }

/* iv_add: l ∪ [lo, hi), merging touching intervals as the Python does */
static int ivl_add(IVL *l, int64_t lo, int64_t hi) {
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

static int ivl_union(IVL *x, const IVL *y) {
    for (int k = 0; k < y->n; k++)
        if (ivl_add(x, y->v[k].lo, y->v[k].hi) < 0)
            return -1;
    return 0;
}

/* iv_intersect into out (cleared first) */
static int ivl_intersect(const IVL *x, const IVL *y, IVL *out) {
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

/* is iv_subtract(x, y) non-empty? */
static int ivl_subtract_nonempty(const IVL *x, const IVL *y) {
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

static void ivl_free(IVL *l) {
    PyMem_Free(l->v);
    l->v = NULL;
    l->n = l->cap = 0;
}

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

static Shadow *shadow_get(Engine *e, int64_t st) { return map_get(&e->shadows, st); }

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

static void shadow_free(Shadow *sh) {
    for (int k = 0; k < sh->n; k++)
        seg_release(&sh->segs[k]);
    PyMem_Free(sh->segs);
    PyMem_Free(sh->bounds);
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

static inline int nbounds(const Shadow *sh) { return sh->n ? sh->n + 1 : 0; }

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

static int scratch_iv(Engine *e, int64_t lo, int64_t hi) {
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
static int parse_fps(Engine *e, PyObject *seq, int *first, int *count) {
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

static Graph *graph_get(Engine *e, int64_t g) { return map_get(&e->graphs, g); }

/* Checker._check_rc007 would note (w, cur) */
static int rc007_candidate(Engine *e, const Rec *w, int64_t born) {
    if (w->graph == NULL || born == NONE_I64 || w->seq < born)
        return 0;
    Graph *gr = w->g != NONE_I64 ? graph_get(e, w->g) : NULL;
    if (gr == NULL && w->g == NONE_I64)
        return 1;           /* a graph id the engine does not index: let Python decide */
    return gr != NULL && gr->first_replay != NONE_I64 && gr->first_replay < born;
}

/* Checker._read / _read_span (write 0) or _write / _write_span (write 1) would note nothing on
   footprint f: 1, else 0. Every segment under each range counts (splitting one copies its state). */
static int access_clean(Engine *e, const FPv *f, const VC *vc, int cur_host, int write) {
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
            if (s->w != NULL && (conflicts(s->w, vc, cur_host) ||
                                 (!write && rc007_candidate(e, s->w, f->born))))
                return 0;
            for (int m = 0; write && m < s->nr; m++)
                if (conflicts(s->r[m].rec, vc, cur_host))
                    return 0;
        }
    }
    return 1;
}

static inline int read_clean(Engine *e, const FPv *f, const VC *vc, int cur_host) {
    return access_clean(e, f, vc, cur_host, 0);
}

static inline int write_clean(Engine *e, const FPv *f, const VC *vc, int cur_host) {
    return access_clean(e, f, vc, cur_host, 1);
}

/* ---- the updates (Checker._read/_read_span/_write/_write_span, nothing noted) ------------- */

static int apply_read(Engine *e, const FPv *f, PyObject *storage, Rec *rec) {
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

static Readers *readers_get(Engine *e, int64_t st) { return map_get(&e->readers, st); }

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

static int apply_write(Engine *e, const FPv *f, PyObject *storage, Rec *rec, int64_t graph) {
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

static int all_clean(Engine *e, int rfirst, int rcount, int wfirst, int wcount, const VC *vc,
                     int cur_host) {
    for (int k = rfirst; k < rfirst + rcount; k++)
        if (!read_clean(e, &e->fps[k], vc, cur_host))
            return 0;
    for (int k = wfirst; k < wfirst + wcount; k++)
        if (!write_clean(e, &e->fps[k], vc, cur_host))
            return 0;
    return 1;
}

/* ---- handlers: 1 handled, 0 hand over (nothing changed that the Python would not redo), -1
   error ------------------------------------------------------------------------------------ */

#define HANDOVER 0
#define TRY(x) do { int r_ = (x); if (r_ <= 0) return r_ == -2 ? HANDOVER : r_; } while (0)

static int settle_frees(Engine *e, int s);

static Block *block_get(Engine *e, int64_t b) { return map_get(&e->blocks, b); }

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

/* Checker._on_kernel */
static int on_kernel(Engine *e, PyObject *ev, int64_t seq) {
    int s = launch(e, field(e, E_KERNEL, ev, F_THREAD), field(e, E_KERNEL, ev, F_STREAM), NULL);
    if (s < 0)
        return s == -2 ? HANDOVER : -1;
    TRY(settle_frees(e, s));
    PyObject *reads = field(e, E_KERNEL, ev, F_READS), *writes = field(e, E_KERNEL, ev, F_WRITES);
    int rf, rn, wf, wn;
    TRY(parse_fps(e, reads, &rf, &rn));
    TRY(parse_fps(e, writes, &wf, &wn));
    TL *t = &e->tls[s];
    if (!all_clean(e, rf, rn, wf, wn, &t->vc, 0))
        return HANDOVER;
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
static int on_host_access(Engine *e, PyObject *ev, int64_t seq) {
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
    if (!all_clean(e, rf, rn, wf, wn, &t->vc, 1))
        return HANDOVER;
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
static int on_copy(Engine *e, PyObject *ev, int64_t seq) {
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
    if (!all_clean(e, rf, 1, wf, 1, &t->vc, 0))
        return HANDOVER;
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
        Py_INCREF(op);
        dirs = PyUnicode_FromString(dir);
        if (dirs == NULL)
            return -1;
        push_ctx(e, ht, seq, K_SYNC, L_BLOCKING, op, dirs, s, seq);
    }
    return 1;
}

/* an event id the engine keys records and no-op waits by */
static int event_key(PyObject *ev, int64_t *k) { return ev != NULL && as_i64(ev, k); }

/* Checker._on_record */
static int on_record(Engine *e, PyObject *ev, int64_t seq) {
    PyObject *event = field(e, E_RECORD, ev, F_EVENT), *stack = field(e, E_RECORD, ev, F_STACK);
    int64_t key;
    if (!event_key(event, &key) || stack == NULL)
        return HANDOVER;
    int s = launch(e, field(e, E_RECORD, ev, F_THREAD), field(e, E_RECORD, ev, F_STREAM), NULL);
    if (s < 0)
        return s == -2 ? HANDOVER : -1;
    TL *t = &e->tls[s];
    Recorded *r = PyMem_Calloc(1, sizeof(Recorded));
    if (r == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    r->tl = s;
    r->seq = seq;
    if (vc_copy(&r->vc, &t->vc) < 0) {
        PyMem_Free(r);
        return -1;
    }
    Py_INCREF(stack);
    r->stack = stack;
    Py_INCREF(event);
    r->event = event;
    void *old;
    if (map_put(&e->records, key, r, &old) < 0)
        return -1;
    if (old != NULL) {
        Recorded *o = old;
        vc_free(&o->vc);
        Py_XDECREF(o->stack);
        Py_XDECREF(o->event);
        PyMem_Free(o);
    }
    Py_INCREF(event);
    push_ctx(e, t, seq, K_RECORD, L_RECORD, event, NULL, -1, -1);
    return 1;
}

/* Checker._on_wait_event */
static int on_wait_event(Engine *e, PyObject *ev, int64_t seq) {
    PyObject *event = field(e, E_WAIT_EVENT, ev, F_EVENT), *stack = field(e, E_WAIT_EVENT, ev, F_STACK);
    int64_t key;
    if (!event_key(event, &key) || stack == NULL)
        return HANDOVER;
    int s = launch(e, field(e, E_WAIT_EVENT, ev, F_THREAD), field(e, E_WAIT_EVENT, ev, F_STREAM), NULL);
    if (s < 0)
        return s == -2 ? HANDOVER : -1;
    TL *t = &e->tls[s];
    Recorded *r = map_get(&e->records, key);
    Py_INCREF(event);
    if (r == NULL) {
        if (remember_noop(t, event, seq, stack, 0) < 0) {
            Py_DECREF(event);
            return -1;
        }
        push_ctx(e, t, seq, K_WAIT, L_WAIT_NOOP, event, NULL, -1, -1);
        return 1;
    }
    if (vc_join(&t->vc, &r->vc) < 0) {
        Py_DECREF(event);
        return -1;
    }
    push_ctx(e, t, seq, K_WAIT, L_WAIT, event, NULL, r->tl, r->seq);
    return 1;
}

/* Checker._on_wait_stream */
static int on_wait_stream(Engine *e, PyObject *ev, int64_t seq) {
    int h = tl_get(e, field(e, E_WAIT_STREAM, ev, F_THREAD), 1);
    if (h < 0)
        return h == -2 ? HANDOVER : -1;
    int s = tl_get(e, field(e, E_WAIT_STREAM, ev, F_WAITER), 0);
    if (s < 0)
        return s == -2 ? HANDOVER : -1;
    if (join_launch(e, s, h) < 0)
        return -1;
    int w = tl_get(e, field(e, E_WAIT_STREAM, ev, F_WAITEE), 0);
    if (w < 0)
        return w == -2 ? HANDOVER : -1;
    TL *st = &e->tls[s];
    TL *wt = &e->tls[w];
    if (w != s && vc_join(&st->vc, &wt->vc) < 0)
        return -1;
    int64_t edge = ctx_last_seq(e, wt);
    push_ctx(e, st, seq, K_WAIT, L_WAIT_STREAM, NULL, NULL, w, edge);
    return 1;
}

/* Checker._on_host_sync */
static int on_host_sync(Engine *e, PyObject *ev, int64_t seq) {
    PyObject *kind = field(e, E_HOST_SYNC, ev, F_SYNC_KIND), *target = field(e, E_HOST_SYNC, ev, F_TARGET),
             *stack = field(e, E_HOST_SYNC, ev, F_STACK);
    if (kind == NULL || target == NULL || stack == NULL)
        return HANDOVER;
    if (!PyUnicode_Check(kind))
        return HANDOVER;
    int is_stream = PyUnicode_Compare(kind, str_stream) == 0;
    int is_event = PyUnicode_Compare(kind, str_event) == 0;
    int is_device = PyUnicode_Compare(kind, str_device) == 0;
    int64_t tk = 0;
    int target_int = target != Py_None && as_i64(target, &tk);
    if ((is_stream || is_event) && target != Py_None && !target_int)
        return HANDOVER;
    int h = tl_get(e, field(e, E_HOST_SYNC, ev, F_THREAD), 1);
    if (h < 0)
        return h == -2 ? HANDOVER : -1;
    TL *ht = &e->tls[h];
    if (is_stream) {
        int s = target_int ? tl_index(e, tk) : -1;
        if (s >= 0 && s != h) {
            if (vc_join(&ht->vc, &e->tls[s].vc) < 0)
                return -1;
            push_ctx(e, ht, seq, K_SYNC, L_STREAM_SYNC, NULL, NULL, s,
                     ctx_last_seq(e, &e->tls[s]));
        }
    } else if (is_event) {
        Recorded *r = target_int ? map_get(&e->records, tk) : NULL;
        Py_INCREF(target);
        if (r == NULL) {
            if (target == Py_None) {       /* a None event id: not an id the engine keys */
                Py_DECREF(target);
                return HANDOVER;
            }
            if (remember_noop(ht, target, seq, stack, 1) < 0) {
                Py_DECREF(target);
                return -1;
            }
            push_ctx(e, ht, seq, K_SYNC, L_EVENT_SYNC_NOOP, target, NULL, -1, -1);
        } else {
            if (vc_join(&ht->vc, &r->vc) < 0) {
                Py_DECREF(target);
                return -1;
            }
            push_ctx(e, ht, seq, K_SYNC, L_EVENT_SYNC, target, NULL, r->tl, r->seq);
        }
    } else if (is_device) {
        for (int k = 0; k < e->nstreams; k++) {
            TL *s = &e->tls[e->streams[k]];
            int match = target == Py_None || s->device == NULL;
            if (!match) {
                match = PyObject_RichCompareBool(s->device, target, Py_EQ);
                if (match < 0)
                    return -1;
            }
            if (match && vc_join(&ht->vc, &s->vc) < 0)
                return -1;
        }
        push_ctx(e, ht, seq, K_SYNC, L_DEVICE_SYNC, NULL, NULL, -1, -1);
    }
    ht->ver++;
    return 1;
}

/* Checker._on_alloc */
static int on_alloc(Engine *e, PyObject *ev, int64_t seq) {
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

static PyObject *open_hazards(Engine *e, PyObject *ev, int64_t seq, int h, PyObject *blk,
                              Block *bl, Shadow *sh, int a);

/* Checker._on_free */
static int on_free(Engine *e, PyObject *ev, int64_t seq) {
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

/* Checker._settle_frees, where nothing comes due: stream s issues device work (after its launch
   join); an open hazard it has not caught up with would be a finding: 0, hand over. Else the
   hazards close: 1. */
static int settle_frees(Engine *e, int s) {
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
static int on_record_stream(Engine *e, PyObject *ev, int64_t seq) {
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

/* ---- graphs ------------------------------------------------------------------------------- */

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

/* Checker._on_capture */
static int on_capture(Engine *e, PyObject *ev, int64_t seq) {
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
        /* the graph's inputs: reads of exact footprints */
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
            GInput *inp = graph_input(gr, fp_field(e, a->fp, P_STORAGE), a->st);
            if (inp == NULL) {
                ok = -1;
                break;
            }
            for (int q = 0; q < a->nr; q++)
                if (ivl_add(&inp->read, a->r[q].lo, a->r[q].hi) < 0) {
                    ok = -1;
                    break;
                }
            if (ok == 1 && (inp->nops == 0 || inp->ops[inp->nops - 1] != (int)k)) {
                if (RESERVE(inp->ops, inp->ops_cap, inp->nops + 1, 4) < 0) {
                    ok = -1;
                    break;
                }
                inp->ops[inp->nops++] = (int)k;
            }
        }
    }
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
    Py_INCREF(gid);
    PyObject *n = PyLong_FromSsize_t(nops);
    if (n == NULL)
        return -1;
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
static int on_replay(Engine *e, PyObject *ev, int64_t seq) {
    PyObject *gid = field(e, E_REPLAY, ev, F_GRAPH);
    int64_t g;
    if (gid == NULL || !as_i64(gid, &g))
        return HANDOVER;
    int s = launch(e, field(e, E_REPLAY, ev, F_THREAD), field(e, E_REPLAY, ev, F_STREAM), NULL);
    if (s < 0)
        return s == -2 ? HANDOVER : -1;
    TRY(settle_frees(e, s));
    Graph *gr = graph_get(e, g);
    if (gr != NULL) {
        int r = rc006_clean(e, gr);
        if (r <= 0)
            return r;
        const VC *vc = &e->tls[s].vc;
        for (int k = 0; k < gr->nops; k++) {
            COp *c = &gr->cops[k];
            for (int m = 0; m < c->nreads; m++) {
                FPv v;
                e->nivs = 0;
                if (acc_load(e, &c->reads[m], &v) < 0)
                    return -1;
                if (!read_clean(e, &v, vc, 0))
                    return HANDOVER;
                /* a read after this replay's own write of the same bytes (Checker._check_rc007
                   on this replay's record) */
                if (v.born != NONE_I64 && gr->first_replay != NONE_I64 &&
                    gr->first_replay < v.born && seq >= v.born)
                    return HANDOVER;
            }
            for (int m = 0; m < c->nwrites; m++) {
                FPv v;
                e->nivs = 0;
                if (acc_load(e, &c->writes[m], &v) < 0)
                    return -1;
                if (!write_clean(e, &v, vc, 0))
                    return HANDOVER;
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

/* ---- names (cold: kept in the Python checker's own form) ---------------------------------- */

/* Checker._on_name_tensor */
static int on_name_tensor(Engine *e, PyObject *ev, int64_t seq) {
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
    PyObject *cls = PyDict_GetItemString(e->kit, "_Name");
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
static int on_stale_tolerant(Engine *e, PyObject *ev, int64_t seq) {
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
    PyObject *args[3] = {cur ? cur : empty, lo, hi};
    PyObject *r = PyObject_Vectorcall(PyDict_GetItemString(e->kit, "iv_add"), args, 3, NULL);
    Py_XDECREF(empty);
    if (r == NULL)
        return -1;
    int rc = PyDict_SetItem(e->tolerant, storage, r);
    Py_DECREF(r);
    return rc < 0 ? -1 : 1;
}

/* Checker._on_name_timeline */
static int on_name_timeline(Engine *e, PyObject *ev, int64_t seq) {
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

/* ---- the loop ------------------------------------------------------------------------------ */

static int kind_of(Engine *e, PyObject *ev) {
    PyTypeObject *t = Py_TYPE(ev);
    for (int k = 0; k < E_N; k++)
        if (e->etype[k] == t)
            return k;
    return -1;
}

/* Checker._assign_sites, for a Kernel, Copy or HostAccess (op and stack checked present) */
static int assign_sites(Engine *e, PyObject *op, PyObject *stack) {
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

typedef int (*Handler)(Engine *, PyObject *, int64_t);
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
    int k = kind_of(e, ev);
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
        PyErr_SetString(PyExc_RuntimeError, "the engine has handed its state over");
        return NULL;
    }
    PyObject *prev = e->namer;
    e->namer = nargs > 1 && args[1] != Py_None ? args[1] : NULL;
    PyObject *r = process_iter(e, args[0]);
    e->namer = prev;
    return r;
}

static PyObject *eng_hazards_open(Engine *e, PyObject *unused) {
    return PyLong_FromSsize_t(PyList_GET_SIZE(e->frees_open));
}

/* ---- export: the Python Checker's state, as its own handlers would have left it ----------- */

typedef struct {
    Engine *e;
    PyObject *keep;         /* owns every record tuple and graph input made */
    PyObject **tl_objs;     /* _Timeline per index (borrowed from the checker's _tl) */
    PyObject *ctx_cls, *free_cls;
} Ex;

static PyObject *kit(Engine *e, const char *name) {
    PyObject *v = PyDict_GetItemString(e->kit, name);
    if (v == NULL && !PyErr_Occurred())
        PyErr_Format(PyExc_KeyError, "engine kit lacks %s", name);
    return v;
}

static PyObject *tid_or_none(Ex *x, int i) {
    PyObject *v = i >= 0 ? x->e->tls[i].tid : Py_None;
    Py_INCREF(v);
    return v;
}

static PyObject *rec_out(Ex *x, Rec *r) {
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
    if (rc < 0)
        return NULL;
    r->out = t;
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
    PyObject *o = PyObject_CallOneArg(kit(x->e, "_GraphInput"), inp->storage);
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
    if (set_attr_new(o, "ops", ops) < 0)
        return NULL;
    inp->out = o;
    return o;
}

/* Every timeline, or (keep != NULL: a view for open_hazards) what Checker._context reads of
   them for accesses since `from_seq`: the whole window of the timelines kept, and the other
   timelines' sync entries into those since then; no clocks, no no-op waits. */
static int export_timelines_of(Ex *x, PyObject *c, const char *keep, int64_t from_seq) {
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

static int export_shadows(Ex *x, PyObject *c) {
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
        Py_DECREF(lst);
        if (rc < 0)
            return -1;
        rd->out = lst;
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
    MAP_EACH(&e->shadows, key, val) {
        Shadow *sh = val;
        Readers *rd = readers_get(e, key);
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
        if (set_attr_new(o, "bounds", bounds) < 0 || set_attr_new(o, "states", states) < 0)
            return -1;
    }
    return 0;
}

static int export_graphs(Ex *x, PyObject *c) {
    Engine *e = x->e;
    PyObject *graphs = PyDict_New();
    if (graphs == NULL || PyObject_SetAttrString(c, "_graphs", graphs) < 0) {
        Py_XDECREF(graphs);
        return -1;
    }
    Py_DECREF(graphs);
    PyObject *cls = kit(e, "_Graph"), *rcls = kit(e, "_Replay");
    if (cls == NULL || rcls == NULL)
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
        if (bl->rs != NULL && PyDict_SetItem(recstreams, bl->block, bl->rs) < 0)
            goto done;
    }
    for (int k = 0; k < e->nunsited; k++)
        if (PyList_Append(unsited, e->unsited[k]) < 0)
            goto done;
    PyObject *order = PyLong_FromLongLong(e->name_order), *seq = PyLong_FromLongLong(e->seq);
    if (PyObject_SetAttrString(c, "_records", records) < 0 ||
        PyObject_SetAttrString(c, "_allocs", allocs) < 0 ||
        PyObject_SetAttrString(c, "_sites", sites) < 0 ||
        PyObject_SetAttrString(c, "_recstreams", recstreams) < 0 ||
        PyObject_SetAttrString(c, "_unsited", unsited) < 0 ||
        PyObject_SetAttrString(c, "_names", e->names) < 0 ||
        PyObject_SetAttrString(c, "_tolerant", e->tolerant) < 0 ||
        set_attr_new(c, "_name_order", order) < 0 || set_attr_new(c, "_seq", seq) < 0)
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

/* export(checker): fill a new Python Checker with this state; the engine is done after it */
static PyObject *eng_export(Engine *e, PyObject *c) {
    if (e->done) {
        PyErr_SetString(PyExc_RuntimeError, "the engine has handed its state over");
        return NULL;
    }
    Ex x = {e, PyList_New(0), NULL, kit(e, "_Ctx"), kit(e, "_CtxFree")};
    if (x.keep == NULL || x.ctx_cls == NULL || x.free_cls == NULL) {
        Py_XDECREF(x.keep);
        return NULL;
    }
    x.tl_objs = PyMem_Calloc((size_t)(e->ntl + 1), sizeof(PyObject *));
    int rc = x.tl_objs == NULL ? -1 : 0;
    if (rc == 0)
        rc = export_timelines(&x, c);
    if (rc == 0)
        rc = export_shadows(&x, c);
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
    PyMem_Free(x.tl_objs);
    Py_DECREF(x.keep);
    e->done = 1;        /* also after a failed export: the records' export cache is stale */
    if (rc < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* Checker._check_rc005 for a free that opens hazards: the accesses it is unordered with, listed
   as the Python loop lists them, and the hazards the reference code makes of them on a Checker
   given this engine's timelines (engine.py _open_hazards). A new list of _OpenFree, or NULL. */
static PyObject *open_hazards(Engine *e, PyObject *ev, int64_t seq, int h, PyObject *blk,
                              Block *bl, Shadow *sh, int a) {
    PyObject *result = NULL, *items = NULL, *view = NULL, *site = NULL, *seqo = NULL;
    char *keep = NULL;      /* timelines whose whole context window the view gets */
    PyObject *cls = kit(e, "Checker"), *fn = kit(e, "open_hazards");
    Ex x = {e, PyList_New(0), NULL, kit(e, "_Ctx"), kit(e, "_CtxFree")};
    if (cls == NULL || fn == NULL || x.keep == NULL || x.ctx_cls == NULL || x.free_cls == NULL)
        goto done;
    if ((x.tl_objs = PyMem_Calloc((size_t)(e->ntl + 1), sizeof(PyObject *))) == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if ((items = PyList_New(0)) == NULL)
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
    /* the records' export cache is the final export's: forget what this one filled in */
    for (int i = 0; i < e->ntl; i++) {
        TL *t = &e->tls[i];
        for (int k = 0; k < t->ctx_n; k++) {
            CtxEnt *c = &t->ctx[(t->ctx_head + k) % e->window];
            if (c->type == CX_REC)
                c->rec->out = NULL;
        }
    }
    for (int k = 0; k < sh->n; k++) {
        Seg *sg = &sh->segs[k];
        if (sg->w != NULL)
            sg->w->out = NULL;
        for (int m = 0; m < sg->nr; m++)
            sg->r[m].rec->out = NULL;
    }
    PyMem_Free(x.tl_objs);
    PyMem_Free(keep);
    Py_XDECREF(x.keep);
    Py_XDECREF(items);
    Py_XDECREF(view);
    Py_XDECREF(site);
    Py_XDECREF(seqo);
    return result;
}

/* ---- the type ------------------------------------------------------------------------------ */

static PyObject *eng_timeline_name(Engine *e, PyObject *tid) {
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

static void eng_dealloc(Engine *e) {
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
    int64_t key;
    void *val;
    MAP_EACH(&e->shadows, key, val)
        shadow_free(val);
    map_free(&e->shadows);
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
    MAP_EACH(&e->records, key, val) {
        Recorded *r = val;
        vc_free(&r->vc);
        Py_XDECREF(r->stack);
        Py_XDECREF(r->event);
        PyMem_Free(r);
    }
    map_free(&e->records);
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
    Py_XDECREF(e->names);
    Py_XDECREF(e->tolerant);
    Py_XDECREF(e->kit);
    Py_XDECREF(e->frees_open);
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
    {"hazards_open", (PyCFunction)eng_hazards_open, METH_NOARGS,
     "RC005 hazards open now (Checker._frees_open)"},
    {"export", (PyCFunction)eng_export, METH_O,
     "export(checker): give a new Checker this state (the engine is done after it)"},
    {"timeline_name", (PyCFunction)eng_timeline_name, METH_O, "Checker.timeline_name"},
    {"stats", (PyCFunction)eng_stats, METH_NOARGS, "Checker.stats"},
    {NULL}};

static PyGetSetDef eng_getset[] = {
    {"events_processed", (getter)eng_get_seq, NULL, "events handled so far", NULL},
    {"done", (getter)eng_get_done, NULL, "the state was exported", NULL},
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
    if (!(str_stream = PyUnicode_InternFromString("stream")) ||
        !(str_event = PyUnicode_InternFromString("event")) ||
        !(str_device = PyUnicode_InternFromString("device")) ||
        !(s_append = PyUnicode_InternFromString("append")) ||
        !(s_format = PyUnicode_InternFromString("format")) ||
        !(s_index_into = PyUnicode_InternFromString("index_into")))
        return NULL;
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
