/* The recurrent layers RNN, GRU and LSTM, unrolled over their (static) sequence into
 * kiln ops by the ONNX definitions: the input projection of every step is one
 * `linear` over the whole sequence, and each step is a `linear` of the hidden state,
 * slices for the gates, their activations and the elementwise state update. Being
 * ordinary ops, the unrolled graph runs on every target and has gradients, so a
 * recurrent model trains too. Layouts 0 ([seq, batch, ...]) and 1 ([batch, seq, ...]),
 * all directions, initial states, peepholes, clip, GRU's linear_before_reset, the
 * activations kiln has ops for, and constant sequence_lens: a step past a sequence's
 * end leaves its state as it was and outputs zeros there (a `where` on the batch),
 * so the final state is that of its last step, and a reverse pass starts there. */
#include "onnx_internal.h"

#include <string.h>

typedef enum { CELL_RNN, CELL_GRU, CELL_LSTM } Cell;

static const char *const cell_names[] = {"RNN", "GRU", "LSTM"};
static const int cell_gates[] = {1, 3, 4};
static const int cell_activations[] = {1, 2, 3}; /* f, g, h */

enum { MAX_ACTIVATIONS = 6 };
/* Each step is some twenty nodes: a hostile sequence length must not make the graph
 * grow without bound. */
enum { MAX_STEPS = 4096 };

/* An activation function: op (with alpha and beta where it takes them), or for the
 * two that kiln has no op for, alpha * x + beta (Affine) and alpha * tanh(beta * x)
 * (ScaledTanh). */
typedef struct {
    const char *name;
    OpId op;
    int n_params; /* of alpha, beta */
    double alpha, beta;
} Activation;

static const Activation activation_table[] = {
    {"Sigmoid", OP_SIGMOID, 0, 0, 0},
    {"Tanh", OP_TANH, 0, 0, 0},
    {"Relu", OP_RELU, 0, 0, 0},
    {"LeakyRelu", OP_LEAKY_RELU, 1, 0.01, 0},
    {"HardSigmoid", OP_HARDSIGMOID, 2, 0.2, 0.5},
    {"Softplus", OP_SOFTPLUS, 0, 0, 0},
    {"Affine", OP_MUL, 2, 1, 0},
    {"ScaledTanh", OP_TANH, 2, 1, 1},
};

typedef struct {
    Cell cell;
    int64_t hidden;
    bool has_clip;
    double clip;
    bool linear_before_reset;
    Activation act[2][3]; /* per direction: f, g, h */
} Recurrent;

static int slice_axis(Importer *im, int x, int64_t axis, int64_t start, int64_t end) {
    int64_t one = 1;
    Node *n = im_node(im, OP_SLICE, 1, &x);
    if (!n || im_set_ints(im, n, ATTR_STARTS, &start, 1) || im_set_ints(im, n, ATTR_ENDS, &end, 1) ||
        im_set_ints(im, n, ATTR_AXES, &axis, 1) || im_set_ints(im, n, ATTR_STEPS, &one, 1))
        return -1;
    return im_finish(im, n, -1);
}

/* Direction d of a per-direction input [num_directions, ...], reshaped to dims. */
static int direction_of(Importer *im, int x, int d, const int64_t *dims, int rank) {
    int s = slice_axis(im, x, 0, d, d + 1);
    return s < 0 ? -1 : im_reshape(im, s, dims, rank, -1);
}

/* x w^T (+ b when b >= 0). */
static int linear(Importer *im, int x, int w, int b) {
    int in[3] = {x, w, b};
    Node *n = im_node(im, OP_LINEAR, b >= 0 ? 3 : 2, in);
    return n ? im_finish(im, n, -1) : -1;
}

static int concat(Importer *im, const int *parts, int count, int64_t axis, int out_k) {
    Node *n = im_node(im, OP_CONCAT, count, parts);
    return !n || im_set_int(im, n, ATTR_AXIS, axis) ? -1 : im_finish(im, n, out_k);
}

static int transpose(Importer *im, int x, const int64_t *perm, int rank, int out_k) {
    Node *n = im_node(im, OP_TRANSPOSE, 1, &x);
    return !n || im_set_ints(im, n, ATTR_PERM, perm, rank) ? -1 : im_finish(im, n, out_k);
}

/* The activation applied to x, after the clip when the node has one. */
static int activate(Importer *im, const Recurrent *r, const Activation *a, int x) {
    if (r->has_clip) {
        Node *n = im_node(im, OP_CLIP, 1, &x);
        if (!n || im_set_float(im, n, ATTR_MIN, -r->clip) || im_set_float(im, n, ATTR_MAX, r->clip) ||
            (x = im_finish(im, n, -1)) < 0)
            return -1;
    }
    if (strcmp(a->name, "Affine") == 0) {
        int y = im_binary(im, OP_MUL, x, im_scalar(im, a->alpha), -1);
        return y < 0 ? -1 : im_binary(im, OP_ADD, y, im_scalar(im, a->beta), -1);
    }
    if (strcmp(a->name, "ScaledTanh") == 0) {
        int y = im_binary(im, OP_MUL, x, im_scalar(im, a->beta), -1);
        if (y < 0 || (y = im_unary(im, OP_TANH, y, -1)) < 0)
            return -1;
        return im_binary(im, OP_MUL, y, im_scalar(im, a->alpha), -1);
    }
    Node *n = im_node(im, a->op, 1, &x);
    if (!n || (a->n_params > 0 && im_set_float(im, n, ATTR_ALPHA, a->alpha)) ||
        (a->n_params > 1 && im_set_float(im, n, ATTR_BETA, a->beta)))
        return -1;
    return im_finish(im, n, -1);
}

/* The activations attribute and its alpha and beta lists, which are consumed in the
 * order of the activations that take them; without it, the defaults (f = Sigmoid
 * except for RNN, g = h = Tanh). One list serves both directions when it names only
 * one direction's. */
static int read_activations(Importer *im, Recurrent *r, int n_dirs) {
    int per_dir = cell_activations[r->cell], n_names = 0, n_alpha = 0, n_beta = 0;
    const char *names[MAX_ACTIVATIONS];
    double alphas[MAX_ACTIVATIONS], betas[MAX_ACTIVATIONS];
    if (im_attr_strings(im, "activations", names, MAX_ACTIVATIONS, &n_names) < 0 ||
        im_attr_floats(im, "activation_alpha", alphas, MAX_ACTIVATIONS, &n_alpha) < 0 ||
        im_attr_floats(im, "activation_beta", betas, MAX_ACTIVATIONS, &n_beta) < 0)
        return -1;
    if (n_names == 0) {
        names[0] = r->cell == CELL_RNN ? "Tanh" : "Sigmoid";
        names[1] = names[2] = "Tanh";
        n_names = per_dir;
    }
    if (n_names != per_dir && n_names != per_dir * n_dirs)
        return im_error(im, "activations has %d entries; %s takes %d per direction (%d directions)", n_names,
                        cell_names[r->cell], per_dir, n_dirs);
    int next_alpha = 0, next_beta = 0;
    for (int d = 0; d < n_dirs; d++)
        for (int k = 0; k < per_dir; k++) {
            const char *name = names[n_names == per_dir ? k : d * per_dir + k];
            const Activation *a = NULL;
            for (size_t i = 0; i < sizeof activation_table / sizeof *activation_table; i++)
                if (strcmp(activation_table[i].name, name) == 0)
                    a = &activation_table[i];
            if (!a)
                return im_error(im,
                                "activation '%s' is not supported (kiln has Sigmoid, Tanh, Relu, LeakyRelu, "
                                "HardSigmoid, Softplus, Affine, ScaledTanh)",
                                name);
            Activation *to = &r->act[d][k];
            *to = *a;
            /* a list naming one direction's activations is read again for the next */
            if (n_names == per_dir && k == 0)
                next_alpha = next_beta = 0;
            if (a->n_params > 0 && next_alpha < n_alpha)
                to->alpha = alphas[next_alpha++];
            if (a->n_params > 1 && next_beta < n_beta)
                to->beta = betas[next_beta++];
        }
    return 0;
}

/* The inputs of one direction, as kiln values: the input projection of every step
 * [seq, batch, gates * hidden], the recurrence weights and biases, peepholes. */
typedef struct {
    int xw;            /* x w^T + wb */
    int r, rb;         /* recurrence [gates * hidden, hidden] and its bias (or -1) */
    int r_h, rb_h;     /* GRU without linear_before_reset: the h gate's apart */
    int p_i, p_o, p_f; /* LSTM's peepholes [hidden], or -1 */
} Direction;

static int step_rnn(Importer *im, const Recurrent *r, const Direction *dir, int d, int xt, int h) {
    int y = im_binary(im, OP_ADD, xt, linear(im, h, dir->r, dir->rb), -1);
    return y < 0 ? -1 : activate(im, r, &r->act[d][0], y);
}

static int step_gru(Importer *im, const Recurrent *r, const Direction *dir, int d, int xt, int h) {
    int64_t hs = r->hidden;
    int rec = linear(im, h, dir->r, dir->rb); /* [1, batch, 3 or 2 hidden] */
    int zr = rec < 0 ? -1
                     : im_binary(im, OP_ADD, slice_axis(im, xt, 2, 0, 2 * hs),
                                 slice_axis(im, rec, 2, 0, 2 * hs), -1);
    int z = zr < 0 ? -1 : activate(im, r, &r->act[d][0], slice_axis(im, zr, 2, 0, hs));
    int reset = z < 0 ? -1 : activate(im, r, &r->act[d][0], slice_axis(im, zr, 2, hs, 2 * hs));
    if (reset < 0)
        return -1;
    int hx = slice_axis(im, xt, 2, 2 * hs, 3 * hs), hr;
    if (r->linear_before_reset)
        hr = im_binary(im, OP_MUL, reset, slice_axis(im, rec, 2, 2 * hs, 3 * hs), -1);
    else
        hr = linear(im, im_binary(im, OP_MUL, reset, h, -1), dir->r_h, dir->rb_h);
    int cand = hr < 0 ? -1 : im_binary(im, OP_ADD, hx, hr, -1);
    if (cand < 0 || (cand = activate(im, r, &r->act[d][1], cand)) < 0)
        return -1;
    /* (1 - z) * candidate + z * h */
    int keep = im_binary(im, OP_SUB, im_scalar(im, 1), z, -1);
    if (keep < 0 || (keep = im_binary(im, OP_MUL, keep, cand, -1)) < 0)
        return -1;
    return im_binary(im, OP_ADD, keep, im_binary(im, OP_MUL, z, h, -1), -1);
}

/* One LSTM step: the new h, and *c updated. */
static int step_lstm(Importer *im, const Recurrent *r, const Direction *dir, int d, int xt, int h, int *c) {
    int64_t hs = r->hidden;
    const Activation *f = &r->act[d][0], *g = &r->act[d][1], *hact = &r->act[d][2];
    int gates = im_binary(im, OP_ADD, xt, linear(im, h, dir->r, dir->rb), -1);
    if (gates < 0)
        return -1;
    int gi = slice_axis(im, gates, 2, 0, hs), go = slice_axis(im, gates, 2, hs, 2 * hs);
    int gf = slice_axis(im, gates, 2, 2 * hs, 3 * hs), gc = slice_axis(im, gates, 2, 3 * hs, 4 * hs);
    if (gi < 0 || go < 0 || gf < 0 || gc < 0)
        return -1;
    if (dir->p_i >= 0 && ((gi = im_binary(im, OP_ADD, gi, im_binary(im, OP_MUL, dir->p_i, *c, -1), -1)) < 0 ||
                          (gf = im_binary(im, OP_ADD, gf, im_binary(im, OP_MUL, dir->p_f, *c, -1), -1)) < 0))
        return -1;
    int i = activate(im, r, f, gi), forget = activate(im, r, f, gf), cand = activate(im, r, g, gc);
    if (i < 0 || forget < 0 || cand < 0)
        return -1;
    int kept = im_binary(im, OP_MUL, forget, *c, -1), added = im_binary(im, OP_MUL, i, cand, -1);
    if (kept < 0 || added < 0 || (*c = im_binary(im, OP_ADD, kept, added, -1)) < 0)
        return -1;
    if (dir->p_o >= 0 && (go = im_binary(im, OP_ADD, go, im_binary(im, OP_MUL, dir->p_o, *c, -1), -1)) < 0)
        return -1;
    int o = activate(im, r, f, go), hc = activate(im, r, hact, *c);
    return o < 0 || hc < 0 ? -1 : im_binary(im, OP_MUL, o, hc, -1);
}

enum { ALL_ACTIVE = -2, NONE_ACTIVE = -3 };

/* Which of the batch's sequences have a step t (t < lens[b]): ALL_ACTIVE, NONE_ACTIVE,
 * or a bool const [1, batch, 1] telling each (-1 after an error). */
static int step_active(Importer *im, const int64_t *lens, int64_t batch, int64_t t) {
    int64_t count = 0;
    for (int64_t k = 0; k < batch; k++)
        count += t < lens[k];
    if (count == batch || count == 0)
        return count ? ALL_ACTIVE : NONE_ACTIVE;
    Type type = type_make(3, (const int64_t[]){1, batch, 1});
    type.dtype = DT_BOOL;
    Tensor *mask = tensor_new(&type);
    for (int64_t k = 0; mask && k < batch; k++)
        mask->b[k] = t < lens[k];
    return im_const_tensor(im, mask);
}

/* Checks input k against [dims]; 0 when absent (then *value is -1). */
static int optional_input(Importer *im, int k, const char *what, const int64_t *dims, int rank, int *value) {
    *value = -1;
    if (!im_has_input(im, k))
        return 0;
    Type t = {0};
    if (im_input_type(im, k, &t))
        return -1;
    Type want = type_make(rank, dims);
    if (t.rank != rank || memcmp(t.dims, dims, sizeof(int64_t) * rank) != 0) {
        char got[128], exp[128];
        type_str(&t, got, sizeof got);
        type_str(&want, exp, sizeof exp);
        return im_error(im, "%s is %s; expected %s", what, got, exp);
    }
    return im_input(im, k, value);
}

static int imp_recurrent(Importer *im, Cell cell) {
    Recurrent r = {.cell = cell};
    const char *direction = "forward";
    int64_t layout = 0, lbr = 0, input_forget = 0;
    int has_clip;
    if (im_attr_int(im, "hidden_size", &r.hidden) < 0 || im_attr_string(im, "direction", &direction) < 0 ||
        im_attr_int(im, "layout", &layout) < 0 || (has_clip = im_attr_float(im, "clip", &r.clip)) < 0 ||
        (cell == CELL_GRU && im_attr_int(im, "linear_before_reset", &lbr) < 0) ||
        (cell == CELL_LSTM && im_attr_int(im, "input_forget", &input_forget) < 0))
        return -1;
    r.linear_before_reset = lbr != 0;
    r.has_clip = has_clip == 1;
    if (input_forget)
        return im_error(im, "input_forget = %lld is not supported (only 0)", (long long)input_forget);
    if (layout != 0 && layout != 1)
        return im_error(im, "layout must be 0 or 1, not %lld", (long long)layout);
    bool bidirectional = strcmp(direction, "bidirectional") == 0;
    if (!bidirectional && strcmp(direction, "forward") != 0 && strcmp(direction, "reverse") != 0)
        return im_error(im, "direction '%s' is not forward, reverse or bidirectional", direction);
    int n_dirs = bidirectional ? 2 : 1;
    if (read_activations(im, &r, n_dirs))
        return -1;

    Type xt_type = {0};
    int x;
    if (im_input(im, 0, &x) || im_input_type(im, 0, &xt_type))
        return -1;
    if (xt_type.rank != 3)
        return im_error(im,
                        "X must have rank 3 ([seq, batch, input] or, with layout 1, [batch, seq, input]), "
                        "not %d",
                        xt_type.rank);
    int64_t seq = xt_type.dims[layout], batch = xt_type.dims[1 - layout], in_size = xt_type.dims[2];
    int64_t hs = r.hidden, gh = cell_gates[cell] * hs;
    if (hs < 1 || hs > (1 << 24))
        return im_error(im, "hidden_size %lld is out of range", (long long)hs);
    if (seq < 1 || seq > MAX_STEPS)
        return im_error(im, "the sequence has %lld steps; kiln unrolls 1 to %d", (long long)seq, MAX_STEPS);
    const int64_t perm3[] = {1, 0, 2};
    if (layout == 1 && (x = transpose(im, x, perm3, 3, -1)) < 0)
        return -1;

    int w, rw, b, p, h0, c0;
    const int64_t w_dims[] = {n_dirs, gh, in_size}, r_dims[] = {n_dirs, gh, hs}, b_dims[] = {n_dirs, 2 * gh};
    const int64_t h_dims[] = {n_dirs, batch, hs}, hl_dims[] = {batch, n_dirs, hs},
                  p_dims[] = {n_dirs, 3 * hs};
    if (optional_input(im, 1, "W", w_dims, 3, &w) || optional_input(im, 2, "R", r_dims, 3, &rw) ||
        optional_input(im, 3, "B", b_dims, 2, &b) ||
        optional_input(im, 5, "initial_h", layout ? hl_dims : h_dims, 3, &h0) ||
        (cell == CELL_LSTM && (optional_input(im, 6, "initial_c", layout ? hl_dims : h_dims, 3, &c0) ||
                               optional_input(im, 7, "P", p_dims, 2, &p))))
        return -1;
    if (w < 0 || rw < 0)
        return im_error(im, "W and R are required");
    if (cell != CELL_LSTM)
        c0 = p = -1;
    if (layout == 1 && ((h0 >= 0 && (h0 = transpose(im, h0, perm3, 3, -1)) < 0) ||
                        (c0 >= 0 && (c0 = transpose(im, c0, perm3, 3, -1)) < 0)))
        return -1;
    int64_t lens[ONNX_MAXL];
    bool partial = false; /* some sequence shorter than seq */
    if (im_has_input(im, 4)) {
        int n_lens;
        if (im_input_ints(im, 4, "sequence_lens", lens, &n_lens) < 0)
            return -1;
        if (n_lens != batch)
            return im_error(im, "sequence_lens has %d entries; the batch is %lld", n_lens, (long long)batch);
        for (int k = 0; k < n_lens; k++) {
            if (lens[k] < 1 || lens[k] > seq)
                return im_error(im, "sequence_lens[%d] is %lld; expected 1 to the sequence's %lld steps", k,
                                (long long)lens[k], (long long)seq);
            partial = partial || lens[k] < seq;
        }
    }

    const int64_t state_dims[] = {1, batch, hs};
    int ys[2], hn[2], cn[2];
    for (int d = 0; d < n_dirs; d++) {
        bool reverse = d == 1 || strcmp(direction, "reverse") == 0;
        Direction dir = {.rb = -1, .r_h = -1, .rb_h = -1, .p_i = -1, .p_o = -1, .p_f = -1};
        int wb = -1, wd, rd;
        const int64_t wd_dims[] = {gh, in_size}, rd_dims[] = {gh, hs}, bd_dims[] = {2 * gh};
        const int64_t pd_dims[] = {3 * hs};
        if ((wd = direction_of(im, w, d, wd_dims, 2)) < 0 || (rd = direction_of(im, rw, d, rd_dims, 2)) < 0)
            return -1;
        if (b >= 0) {
            int bd = direction_of(im, b, d, bd_dims, 1);
            if (bd < 0 || (wb = slice_axis(im, bd, 0, 0, gh)) < 0 ||
                (dir.rb = slice_axis(im, bd, 0, gh, 2 * gh)) < 0)
                return -1;
        }
        dir.r = rd;
        if (cell == CELL_GRU && !r.linear_before_reset) {
            /* the h gate's recurrence reads r * h, so it is a linear of its own */
            if ((dir.r = slice_axis(im, rd, 0, 0, 2 * hs)) < 0 ||
                (dir.r_h = slice_axis(im, rd, 0, 2 * hs, gh)) < 0 ||
                (dir.rb >= 0 && ((dir.rb_h = slice_axis(im, dir.rb, 0, 2 * hs, gh)) < 0 ||
                                 (dir.rb = slice_axis(im, dir.rb, 0, 0, 2 * hs)) < 0)))
                return -1;
        }
        if (p >= 0) {
            int pd = direction_of(im, p, d, pd_dims, 1);
            if (pd < 0 || (dir.p_i = slice_axis(im, pd, 0, 0, hs)) < 0 ||
                (dir.p_o = slice_axis(im, pd, 0, hs, 2 * hs)) < 0 ||
                (dir.p_f = slice_axis(im, pd, 0, 2 * hs, 3 * hs)) < 0)
                return -1;
        }
        if ((dir.xw = linear(im, x, wd, wb)) < 0)
            return -1;
        int h = h0 >= 0 ? slice_axis(im, h0, 0, d, d + 1) : im_filled(im, 3, state_dims, 0);
        int c = c0 >= 0 ? slice_axis(im, c0, 0, d, d + 1) : im_filled(im, 3, state_dims, 0);
        int *steps = arena_alloc(&im->arena, sizeof(int) * (size_t)seq);
        if (!steps)
            return im_error(im, "out of memory");
        for (int64_t s = 0; s < seq; s++) {
            int64_t t = reverse ? seq - 1 - s : s;
            int active = partial ? step_active(im, lens, batch, t) : ALL_ACTIVE;
            if (active == -1)
                return -1;
            if (active == NONE_ACTIVE) {
                if ((steps[t] = im_filled(im, 3, state_dims, 0)) < 0)
                    return -1;
                continue;
            }
            int xt = slice_axis(im, dir.xw, 0, t, t + 1), h_new, c_new = c;
            if (xt < 0)
                return -1;
            h_new = cell == CELL_RNN   ? step_rnn(im, &r, &dir, d, xt, h)
                    : cell == CELL_GRU ? step_gru(im, &r, &dir, d, xt, h)
                                       : step_lstm(im, &r, &dir, d, xt, h, &c_new);
            if (h_new < 0)
                return -1;
            if (active == ALL_ACTIVE) {
                h = steps[t] = h_new, c = c_new;
                continue;
            }
            /* the batch's sequences that ended keep their state, and output zeros */
            if ((h = im_where(im, active, h_new, h, -1)) < 0 ||
                (cell == CELL_LSTM && (c = im_where(im, active, c_new, c, -1)) < 0) ||
                (steps[t] = im_where(im, active, h_new, im_scalar(im, 0), -1)) < 0)
                return -1;
        }
        const int64_t y_dims[] = {seq, 1, batch, hs};
        if ((ys[d] = seq > 1 ? concat(im, steps, (int)seq, 0, -1) : steps[0]) < 0 ||
            (ys[d] = im_reshape(im, ys[d], y_dims, 4, -1)) < 0)
            return -1;
        hn[d] = h;
        cn[d] = c;
    }

    /* Y [seq, directions, batch, hidden], Y_h and Y_c [directions, batch, hidden];
     * with layout 1, batch first. */
    const int64_t perm4[] = {2, 0, 1, 3};
    const int *outs[] = {ys, hn, cn};
    for (int k = 0; k < im_n_outputs(im) && k < (cell == CELL_LSTM ? 3 : 2); k++) {
        if (!*im->node->output[k])
            continue;
        int axis = k == 0 ? 1 : 0;
        int v = n_dirs == 1 ? outs[k][0] : concat(im, outs[k], 2, axis, layout ? -1 : k);
        if (v < 0)
            return -1;
        if (layout)
            v = k == 0 ? transpose(im, v, perm4, 4, k) : transpose(im, v, perm3, 3, k);
        else if (n_dirs == 1)
            v = im_alias(im, k, v);
        if (v < 0)
            return -1;
    }
    return 0;
}

static int imp_rnn(Importer *im) {
    return imp_recurrent(im, CELL_RNN);
}
static int imp_gru(Importer *im) {
    return imp_recurrent(im, CELL_GRU);
}
static int imp_lstm(Importer *im) {
    return imp_recurrent(im, CELL_LSTM);
}

const OnnxOp onnx_ops_rnn[] = {
    {"GRU", imp_gru},
    {"LSTM", imp_lstm},
    {"RNN", imp_rnn},
    {NULL, NULL},
};
