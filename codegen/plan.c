/* The memory plan: where every workspace value and every node's scratch lives.
 *
 * Kernels run one after another, so a buffer is needed only from the first kernel
 * that writes it to the last that reads it (its lifetime, in kernel order), and
 * buffers whose lifetimes are disjoint may take the same memory. A buffer is a
 * value together with the values that share its memory:
 *   - a view (reshape, flatten, squeeze, unsqueeze, identity) is its input's data
 *     under another type, so lowering computes no kernel for it (view_of) and it
 *     reads its input's buffer;
 *   - an in-place result: a kernel marked in_place reads every input of its
 *     result's type only at the element it is writing, so its result may take the
 *     memory of such an input when nothing uses that input's buffer after the
 *     kernel (the buffer's lifetime ends there) and no other read of the kernel is
 *     in that buffer (a view read at other indexes).
 * A node's scratch (the im2col column matrix, a padded input) is a buffer of its own, live over the
 * node's kernels that use it.
 *
 * Offsets are assigned greedily, as TensorFlow Lite's and TVM's planners do: buffers
 * in some order, each into the tightest gap (best fit) left between the buffers
 * already placed whose lifetimes overlap its own, else above them all. Three orders
 * are tried and the smallest peak kept: by size, the largest buffer first; by
 * breadth, the kernels with the most bytes live first, at each its buffers not
 * placed yet, largest first (both from Pisarchyk and Lee, "Efficient Memory
 * Management for Deep Neural Net Inference", 2020); and in execution order, which
 * does best where one large early buffer (the first conv's column matrix) would
 * otherwise push the next layers' buffers above it. Where the best of them is above
 * the bound, each buffer that ends above the bound is tried again placed first, the
 * others in that plan's order: greedy puts a small buffer that outlives a large one
 * beside it above both, where placed first it would have taken the bottom
 * (MobileNetV2's features.2 result, between features.1's and the next expand's:
 * 1.125 times the bound, 1.000 placed first). Every buffer is placed clear of
 * every overlapping one, so two buffers live at the same kernel never share a byte.
 * No plan can need less than the most bytes live at any one kernel: that lower
 * bound is what the report compares the peak with.
 *
 * Without reuse, the plan is the simple one: every value its own offset, in node
 * order, and one scratch area above them all that every kernel uses. */
#include "codegen.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

static int64_t align64(int64_t x) {
    return (x + 63) & ~(int64_t)63;
}

/* Whether v needs workspace: placed nowhere yet and computed by an op. */
static bool in_workspace(const Program *p, int v) {
    int node = p->g->values[v].node;
    return p->buf[v].kind == BUF_NONE && node >= 0 && !op_is_decl(p->g->nodes[node]->op);
}

static int find(int *parent, int v) {
    while (parent[v] != v) {
        parent[v] = parent[parent[v]];
        v = parent[v];
    }
    return v;
}

/* The planner's working state: union-find over value ids (a buffer is a set of
 * values sharing memory, named by its root), and lifetimes and sizes per root. */
typedef struct {
    Program *p;
    int *parent;
    int *first, *last; /* first > last: no kernel uses it */
    int64_t *bytes;
} Planner;

static void touch(Planner *s, int v, int k) {
    if (v < 0 || !in_workspace(s->p, v))
        return;
    if (k < s->first[v])
        s->first[v] = k;
    if (k > s->last[v])
        s->last[v] = k;
}

/* Views join their input's buffer. */
static void join_views(Planner *s) {
    const Program *p = s->p;
    for (int v = 0; v < p->g->n_values; v++)
        if (p->view_of[v] >= 0 && in_workspace(p, v) && in_workspace(p, p->view_of[v])) {
            s->parent[v] = p->view_of[v];
            p->plan.share[v] = MEM_VIEW;
            p->plan.from[v] = p->view_of[v];
        }
}

/* Lifetimes and sizes per buffer, from those of its values. */
static void buffer_lifetimes(Planner *s) {
    const Program *p = s->p;
    for (int v = 0; v < p->g->n_values; v++)
        if (in_workspace(p, v) && s->first[v] <= s->last[v]) {
            int r = find(s->parent, v);
            if (r == v)
                continue;
            s->first[r] = s->first[v] < s->first[r] ? s->first[v] : s->first[r];
            s->last[r] = s->last[v] > s->last[r] ? s->last[v] : s->last[r];
            s->bytes[r] = s->bytes[v] > s->bytes[r] ? s->bytes[v] : s->bytes[r];
        }
}

/* The read of kernel k whose buffer the kernel's result may take, or -1. */
static int in_place_candidate(Planner *s, const Kernel *k, int index) {
    const Program *p = s->p;
    int w = k->writes[0], rw = find(s->parent, w);
    for (int j = 0; j < k->n_reads; j++) {
        int r = k->reads[j];
        if (r < 0 || !in_workspace(p, r) || !type_equal(&p->g->values[r].type, &p->g->values[w].type))
            continue;
        int rr = find(s->parent, r);
        if (rr == rw || s->last[rr] != index)
            continue;
        bool other = false; /* another value of the same buffer, read at other indexes */
        for (int o = 0; o < k->n_reads; o++)
            other |= k->reads[o] != r && k->reads[o] >= 0 && in_workspace(p, k->reads[o]) &&
                     find(s->parent, k->reads[o]) == rr;
        if (!other)
            return r;
    }
    return -1;
}

/* In kernel order, each in-place kernel's result joins the buffer of an input that
 * dies there; the joined buffer lives on as long as the result's did. */
static void join_in_place(Planner *s) {
    Program *p = s->p;
    for (int k = 0; k < p->n_kernels; k++) {
        const Kernel *kn = &p->kernels[k];
        if (!kn->in_place || kn->n_writes != 1 || kn->writes[0] < 0 || !in_workspace(p, kn->writes[0]))
            continue;
        int w = kn->writes[0], rw = find(s->parent, w);
        if (s->first[rw] != k)
            continue;
        int r = in_place_candidate(s, kn, k);
        if (r < 0)
            continue;
        int rr = find(s->parent, r);
        s->parent[rw] = rr;
        s->last[rr] = s->last[rw];
        s->bytes[rr] = s->bytes[rw] > s->bytes[rr] ? s->bytes[rw] : s->bytes[rr];
        p->plan.share[w] = MEM_IN_PLACE;
        p->plan.from[w] = r;
    }
}

static int by_first(const void *a, const void *b) {
    const MemBuffer *x = a, *y = b;
    if (x->first != y->first)
        return x->first < y->first ? -1 : 1;
    if ((x->value < 0) != (y->value < 0)) /* values before scratch */
        return x->value < 0 ? 1 : -1;
    return x->value != y->value ? (x->value < y->value ? -1 : 1) : (x->kernel < y->kernel ? -1 : 1);
}

/* The buffers: one per root that a kernel uses, one per run of a node's kernels
 * that use scratch; ordered by first kernel. */
static void collect_buffers(Planner *s) {
    Program *p = s->p;
    MemPlan *m = &p->plan;
    for (int v = 0; v < p->g->n_values; v++)
        if (in_workspace(p, v) && find(s->parent, v) == v && s->first[v] <= s->last[v])
            m->bufs[m->n_bufs++] = (MemBuffer){s->bytes[v], s->first[v], s->last[v], 0, v, -1};
    for (int k = 0; k < p->n_kernels; k++) {
        const Kernel *kn = &p->kernels[k];
        if (kn->scratch_bytes <= 0)
            continue;
        MemBuffer *prev = m->n_bufs ? &m->bufs[m->n_bufs - 1] : NULL;
        if (prev && prev->value < 0 && prev->last == k - 1 && p->kernels[k - 1].node == kn->node) {
            prev->last = k;
            prev->bytes = align64(kn->scratch_bytes) > prev->bytes ? align64(kn->scratch_bytes) : prev->bytes;
        } else {
            m->bufs[m->n_bufs++] = (MemBuffer){align64(kn->scratch_bytes), k, k, 0, -1, k};
        }
    }
    qsort(m->bufs, (size_t)m->n_bufs, sizeof *m->bufs, by_first);
}

static bool overlap(const MemBuffer *a, const MemBuffer *b) {
    return a->first <= b->last && b->first <= a->last;
}

static int by_offset(const void *a, const void *b) {
    const MemBuffer *x = *(const MemBuffer *const *)a, *y = *(const MemBuffer *const *)b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* Largest first; among equals, the earlier first (then the earlier in bufs, as
 * qsort is not stable). */
static int by_size(const void *a, const void *b) {
    const MemBuffer *x = *(const MemBuffer *const *)a, *y = *(const MemBuffer *const *)b;
    if (x->bytes != y->bytes)
        return x->bytes > y->bytes ? -1 : 1;
    if (x->first != y->first)
        return x->first < y->first ? -1 : 1;
    return x < y ? -1 : x > y;
}

/* Places the buffers in the given order, each into the tightest gap (best fit)
 * left between the buffers placed before it whose lifetimes overlap its own, else
 * above them all; near is scratch of n_bufs pointers. Returns the peak. */
static int64_t place(MemPlan *m, MemBuffer **order, MemBuffer **near) {
    int64_t peak = 0;
    for (int i = 0; i < m->n_bufs; i++) {
        MemBuffer *b = order[i];
        int n = 0;
        for (int j = 0; j < i; j++)
            if (overlap(b, order[j]))
                near[n++] = order[j];
        qsort(near, (size_t)n, sizeof *near, by_offset);
        int64_t end = 0, best = -1, best_gap = INT64_MAX;
        for (int j = 0; j < n; j++) {
            int64_t gap = near[j]->offset - end;
            if (gap >= b->bytes && gap < best_gap)
                best = end, best_gap = gap;
            if (near[j]->offset + near[j]->bytes > end)
                end = near[j]->offset + near[j]->bytes;
        }
        b->offset = best >= 0 ? best : end;
        peak = b->offset + b->bytes > peak ? b->offset + b->bytes : peak;
    }
    return peak;
}

/* Greedy by size: the largest buffer first. */
static void order_by_size(MemPlan *m, MemBuffer **order) {
    for (int i = 0; i < m->n_bufs; i++)
        order[i] = &m->bufs[i];
    qsort(order, (size_t)m->n_bufs, sizeof *order, by_size);
}

typedef struct {
    int64_t live; /* bytes live at the kernel */
    int kernel;
} Breadth;

static int by_breadth(const void *a, const void *b) {
    const Breadth *x = a, *y = b;
    if (x->live != y->live)
        return x->live > y->live ? -1 : 1;
    return x->kernel < y->kernel ? -1 : x->kernel > y->kernel;
}

/* Greedy by breadth: the kernels with the most bytes live first, and at each the
 * buffers not ordered yet, largest first. k holds the kernels with their live
 * bytes (sorted here); taken is scratch of n_bufs flags. */
static void order_by_breadth(MemPlan *m, MemBuffer **order, Breadth *k, int n_kernels, bool *taken) {
    qsort(k, (size_t)n_kernels, sizeof *k, by_breadth);
    memset(taken, 0, (size_t)m->n_bufs);
    int n = 0;
    for (int i = 0; i < n_kernels; i++) {
        int from = n;
        for (int b = 0; b < m->n_bufs; b++)
            if (!taken[b] && m->bufs[b].first <= k[i].kernel && k[i].kernel <= m->bufs[b].last) {
                taken[b] = true;
                order[n++] = &m->bufs[b];
            }
        qsort(order + from, (size_t)(n - from), sizeof *order, by_size);
    }
}

/* Keeps the plan of the current offsets, peak `peak`, placed in `order`, where it
 * beats *best. */
static void keep_if_better(MemPlan *m, MemBuffer **order, int64_t peak, int64_t *best, MemBuffer **best_order,
                           int64_t *offsets) {
    if (peak >= *best)
        return;
    *best = peak;
    for (int b = 0; b < m->n_bufs; b++)
        offsets[b] = m->bufs[b].offset;
    if (best_order)
        memcpy(best_order, order, sizeof *order * (size_t)m->n_bufs);
}

/* The three greedy orders, then the buffers above the bound each placed first (the
 * header comment), keeping the smallest peak (the first plan of the smallest);
 * offsets is scratch of n_bufs. */
static void assign_greedy(MemPlan *m, MemBuffer **order, MemBuffer **near, Breadth *k, int n_kernels,
                          bool *taken, int64_t *offsets) {
    int64_t best = INT64_MAX;
    MemBuffer **best_order = ir_calloc((size_t)m->n_bufs + 1, sizeof *best_order); /* NULL: no retries */
    for (int how = 0; how < 3; how++) {
        if (how == 0)
            order_by_size(m, order);
        else if (how == 1)
            order_by_breadth(m, order, k, n_kernels, taken);
        else
            for (int b = 0; b < m->n_bufs; b++) /* bufs are in order of first kernel */
                order[b] = &m->bufs[b];
        keep_if_better(m, order, place(m, order, near), &best, best_order, offsets);
    }
    for (int c = 0; best_order && best > m->bound && c < m->n_bufs; c++) {
        MemBuffer *first = &m->bufs[c];
        if (offsets[c] + first->bytes <= m->bound)
            continue;
        int n = 0;
        order[n++] = first;
        for (int i = 0; i < m->n_bufs; i++)
            if (best_order[i] != first)
                order[n++] = best_order[i];
        keep_if_better(m, order, place(m, order, near), &best, best_order, offsets);
    }
    ir_free(best_order);
    for (int b = 0; b < m->n_bufs; b++)
        m->bufs[b].offset = offsets[b];
}

/* Every value its own offset in node order, then one scratch area for all. */
static void assign_simple(Program *p, Planner *s, const int *buf_of_root) {
    MemPlan *m = &p->plan;
    int64_t ws = 0;
    for (int i = 0; i < p->g->n_nodes; i++) {
        const Node *n = p->g->nodes[i];
        for (int k = 0; k < n->n_out; k++) {
            int v = n->out[k];
            if (in_workspace(p, v) && find(s->parent, v) == v && buf_of_root[v] >= 0) {
                m->bufs[buf_of_root[v]].offset = ws;
                ws += m->bufs[buf_of_root[v]].bytes;
            }
        }
    }
    for (int b = 0; b < m->n_bufs; b++)
        if (m->bufs[b].value < 0)
            m->bufs[b].offset = ws;
}

/* The bytes live at each kernel, into k, from a difference array over kernel
 * indexes; returns the most, the lower bound. */
static int64_t live_bytes(const MemPlan *m, int64_t *delta, Breadth *k, int n_kernels) {
    memset(delta, 0, sizeof *delta * (size_t)(n_kernels + 1));
    for (int b = 0; b < m->n_bufs; b++) {
        delta[m->bufs[b].first] += m->bufs[b].bytes;
        delta[m->bufs[b].last + 1] -= m->bufs[b].bytes;
    }
    int64_t live = 0, most = 0;
    for (int i = 0; i < n_kernels; i++) {
        live += delta[i];
        k[i] = (Breadth){live, i};
        most = live > most ? live : most;
    }
    return most;
}

int plan_memory(Program *p, bool reuse, Diag *d) {
    Graph *g = p->g;
    MemPlan *m = &p->plan;
    size_t nv = (size_t)g->n_values + 1, nb = nv + (size_t)p->n_kernels;
    Planner s = {p, ir_calloc(nv, sizeof(int)), ir_calloc(nv, sizeof(int)), ir_calloc(nv, sizeof(int)),
                 ir_calloc(nv, sizeof(int64_t))};
    int *root_buf = ir_calloc(nv, sizeof(int));
    MemBuffer **order = ir_calloc(nb, sizeof *order), **near = ir_calloc(nb, sizeof *near);
    int64_t *delta = ir_calloc((size_t)p->n_kernels + 1, sizeof(int64_t)),
            *offsets = ir_calloc(nb, sizeof(int64_t));
    Breadth *breadth = ir_calloc((size_t)p->n_kernels + 1, sizeof *breadth);
    bool *taken = ir_calloc(nb, sizeof(bool));
    m->reuse = reuse;
    m->bufs = ir_calloc(nb, sizeof *m->bufs);
    m->buffer = ir_calloc(nv, sizeof(int));
    m->share = ir_calloc(nv, sizeof(MemShare));
    m->from = ir_calloc(nv, sizeof(int));
    int rc = -1;
    if (!s.parent || !s.first || !s.last || !s.bytes || !root_buf || !order || !near || !delta || !offsets ||
        !breadth || !taken || !m->bufs || !m->buffer || !m->share || !m->from) {
        diag_error(d, (Loc){0}, "out of memory planning the workspace");
        goto done;
    }
    for (int v = 0; v < g->n_values; v++) {
        s.parent[v] = v;
        s.first[v] = INT_MAX;
        s.last[v] = -1;
        s.bytes[v] = align64(type_numel(&g->values[v].type) * dtype_size(g->values[v].type.dtype));
        m->buffer[v] = m->from[v] = -1;
        m->share[v] = MEM_OWN;
    }
    for (int k = 0; k < p->n_kernels; k++) {
        const Kernel *kn = &p->kernels[k];
        for (int j = 0; j < kn->n_reads; j++)
            touch(&s, kn->reads[j], k);
        for (int j = 0; j < kn->n_writes; j++)
            touch(&s, kn->writes[j], k);
    }
    if (reuse && p->view_of)
        join_views(&s);
    buffer_lifetimes(&s);
    if (reuse)
        join_in_place(&s);
    collect_buffers(&s);
    /* every placement puts a buffer at most at the sum of the others' sizes, so a sum
       that fits in int64 keeps every offset and the peak in it too */
    int64_t total = 0;
    for (int b = 0; b < m->n_bufs; b++)
        if (!ck_add(total, m->bufs[b].bytes, &total)) {
            diag_error(
                d, (Loc){0},
                "the workspace of '%s' is too large to address (its buffers total more than %lld bytes)",
                g->name, (long long)INT64_MAX);
            goto done;
        }
    for (size_t v = 0; v < nv; v++)
        root_buf[v] = -1;
    for (int b = 0; b < m->n_bufs; b++)
        if (m->bufs[b].value >= 0)
            root_buf[m->bufs[b].value] = b;
    for (int v = 0; v < g->n_values; v++)
        if (in_workspace(p, v))
            m->buffer[v] = root_buf[find(s.parent, v)];
    m->bound = live_bytes(m, delta, breadth, p->n_kernels);
    if (reuse)
        assign_greedy(m, order, near, breadth, p->n_kernels, taken, offsets);
    else
        assign_simple(p, &s, root_buf);
    m->peak = 0;
    for (int b = 0; b < m->n_bufs; b++)
        if (m->bufs[b].offset + m->bufs[b].bytes > m->peak)
            m->peak = m->bufs[b].offset + m->bufs[b].bytes;
    for (int v = 0; v < g->n_values; v++)
        if (m->buffer[v] >= 0)
            p->buf[v] = (Buffer){BUF_WORK, m->bufs[m->buffer[v]].offset};
    for (int b = 0; b < m->n_bufs; b++)
        for (int k = m->bufs[b].first; m->bufs[b].value < 0 && k <= m->bufs[b].last; k++)
            p->kernels[k].scratch = m->bufs[b].offset;
    p->workspace_bytes = m->peak;
    rc = 0;
done:
    ir_free(s.parent), ir_free(s.first), ir_free(s.last), ir_free(s.bytes);
    ir_free(root_buf), ir_free(order), ir_free(near), ir_free(delta), ir_free(offsets);
    ir_free(breadth), ir_free(taken);
    return rc;
}

/* ---- The report ---- */

void plan_report(const Program *p, Str *out) {
    const MemPlan *m = &p->plan;
    const Graph *g = p->g;
    str_printf(out, "memory plan of '%s', %s\n", g->name,
               m->reuse ? "reusing memory (memplan)" : "one buffer per value (memplan off)");
    str_printf(out, "kernels:\n");
    for (int k = 0; k < p->n_kernels; k++)
        str_printf(out, "  %4d  %s\n", k, p->kernels[k].comment);
    str_printf(out, "buffers:\n  %-6s %12s  %-12s %12s  %s\n", "buffer", "bytes", "kernels", "offset",
               "holds");
    for (int b = 0; b < m->n_bufs; b++) {
        const MemBuffer *mb = &m->bufs[b];
        char life[32];
        snprintf(life, sizeof life, "[%d, %d]", mb->first, mb->last);
        str_printf(out, "  b%-5d %12lld  %-12s %12lld  ", b, (long long)mb->bytes, life,
                   (long long)mb->offset);
        if (mb->value < 0) {
            str_printf(out, "scratch of %s %s\n", op_table[p->kernels[mb->kernel].node->op].name,
                       g->values[p->kernels[mb->kernel].node->out[0]].name);
            continue;
        }
        const char *sep = "";
        for (int v = 0; v < g->n_values; v++) {
            if (m->buffer[v] != b)
                continue;
            str_printf(out, "%s%s", sep, g->values[v].name);
            if (m->share[v] == MEM_VIEW)
                str_printf(out, " (view of %s)", g->values[m->from[v]].name);
            else if (m->share[v] == MEM_IN_PLACE)
                str_printf(out, " (in place of %s)", g->values[m->from[v]].name);
            sep = ", ";
        }
        str_printf(out, "\n");
    }
    str_printf(out, "peak:        %lld bytes (the workspace)\n", (long long)m->peak);
    str_printf(out, "lower bound: %lld bytes (the most bytes live at one kernel)\n", (long long)m->bound);
    if (m->bound > 0)
        str_printf(out, "peak/bound:  %.3f\n", (double)m->peak / (double)m->bound);
    else
        str_printf(out, "peak/bound:  -\n");
}
