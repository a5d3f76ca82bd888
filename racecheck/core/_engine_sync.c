/* Synchronization (the checker's sync concern: _on_record, _on_wait_event, _on_wait_stream,
   _on_host_sync), with the no-op waits RC008 reads. */
#include "_engine.h"

static void recorded_free(Recorded *r) {
    vc_free(&r->vc);
    Py_XDECREF(r->stack);
    Py_XDECREF(r->event);
    PyMem_Free(r);
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

/* an event id the engine keys records and no-op waits by */
static int event_key(PyObject *ev, int64_t *k) { return ev != NULL && as_i64(ev, k); }

/* Checker._on_record */
int on_record(Engine *e, PyObject *ev, int64_t seq) {
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
    Py_INCREF(stack);
    r->stack = stack;
    Py_INCREF(event);
    r->event = event;
    void *old;
    if (vc_copy(&r->vc, &t->vc) < 0 || map_put(&e->records, key, r, &old) < 0) {
        recorded_free(r);
        return -1;
    }
    if (old != NULL)
        recorded_free(old);
    Py_INCREF(event);
    push_ctx(e, t, seq, K_RECORD, L_RECORD, event, NULL, -1, -1);
    return 1;
}

/* Checker._on_wait_event */
int on_wait_event(Engine *e, PyObject *ev, int64_t seq) {
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
int on_wait_stream(Engine *e, PyObject *ev, int64_t seq) {
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
int on_host_sync(Engine *e, PyObject *ev, int64_t seq) {
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

void records_free(Engine *e) {
    int64_t key;
    void *val;
    MAP_EACH(&e->records, key, val)
        recorded_free(val);
    map_free(&e->records);
}
