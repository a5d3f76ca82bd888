/* racecheck.core._engine: the state every part of the engine shares, and what each part offers.

   The engine is one extension module in several files, one concern each, named like the Python
   checker's concerns (racecheck/core/checker/, the reference every handler ports):

     _engine_state.c      containers: int64 hash maps, growable arrays, interval lists, access records
     _engine_timelines.c  timelines, vector clocks, the launch edge, context windows
     _engine_access.c     shadow memory, footprints, Kernel / Copy / HostAccess (RC001-RC004, RC007)
     _engine_sync.c       event records and waits, stream waits, host syncs, no-op waits (RC008)
     _engine_memory.c     allocations, frees, record_stream, the RC005 hazards a free opens
     _engine_graphs.c     graph capture and replay, graph inputs' freshness (RC006)
     _engine_naming.c     tensor and timeline names, stale-tolerant declarations
     _engine_export.c     the Python Checker's state built from this one (the hand-over)
     _engine.c            the event loop, the Engine type and the module

   Functions here are shared between the files (the symbols stay inside the module: it is built
   with hidden visibility); the small ones every handler calls are inline. */
#ifndef RACECHECK_ENGINE_H
#define RACECHECK_ENGINE_H

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

extern char engine_tomb;
#define TOMB ((void *)&engine_tomb)

static inline uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

static inline void *map_get(const Map *m, int64_t key) {
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

/* Set key -> val (val not NULL); the previous value is returned through *old (NULL if none). */
int map_put(Map *m, int64_t key, void *val, void **old);
void *map_del(Map *m, int64_t key);
/* map_make's insertion: a new zeroed block of `size` bytes for key */
void *map_add_new(Map *m, int64_t key, size_t size);

/* The entry of key, a zeroed block of `size` bytes made when there is none (*made says so) */
static inline void *map_make(Map *m, int64_t key, size_t size, int *made) {
    void *v = map_get(m, key);
    *made = v == NULL;
    return v != NULL ? v : map_add_new(m, key, size);
}
void map_free(Map *m);

#define MAP_EACH(m, k_, v_)                                                             \
    for (Py_ssize_t k_##i = 0; k_##i < (m)->cap; k_##i++)                              \
        if ((m)->e[k_##i].val != NULL && (m)->e[k_##i].val != TOMB &&                  \
            ((k_ = (m)->e[k_##i].key), (void)k_, (v_ = (m)->e[k_##i].val), 1))

/* Room for `need` elements of `size` bytes in the array *v of capacity *cap (doubling, at least
   `first`): 0, or -1 with MemoryError. */
int reserve(void **v, int *cap, int need, size_t size, int first);

#define RESERVE(arr, cap, need, first) \
    ((need) <= (cap) ? 0 : reserve((void **)&(arr), &(cap), (need), sizeof(*(arr)), (first)))

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

int vc_reserve(VC *c, int n);

static inline int64_t vc_get(const VC *c, int i) { return i < c->n ? c->v[i] : 0; }

static inline int vc_set(VC *c, int i, int64_t x) {
    if (i >= c->n && vc_reserve(c, i + 1) < 0)
        return -1;
    c->v[i] = x;
    c->has[i] = 1;
    return 0;
}

/* clocks.join: dst ⊔= src */
int vc_join(VC *dst, const VC *src);
int vc_copy(VC *dst, const VC *src);
void vc_free(VC *c);

/* ---- access records (checker state: the plain 7-tuple TL, CLOCK, SEQ, EV, SUB, HOST, GRAPH) ----- */

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

Rec *rec_new(int tl, int64_t clock, int64_t seq, PyObject *ev, PyObject *sub, int host,
             PyObject *graph, int64_t g);
void rec_release(Rec *r);

static inline void rec_incref(Rec *r) { r->refs++; }

static inline void rec_decref(Rec *r) {
    if (r != NULL && --r->refs <= 0)
        rec_release(r);
}

/* ---- context windows (checker state: _Timeline.ctx, a deque of records, _Ctx and _CtxFree) ----- */

enum { CX_REC, CX_FREE, CX_CTX };
enum { K_COPY, K_HOST, K_SYNC, K_RECORD, K_WAIT, K_CAPTURE, K_REPLAY };
enum {
    L_COPY, L_HOST, L_BLOCKING, L_RECORD, L_WAIT_NOOP, L_WAIT, L_WAIT_STREAM, L_STREAM_SYNC,
    L_EVENT_SYNC_NOOP, L_EVENT_SYNC, L_DEVICE_SYNC, L_CAPTURE, L_REPLAY
};

typedef struct {
    int type;
    int64_t seq;
    Rec *rec;               /* CX_REC */
    PyObject *a, *b;        /* CX_FREE: a = block; CX_CTX: label arguments (owned) */
    int kind, label;        /* CX_CTX */
    int peer;               /* timeline index, -1 for None */
    int64_t edge;
} CtxEnt;

/* ---- timelines (checker state: _Timeline) ---------------------------------------------------- */

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
    PyObject *seen;         /* owned: StorageShadow.seen, the races the Python checker noted
                               here (kept across its resumes; NULL for None) */
} Shadow;

static inline int nbounds(const Shadow *sh) { return sh->n ? sh->n + 1 : 0; }

/* ---- interval lists (shadow.py: iv_*) ------------------------------------------------------ */

typedef struct {
    int64_t lo, hi;
} IV;

typedef struct {
    IV *v;
    int n, cap;
} IVL;

/* iv_add: l ∪ [lo, hi), merging touching intervals as the Python does */
int ivl_add(IVL *l, int64_t lo, int64_t hi);
int ivl_union(IVL *x, const IVL *y);
/* iv_intersect into out (cleared first) */
int ivl_intersect(const IVL *x, const IVL *y, IVL *out);
/* is iv_subtract(x, y) non-empty? */
int ivl_subtract_nonempty(const IVL *x, const IVL *y);
/* l ∪ ([lo, hi) less y) */
int ivl_add_minus(IVL *l, int64_t lo, int64_t hi, const IVL *y);
void ivl_free(IVL *l);

/* ---- graphs (checker state: _Graph, _GraphInput) ----------------------------------------------- */

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

/* ---- allocations (checker state: _allocs, _sites, _recstreams) -------------------------------- */

typedef struct {
    PyObject *block;        /* owned */
    int has_alloc;          /* in _allocs */
    PyObject *stream;       /* owned, or NULL for None (with has_alloc) */
    int host;
    int has_site;           /* in _sites */
    PyObject *site_op, *site_stack;     /* owned: (op, stack[:1]) */
    PyObject *rs;           /* owned set of stream tids (_recstreams), or NULL */
} Block;

/* ---- event records (checker state: _Recorded) ------------------------------------------------- */

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

enum {
    F_THREAD, F_STACK, F_STREAM, F_READS, F_WRITES, F_OP, F_SRC, F_DST, F_NON_BLOCKING, F_EVENT,
    F_WAITER, F_WAITEE, F_SYNC_KIND, F_TARGET, F_BLOCK, F_HOST, F_GRAPH, F_OPS, F_STORAGE, F_LO,
    F_HI, F_NAME, F_ROW_BYTES, F_ITEMSIZE, F_TIMELINE, F_IS_HOST, F_DEVICE, F_N
};

/* Footprint and CapturedOp fields */
enum { P_STORAGE, P_RANGES, P_HOST, P_APPROX, P_BORN, P_N };
enum { C_READS, C_WRITES, C_OP, C_STACK, C_N };

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
    int done;                   /* a failed export: the state may be half given away */
    int running;                /* inside a handler */
    int forced;                 /* apply(): update the state without the race checks */
    PyObject *raced;            /* the event the engine last stopped at on a race (owned), else
                                   NULL: the one apply() takes */
    PyObject *watched;          /* blocks whose Free the Python checker judges (a set, owned, or
                                   NULL): its open stale indices point into them */
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

/* interned at import (_engine.c): sync kinds compared against, and attribute and method names */
extern PyObject *str_stream, *str_event, *str_device, *s_append, *s_format, *s_index_into;

/* A field of event `ev` of kind k (borrowed), NULL when unset (the caller hands over). */
static inline PyObject *field(Engine *e, int k, PyObject *ev, int f) {
    Py_ssize_t off = e->off[k][f];
    return off >= 0 ? SLOT(ev, off) : NULL;
}

/* The kind of event ev (E_KERNEL ...), or -1 for a type the engine does not read. */
static inline int event_kind(Engine *e, PyObject *ev) {
    PyTypeObject *t = Py_TYPE(ev);
    for (int k = 0; k < E_N; k++)
        if (e->etype[k] == t)
            return k;
    return -1;
}

static inline PyObject *fp_field(Engine *e, PyObject *fp, int f) {
    return SLOT(fp, e->fp_off[f]);
}

static inline Shadow *shadow_get(Engine *e, int64_t st) { return map_get(&e->shadows, st); }
static inline Graph *graph_get(Engine *e, int64_t g) { return map_get(&e->graphs, g); }
static inline Readers *readers_get(Engine *e, int64_t st) { return map_get(&e->readers, st); }
static inline Block *block_get(Engine *e, int64_t b) { return map_get(&e->blocks, b); }

/* ---- handlers: 1 handled, 0 hand over (nothing changed that the Python would not redo), -1
   error ------------------------------------------------------------------------------------ */

#define HANDOVER 0
#define TRY(x) do { int r_ = (x); if (r_ <= 0) return r_ == -2 ? HANDOVER : r_; } while (0)

typedef int (*Handler)(Engine *, PyObject *, int64_t);

/* ---- _engine_timelines.c -------------------------------------------------------------------- */

int tl_new(Engine *e, PyObject *tid, int64_t ti, int is_host);
int join_launch(Engine *e, int s, int h);
int launch(Engine *e, PyObject *thread, PyObject *stream, int *hp);
void ctx_clear(CtxEnt *e);
void ctx_push(Engine *e, TL *t, CtxEnt *ent);
void push_rec(Engine *e, TL *t, Rec *r);
void push_ctx(Engine *e, TL *t, int64_t seq, int kind, int label, PyObject *a, PyObject *b,
              int peer, int64_t edge);
void timelines_free(Engine *e);

/* The index of timeline tid, -1 when there is none */
static inline int tl_index(Engine *e, int64_t tid) {
    void *v = map_get(&e->tl_of, tid);
    return v ? (int)((intptr_t)v - 1) : -1;
}

/* The timeline of tid, made as a host or stream timeline when new: index, -1 error, -2 hand over
   (tid is not an int). */
static inline int tl_get(Engine *e, PyObject *tid, int as_host) {
    int64_t ti;
    if (tid == NULL || !as_i64(tid, &ti))
        return -2;
    int i = tl_index(e, ti);
    return i >= 0 ? i : tl_new(e, tid, ti, as_host);
}

static inline int64_t ctx_last_seq(Engine *e, TL *t) {
    if (t->ctx_n == 0)
        return -1;
    return t->ctx[(t->ctx_head + t->ctx_n - 1) % e->window].seq;
}

/* ---- _engine_access.c ----------------------------------------------------------------------- */

void shadow_free(Shadow *sh);
void shadows_free(Engine *e);
int scratch_iv(Engine *e, int64_t lo, int64_t hi);
int parse_fps(Engine *e, PyObject *seq, int *first, int *count);
/* The current access, for a conflict the Python checker noted before (see noted_before in
   _engine_access.c): its event, timeline, and the event's footprints in the scratch list. */
typedef struct {
    PyObject *ev;
    int tl;
    int rf, rn, wf, wn;
} Cur;

int access_clean(Engine *e, const FPv *f, const VC *vc, int cur_host, int write, const Cur *cur);
int apply_read(Engine *e, const FPv *f, PyObject *storage, Rec *rec);
int apply_write(Engine *e, const FPv *f, PyObject *storage, Rec *rec, int64_t graph);
int on_kernel(Engine *e, PyObject *ev, int64_t seq);
int on_host_access(Engine *e, PyObject *ev, int64_t seq);
int on_copy(Engine *e, PyObject *ev, int64_t seq);
int raced(Engine *e, PyObject *ev);

static inline int read_clean(Engine *e, const FPv *f, const VC *vc, int cur_host) {
    return access_clean(e, f, vc, cur_host, 0, NULL);
}

static inline int write_clean(Engine *e, const FPv *f, const VC *vc, int cur_host) {
    return access_clean(e, f, vc, cur_host, 1, NULL);
}

/* ---- _engine_sync.c ------------------------------------------------------------------------- */

int on_record(Engine *e, PyObject *ev, int64_t seq);
int on_wait_event(Engine *e, PyObject *ev, int64_t seq);
int on_wait_stream(Engine *e, PyObject *ev, int64_t seq);
int on_host_sync(Engine *e, PyObject *ev, int64_t seq);
void records_free(Engine *e);

/* ---- _engine_memory.c ----------------------------------------------------------------------- */

int settle_open_frees(Engine *e, int s);
int assign_sites(Engine *e, PyObject *op, PyObject *stack);
int on_alloc(Engine *e, PyObject *ev, int64_t seq);
int on_free(Engine *e, PyObject *ev, int64_t seq);
int on_record_stream(Engine *e, PyObject *ev, int64_t seq);
void blocks_free(Engine *e);

/* Checker._settle_frees, where nothing comes due: stream s issues device work (after its launch
   join); an open hazard it has not caught up with would be a finding: 0, hand over. Else the
   hazards close: 1. */
static inline int settle_frees(Engine *e, int s) {
    return e->tls[s].frees == NULL ? 1 : settle_open_frees(e, s);
}

/* ---- _engine_graphs.c ----------------------------------------------------------------------- */

int on_capture(Engine *e, PyObject *ev, int64_t seq);
int on_replay(Engine *e, PyObject *ev, int64_t seq);
void graphs_free(Engine *e);

/* ---- _engine_naming.c ----------------------------------------------------------------------- */

int on_name_tensor(Engine *e, PyObject *ev, int64_t seq);
int on_stale_tolerant(Engine *e, PyObject *ev, int64_t seq);
int on_name_timeline(Engine *e, PyObject *ev, int64_t seq);
PyObject *timeline_name(Engine *e, PyObject *tid);

/* ---- _engine_export.c ----------------------------------------------------------------------- */

typedef struct {
    Engine *e;
    PyObject *keep;         /* owns every record tuple and graph input made */
    PyObject **tl_objs;     /* _Timeline per index (borrowed from the checker's _tl) */
    PyObject *ctx_cls, *free_cls;
    PyObject ***cached;     /* the state's export caches (Rec.out, GInput.out, Readers.out) this
                               export filled in: ex_end forgets them, as the next export must */
    int ncached, cached_cap;
} Ex;

PyObject *kit(Engine *e, const char *name);
int ex_begin(Ex *x, Engine *e);
int ex_cache(Ex *x, PyObject **slot, PyObject *v);
void ex_end(Ex *x);
PyObject *rec_out(Ex *x, Rec *r);
int export_timelines_of(Ex *x, PyObject *c, const char *keep, int64_t from_seq);
int export_checker(Engine *e, PyObject *c, PyObject *only);
int keep_seen(Engine *e, PyObject *c);

#endif
