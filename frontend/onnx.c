/* The ONNX importer: a ModelProto in, a verified Graph and its weights out.
 *
 * protobuf-c (with the C code protoc-c generates from ONNX's onnx.proto at build
 * time) unpacks the file; every field it gives is then treated as hostile. The walk:
 *
 *  1. The opset of the default domain ("" or "ai.onnx") from opset_import; one
 *     newer than kiln knows (17) is refused.
 *  2. Every node's op type is looked up in the op mapping (onnx_ops.c); all the
 *     nodes kiln cannot import are reported together, each with its name, op type,
 *     domain and opset, before anything else is done.
 *  3. Symbols: initializers (decoded and checked), graph inputs (a bound input
 *     becomes a constant; an initializer with the same name is a default and wins
 *     over the input, as in ONNX IR < 4), then the nodes in dependency order,
 *     found by a depth-first sort over the names they use, so that an undefined
 *     name or a cycle is an error naming the node, and a model whose nodes are not
 *     sorted still imports.
 *  4. Each node's importer builds kiln ops through the same construction the text
 *     parser uses (graph_add_node, attributes, attrs_normalize, infer_node), so each
 *     op is checked as it is added; a failure notes the ONNX node it came from.
 *     Attributes the importer did not read are an error, so nothing is silently
 *     ignored.
 *  5. The graph outputs, checked against their declared types; declarations are
 *     moved before the ops (so the printed model reads params first), and the graph
 *     is verified.
 *
 * Names are kept: a kiln value has its ONNX name (the printer quotes it where
 * needed), and the intermediates of an op that becomes several get fresh names
 * derived from the output's that no ONNX name uses. */
#include "onnx_internal.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

static const char *str(const char *s) {
    return s ? s : "";
}

bool is_onnx_path(const char *path) {
    size_t n = strlen(path);
    return n >= 5 && strcmp(path + n - 5, ".onnx") == 0;
}

/* ---- Symbols ---- */

static uint64_t hash_str(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

Sym *im_sym(Importer *im, const char *name) {
    if (!im->cap_syms)
        return NULL;
    for (uint64_t i = hash_str(name) & (uint64_t)(im->cap_syms - 1);;
         i = (i + 1) & (uint64_t)(im->cap_syms - 1)) {
        Sym *s = &im->syms[i];
        if (!s->name)
            return NULL;
        if (strcmp(s->name, name) == 0)
            return s;
    }
}

/* Adds a symbol (the caller checked that name is new). */
static Sym *sym_add(Importer *im, const char *name) {
    if (2 * (im->n_syms + 1) > im->cap_syms) {
        int cap = im->cap_syms ? 2 * im->cap_syms : 64;
        Sym *old = im->syms;
        int old_cap = im->cap_syms;
        im->syms = ir_calloc((size_t)cap, sizeof *im->syms);
        if (!im->syms) {
            im->syms = old;
            return NULL;
        }
        im->cap_syms = cap;
        for (int i = 0; i < old_cap; i++)
            if (old[i].name) {
                uint64_t j = hash_str(old[i].name) & (uint64_t)(cap - 1);
                while (im->syms[j].name)
                    j = (j + 1) & (uint64_t)(cap - 1);
                im->syms[j] = old[i];
            }
        ir_free(old);
    }
    uint64_t j = hash_str(name) & (uint64_t)(im->cap_syms - 1);
    while (im->syms[j].name)
        j = (j + 1) & (uint64_t)(im->cap_syms - 1);
    im->syms[j] = (Sym){name, -1, NULL, NULL};
    im->n_syms++;
    return &im->syms[j];
}

/* ---- Errors ---- */

/* "node 'NAME'", or "node #I" for an unnamed one (exporters often leave names out). */
static void node_desc(const Onnx__NodeProto *n, int index, char *buf, size_t cap) {
    if (*str(n->name))
        snprintf(buf, cap, "node '%.256s'", n->name);
    else
        snprintf(buf, cap, "node #%d", index);
}

int im_error(Importer *im, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    /* the kind diag_error would give fmt, which the message is wrapped in */
    DiagKind kind = strstr(fmt, "out of memory") ? DIAG_NO_MEMORY : DIAG_USER;
    char text[2048];
    const Onnx__NodeProto *n = im->node;
    if (!n) {
        snprintf(text, sizeof text, "%s: %s", im->file, msg);
        return diag_relay(im->d, kind, text);
    }
    char who[320];
    node_desc(n, im->node_index, who, sizeof who);
    snprintf(text, sizeof text, "%s: %s (%s, domain %s, opset %lld): %s", im->file, who, str(n->op_type),
             *str(n->domain) ? n->domain : "ai.onnx", (long long)im->opset, msg);
    return diag_relay(im->d, kind, text);
}

OConst *oconst_new(Importer *im, bool is_int, int rank, const int64_t *dims) {
    OConst *c = arena_alloc(&im->arena, sizeof *c);
    if (!c)
        return NULL;
    c->is_int = is_int;
    c->dtype = is_int ? DT_I64 : DT_F32;
    c->rank = rank;
    c->numel = 1;
    for (int k = 0; k < rank; k++) {
        c->dims[k] = dims[k];
        c->numel *= dims[k];
    }
    c->f = arena_alloc(&im->arena, sizeof(float) * (size_t)(c->numel ? c->numel : 1));
    if (!c->f)
        return NULL;
    if (is_int && !(c->ints = arena_alloc(&im->arena, sizeof(int64_t) * (size_t)(c->numel ? c->numel : 1))))
        return NULL;
    return c;
}

/* ---- Inputs of the current node ---- */

int im_n_inputs(Importer *im) {
    return (int)im->node->n_input;
}

int im_n_outputs(Importer *im) {
    return (int)im->node->n_output;
}

bool im_has_input(Importer *im, int k) {
    return k < (int)im->node->n_input && *str(im->node->input[k]);
}

static Sym *input_sym(Importer *im, int k) {
    return im_has_input(im, k) ? im_sym(im, im->node->input[k]) : NULL;
}

/* A constant read as data: a const literal when small and not a weight, else a
 * param whose value goes to the weights. */
Tensor *oconst_tensor(const OConst *c) {
    Type t = type_make(c->rank, c->dims);
    t.dtype = c->dtype;
    Tensor *r = tensor_new(&t);
    for (int64_t i = 0; r && i < c->numel; i++)
        switch (c->dtype) {
        case DT_I64: r->i64[i] = c->ints[i]; break;
        case DT_I32: r->i32[i] = (int32_t)c->ints[i]; break;
        case DT_BOOL: r->b[i] = c->ints[i] != 0; break;
        default: r->data[i] = c->f[i]; break;
        }
    return r;
}

static int materialize(Importer *im, Sym *s) {
    OConst *c = s->c;
    if (c->numel == 0)
        return im_error(im, "'%s' is an empty tensor used as data", s->name);
    bool literal = !c->initializer && c->numel <= 16;
    Node *n = graph_add_node(im->g, literal ? OP_CONST : OP_PARAM, 0, 1, (Loc){0});
    Tensor *data = oconst_tensor(c);
    if (!n || !data) {
        tensor_free(data);
        return im_error(im, "out of memory");
    }
    Type t = data->type;
    int v = graph_define(im->g, s->name, n, 0);
    if (v < 0) {
        tensor_free(data);
        return im_error(im, "out of memory");
    }
    im->g->values[v].type = t;
    if (literal)
        n->data = data;
    else if (tensors_add(im->weights, s->name, data))
        return im_error(im, "out of memory");
    s->value = v;
    return 0;
}

static int declare_input(Importer *im, const Onnx__ValueInfoProto *vi, Sym *s);

int im_input(Importer *im, int k, int *value) {
    Sym *s = input_sym(im, k);
    if (!s)
        return im_error(im, "input %d is required", k + 1);
    if (s->value < 0 && s->lazy) { /* read as data: an input after all */
        s->c = NULL;
        if (declare_input(im, s->lazy, s))
            return -1;
        s->lazy = NULL;
    }
    if (s->value < 0 && materialize(im, s))
        return -1;
    *value = s->value;
    return 0;
}

int im_const_input(Importer *im, int k, const char *what, OConst **c) {
    *c = NULL;
    Sym *s = input_sym(im, k);
    if (!s)
        return 0;
    if (s->c) {
        *c = s->c;
        return 0;
    }
    const Node *def = im->g->nodes[im->g->values[s->value].node];
    if (def->op == OP_INPUT)
        return im_error(im,
                        "%s '%s' is a graph input; kiln's shapes are static, so it must be a constant: "
                        "bind it to a value (kiln: --bind %s=FILE.npy or FILE.pb)",
                        what, s->name, s->name);
    return im_error(im, "%s '%s' is computed at run time; kiln needs it constant at import", what, s->name);
}

int im_input_type(Importer *im, int k, Type *t) {
    Sym *s = input_sym(im, k);
    if (!s)
        return im_error(im, "input %d is required", k + 1);
    if (s->c) {
        *t = type_make(s->c->rank, s->c->dims);
        t->dtype = s->c->dtype;
    } else
        *t = im->g->values[s->value].type;
    return 0;
}

/* ---- Attributes ---- */

static const Onnx__AttributeProto *find_attr(Importer *im, const char *name, int *index) {
    for (size_t k = 0; k < im->node->n_attribute; k++)
        if (strcmp(str(im->node->attribute[k]->name), name) == 0) {
            im->attr_used[k] = true;
            *index = (int)k;
            return im->node->attribute[k];
        }
    return NULL;
}

static const char *attr_type_name(int t) {
    static const char *const names[] = {"UNDEFINED",      "FLOAT",      "INT",        "STRING",
                                        "TENSOR",         "GRAPH",      "FLOATS",     "INTS",
                                        "STRINGS",        "TENSORS",    "GRAPHS",     "SPARSE_TENSOR",
                                        "SPARSE_TENSORS", "TYPE_PROTO", "TYPE_PROTOS"};
    return t >= 0 && t < 15 ? names[t] : "UNDEFINED";
}

/* The attribute if present and of type `want`; 0 absent, -1 wrong type. The type
 * field may be missing in old files: then the field holding a value decides. */
static int get_attr(Importer *im, const char *name, int want, const Onnx__AttributeProto **out) {
    int idx;
    const Onnx__AttributeProto *a = find_attr(im, name, &idx);
    *out = a;
    if (!a)
        return 0;
    int t = a->has_type ? (int)a->type : 0;
    if (t == 0) {
        t = a->has_f       ? 1
            : a->has_i     ? 2
            : a->has_s     ? 3
            : a->t         ? 4
            : a->n_floats  ? 6
            : a->n_ints    ? 7
            : a->n_strings ? 8
                           : 0;
        if (t == 0 && (want == 6 || want == 7 || want == 8))
            t = want; /* an empty list */
    }
    if (t != want)
        return im_error(im, "attribute '%s' is %s, expected %s", name, attr_type_name(t),
                        attr_type_name(want));
    return 1;
}

int im_attr_int(Importer *im, const char *name, int64_t *v) {
    const Onnx__AttributeProto *a;
    int r = get_attr(im, name, 2, &a);
    if (r == 1)
        *v = a->i;
    return r;
}

int im_attr_float(Importer *im, const char *name, double *v) {
    const Onnx__AttributeProto *a;
    int r = get_attr(im, name, 1, &a);
    if (r == 1)
        *v = a->f;
    return r;
}

int im_attr_string(Importer *im, const char *name, const char **v) {
    const Onnx__AttributeProto *a;
    int r = get_attr(im, name, 3, &a);
    if (r == 1) {
        char *s = arena_strndup(&im->arena, a->s.data ? (const char *)a->s.data : "", a->s.len);
        if (!s)
            return im_error(im, "out of memory");
        if (strlen(s) != a->s.len)
            return im_error(im, "attribute '%s' holds a NUL byte", name);
        *v = s;
    }
    return r;
}

int im_attr_strings(Importer *im, const char *name, const char **v, int cap, int *n) {
    const Onnx__AttributeProto *a;
    int r = get_attr(im, name, 8, &a);
    if (r == 1) {
        if (a->n_strings > (size_t)cap)
            return im_error(im, "attribute '%s' has %zu entries (at most %d)", name, a->n_strings, cap);
        *n = (int)a->n_strings;
        for (size_t k = 0; k < a->n_strings; k++) {
            const ProtobufCBinaryData *b = &a->strings[k];
            char *s = arena_strndup(&im->arena, b->data ? (const char *)b->data : "", b->len);
            if (!s)
                return im_error(im, "out of memory");
            if (strlen(s) != b->len)
                return im_error(im, "attribute '%s' holds a NUL byte", name);
            v[k] = s;
        }
    }
    return r;
}

int im_attr_ints(Importer *im, const char *name, int64_t *v, int cap, int *n) {
    const Onnx__AttributeProto *a;
    int r = get_attr(im, name, 7, &a);
    if (r == 1) {
        if (a->n_ints > (size_t)cap)
            return im_error(im, "attribute '%s' has %zu entries (at most %d)", name, a->n_ints, cap);
        *n = (int)a->n_ints;
        if (a->n_ints) /* an empty list has no array (memcpy from NULL is undefined) */
            memcpy(v, a->ints, sizeof(int64_t) * a->n_ints);
    }
    return r;
}

int im_attr_floats(Importer *im, const char *name, double *v, int cap, int *n) {
    const Onnx__AttributeProto *a;
    int r = get_attr(im, name, 6, &a);
    if (r == 1) {
        if (a->n_floats > (size_t)cap)
            return im_error(im, "attribute '%s' has %zu entries (at most %d)", name, a->n_floats, cap);
        *n = (int)a->n_floats;
        for (size_t k = 0; k < a->n_floats; k++)
            v[k] = a->floats[k];
    }
    return r;
}

int im_attr_tensor(Importer *im, const char *name, OConst **c) {
    const Onnx__AttributeProto *a;
    int r = get_attr(im, name, 4, &a);
    if (r == 1 && !a->t)
        return im_error(im, "attribute '%s' has no tensor", name);
    if (r == 1) {
        char what[256];
        snprintf(what, sizeof what, "node '%s' (%s): attribute '%s'", str(im->node->name),
                 str(im->node->op_type), name);
        if (onnx_tensor_decode(im, a->t, what, c))
            return -1;
    }
    return r;
}

void im_attr_ignore(Importer *im, const char *name) {
    int idx;
    find_attr(im, name, &idx);
}

/* ---- Building kiln nodes ---- */

Node *im_node(Importer *im, OpId op, int n_in, const int *in) {
    for (int k = 0; k < n_in; k++)
        if (in[k] < 0)
            return NULL; /* an operand failed (reported) */
    Node *n = graph_add_node(im->g, op, n_in, 1, (Loc){0});
    if (!n) {
        im_error(im, "out of memory");
        return NULL;
    }
    if (n_in)
        memcpy(n->in, in, sizeof(int) * (size_t)n_in);
    return n;
}

static Attr *attr_of(Importer *im, Node *n, AttrId id) {
    int i = op_attr_index(n->op, id);
    KILN_ASSERT(i >= 0);
    (void)im;
    n->attrs[i].set = true;
    return &n->attrs[i];
}

int im_set_int(Importer *im, Node *n, AttrId attr, int64_t v) {
    attr_of(im, n, attr)->i = v;
    return 0;
}

int im_set_float(Importer *im, Node *n, AttrId attr, double v) {
    attr_of(im, n, attr)->f = v;
    return 0;
}

int im_set_word(Importer *im, Node *n, AttrId attr, const char *word) {
    EnumSet set = op_table[n->op].attrs[op_attr_index(n->op, attr)].set;
    int choice = enum_lookup(set, word, strlen(word));
    if (choice < 0)
        return im_error(im, "%s must be one of %s, got '%s'", attr_name(attr), enum_choices[set].text, word);
    attr_of(im, n, attr)->i = choice;
    return 0;
}

int im_set_ints(Importer *im, Node *n, AttrId attr, const int64_t *v, int count) {
    Attr *a = attr_of(im, n, attr);
    a->n = count;
    a->ints = arena_alloc(&im->g->arena, sizeof(int64_t) * (size_t)(count + 1));
    if (!a->ints)
        return im_error(im, "out of memory");
    if (count)
        memcpy(a->ints, v, sizeof(int64_t) * (size_t)count);
    return 0;
}

int im_set_floats(Importer *im, Node *n, AttrId attr, const double *v, int count) {
    Attr *a = attr_of(im, n, attr);
    a->n = count;
    a->floats = arena_alloc(&im->g->arena, sizeof(double) * (size_t)(count + 1));
    if (!a->floats)
        return im_error(im, "out of memory");
    if (count)
        memcpy(a->floats, v, sizeof(double) * (size_t)count);
    return 0;
}

/* Whether a name is taken by an ONNX value (so no fresh name may use it). */
static bool onnx_taken(const char *name, void *ctx) {
    return im_sym((Importer *)ctx, name) != NULL;
}

static const char *out_name(Importer *im, int k) {
    return k < (int)im->node->n_output ? str(im->node->output[k]) : "";
}

/* The ONNX output k, checked to be new (its symbol was reserved by the walk); NULL
 * for an output left unnamed (not asked for). */
static Sym *out_sym(Importer *im, int k) {
    if (!*out_name(im, k))
        return NULL;
    Sym *s = im_sym(im, out_name(im, k));
    KILN_ASSERT(s && s->value < 0 && !s->c);
    return s;
}

int im_finish(Importer *im, Node *n, int out_k) {
    const char *name;
    Sym *s = NULL;
    if (out_k >= 0 && (s = out_sym(im, out_k))) {
        name = s->name;
    } else {
        const char *base = im->node->n_output ? out_name(im, 0) : str(im->node->name);
        name = graph_fresh_name(im->g, *base ? base : "t", onnx_taken, im);
        if (!name)
            return im_error(im, "out of memory");
    }
    int v = graph_define(im->g, name, n, 0);
    if (v < 0)
        return im_error(im, "out of memory");
    if (attrs_normalize(im->g, n, im->d) || infer_node(im->g, n, im->d)) {
        const Onnx__NodeProto *p = im->node;
        char who[320];
        node_desc(p, im->node_index, who, sizeof who);
        diag_note(im->d, "while importing %s (%s, domain %s, opset %lld) of %s as kiln's %s", who,
                  str(p->op_type), *str(p->domain) ? p->domain : "ai.onnx", (long long)im->opset, im->file,
                  op_table[n->op].name);
        return -1;
    }
    if (s)
        s->value = v;
    return v;
}

int im_unary(Importer *im, OpId op, int x, int out_k) {
    Node *n = im_node(im, op, 1, &x);
    return n ? im_finish(im, n, out_k) : -1;
}

int im_binary(Importer *im, OpId op, int a, int b, int out_k) {
    int in[2] = {a, b};
    Node *n = im_node(im, op, 2, in);
    return n ? im_finish(im, n, out_k) : -1;
}

int im_where(Importer *im, int cond, int a, int b, int out_k) {
    int in[3] = {cond, a, b};
    Node *n = im_node(im, OP_WHERE, 3, in);
    return n ? im_finish(im, n, out_k) : -1;
}

int im_const_tensor(Importer *im, Tensor *data) {
    Node *n = data ? graph_add_node(im->g, OP_CONST, 0, 1, (Loc){0}) : NULL;
    const char *base = im->node->n_output ? out_name(im, 0) : "c";
    char buf[512];
    snprintf(buf, sizeof buf, "%s.c", *base ? base : "c");
    const char *name = graph_fresh_name(im->g, buf, onnx_taken, im);
    int id = n && name ? graph_define(im->g, name, n, 0) : -1;
    if (id < 0) {
        tensor_free(data);
        return im_error(im, "out of memory");
    }
    n->data = data;
    im->g->values[id].type = data->type;
    return id;
}

int im_filled(Importer *im, int rank, const int64_t *dims, double v) {
    Type t = type_make(rank, dims);
    Tensor *data = tensor_new(&t);
    for (int64_t i = 0; data && i < type_numel(&t); i++)
        data->data[i] = (float)v;
    return im_const_tensor(im, data);
}

int im_scalar(Importer *im, double v) {
    return im_filled(im, 0, NULL, v);
}

int im_scalar_of(Importer *im, DType t, int64_t v) {
    Tensor *data = tensor_new(&(Type){.dtype = t});
    if (data && t == DT_F32)
        data->data[0] = (float)v;
    else if (data && t == DT_I64)
        data->i64[0] = v;
    else if (data && t == DT_I32)
        data->i32[0] = (int32_t)v;
    else if (data)
        data->b[0] = v != 0;
    return im_const_tensor(im, data);
}

int im_iota(Importer *im, int rank, int axis, int64_t n) {
    Type t = {.dtype = DT_I64, .rank = rank};
    for (int d = 0; d < rank; d++)
        t.dims[d] = d == axis ? n : 1;
    Tensor *data = tensor_new(&t);
    for (int64_t i = 0; data && i < n; i++)
        data->i64[i] = i;
    return im_const_tensor(im, data);
}

int im_define_const(Importer *im, int out_k, OConst *c) {
    Sym *s = out_sym(im, out_k);
    if (s)
        s->c = c;
    return 0;
}

int im_alias(Importer *im, int out_k, int value) {
    /* An identity op keeps the ONNX name defined, so outputs and later uses find it. */
    return im_unary(im, OP_IDENTITY, value, out_k) < 0 ? -1 : 0;
}

/* ---- The model ---- */

typedef struct {
    const Onnx__GraphProto *gp;
    int *order; /* node indices in dependency order */
} Walk;

static int check_name(Importer *im, const char *name, const char *what) {
    if (!name || !*name)
        return diag_error(im->d, (Loc){0}, "%s: %s has no name", im->file, what);
    if (im_sym(im, name))
        return diag_error(im->d, (Loc){0}, "%s: '%s' is defined twice (%s)", im->file, name, what);
    return sym_add(im, name) ? 0 : diag_error(im->d, (Loc){0}, "out of memory");
}

/* The newest opset of the default domain whose ops kiln's mapping describes
 * (docs/onnx.md). */
enum { ONNX_MAX_OPSET = 20 };

/* The default domain's opset, from opset_import. */
static int read_opset(Importer *im, const Onnx__ModelProto *m) {
    im->opset = -1;
    for (size_t k = 0; k < m->n_opset_import; k++) {
        const Onnx__OperatorSetIdProto *o = m->opset_import[k];
        if (!*str(o->domain) || strcmp(o->domain, "ai.onnx") == 0)
            im->opset = o->has_version ? o->version : 1;
    }
    if (im->opset < 0)
        im->opset = m->n_opset_import ? 1 : 1; /* IR version 2 and older: opset 1 */
    if (im->opset < 1 || im->opset > 1000)
        return diag_error(im->d, (Loc){0}, "%s: opset %lld of the default domain is not a valid version",
                          im->file, (long long)im->opset);
    /* a newer opset may have changed what an op means; importing it as an older one
       would silently compute something else */
    if (im->opset > ONNX_MAX_OPSET)
        return diag_error(
            im->d, (Loc){0},
            "%s: opset %lld of the default domain is newer than kiln knows (it imports opsets 1 "
            "to %d)",
            im->file, (long long)im->opset, ONNX_MAX_OPSET);
    return 0;
}

/* The opset a model imports for a domain ("" is the default one); 1 when not listed. */
static int64_t domain_opset(const Onnx__ModelProto *m, const char *domain) {
    bool dflt = !*domain || strcmp(domain, "ai.onnx") == 0;
    for (size_t k = 0; k < m->n_opset_import; k++) {
        const char *d = str(m->opset_import[k]->domain);
        if (dflt ? !*d || strcmp(d, "ai.onnx") == 0 : strcmp(d, domain) == 0)
            return m->opset_import[k]->has_version ? m->opset_import[k]->version : 1;
    }
    return 1;
}

/* Step 2: every unsupported node, all at once. */
static int check_supported(Importer *im, const Onnx__ModelProto *m, const Onnx__GraphProto *gp) {
    int bad = 0;
    for (size_t i = 0; i < gp->n_node; i++) {
        const Onnx__NodeProto *n = gp->node[i];
        const char *domain = str(n->domain);
        bool default_domain = !*domain || strcmp(domain, "ai.onnx") == 0;
        if (default_domain && onnx_find_op(str(n->op_type)))
            continue;
        if (!bad)
            diag_error(im->d, (Loc){0}, "%s: the model uses ops kiln cannot import:", im->file);
        bad++;
        char who[320];
        node_desc(n, (int)i, who, sizeof who);
        diag_note(im->d, "%s: op %s, domain %s, opset %lld%s", who, str(n->op_type),
                  *domain ? domain : "ai.onnx", (long long)domain_opset(m, domain),
                  default_domain ? "" : " (kiln imports the default domain only)");
    }
    if (bad)
        diag_note(im->d, "%d of %zu nodes unsupported; docs/onnx.md lists the ops kiln imports", bad,
                  gp->n_node);
    return bad ? -1 : 0;
}

/* Reads a binding's file as a constant. */
static int read_binding(Importer *im, const OnnxBind *b, OConst **c) {
    size_t n = strlen(b->file);
    if (n > 3 && strcmp(b->file + n - 3, ".pb") == 0) {
        unsigned char *buf;
        size_t len;
        if (read_file_bytes(b->file, &buf, &len, im->d))
            return -1;
        bool oom = false;
        ProtobufCAllocator pa = onnx_allocator(&oom);
        Onnx__TensorProto *t = onnx__tensor_proto__unpack(&pa, len, buf);
        int rc;
        if (t)
            rc = onnx_tensor_decode(im, t, b->file, c);
        else if (oom)
            rc = diag_error(im->d, (Loc){0}, "%s: out of memory reading the tensor", b->file);
        else
            rc = diag_error(im->d, (Loc){0},
                            "%s: not an ONNX TensorProto (the protobuf is malformed or truncated)", b->file);
        if (t)
            onnx__tensor_proto__free_unpacked(t, &pa);
        ir_free(buf);
        return rc;
    }
    Tensor *t;
    if (npy_read(b->file, &t, im->d))
        return -1;
    bool is_int = t->type.dtype != DT_F32;
    *c = oconst_new(im, is_int, t->type.rank, t->type.dims);
    if (!*c) {
        tensor_free(t);
        return diag_error(im->d, (Loc){0}, "out of memory");
    }
    (*c)->dtype = t->type.dtype;
    for (int64_t i = 0; i < (*c)->numel; i++) {
        (*c)->f[i] = (float)tensor_double(t, i);
        if (is_int)
            (*c)->ints[i] = tensor_int(t, i);
    }
    tensor_free(t);
    return 0;
}

/* The name a --dim binds dim k of a graph input's shape by: its dim_param, or for a
 * first dim with neither a size nor a name (an export's batch, often), UNNAMED_BATCH;
 * NULL for a dim with a size. */
static const char UNNAMED_BATCH[] = "N";

static const char *dim_name(const Onnx__TensorShapeProto__Dimension *dim, size_t k) {
    if (dim && dim->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM)
        return str(dim->dim_param);
    if (k == 0 && (!dim || dim->value_case != ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE))
        return UNNAMED_BATCH;
    return NULL;
}

/* The binding that fixes dim k, a symbolic one, at a size; NULL when none does. */
static const OnnxBind *dim_binding(const Importer *im, const Onnx__TensorShapeProto__Dimension *dim,
                                   size_t k) {
    const char *name = dim_name(dim, k);
    for (int b = 0; name && b < im->n_binds; b++)
        if (!im->binds[b].file && strcmp(im->binds[b].name, name) == 0)
            return &im->binds[b];
    return NULL;
}

/* The declared tensor type of a graph input or output: dtype and static shape, its
 * symbolic dims fixed where a binding names them. */
static int declared_type(Importer *im, const Onnx__ValueInfoProto *vi, int32_t *dtype, Type *t, bool *known) {
    *known = false;
    const Onnx__TypeProto *tp = vi->type;
    if (!tp || tp->value_case != ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE || !tp->tensor_type)
        return diag_error(im->d, (Loc){0}, "%s: '%s' is not a tensor (kiln's values are tensors)", im->file,
                          str(vi->name));
    const Onnx__TypeProto__Tensor *tt = tp->tensor_type;
    *dtype = tt->has_elem_type ? tt->elem_type : 0;
    if (!tt->shape)
        return 0;
    if (tt->shape->n_dim > KILN_MAX_RANK)
        return diag_error(im->d, (Loc){0}, "%s: '%s' has rank %zu (kiln's largest is %d)", im->file,
                          str(vi->name), tt->shape->n_dim, KILN_MAX_RANK);
    t->dtype = DT_F32;
    t->rank = (int)tt->shape->n_dim;
    for (int k = 0; k < t->rank; k++) {
        const Onnx__TensorShapeProto__Dimension *dim = tt->shape->dim[k];
        const OnnxBind *fixed = dim_binding(im, dim, (size_t)k);
        if (fixed)
            t->dims[k] = fixed->size;
        else if (dim && dim->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE)
            t->dims[k] = dim->dim_value;
        else
            return 0;
    }
    *known = true;
    return 0;
}

/* Why graph input vi's declared shape is not static: its first dim that is
 * symbolic (with the name to fix it by) or missing. */
static int no_static_shape(Importer *im, const Onnx__ValueInfoProto *vi, const char *name) {
    const Onnx__TensorShapeProto *shape = vi->type->tensor_type->shape;
    for (size_t k = 0; shape && k < shape->n_dim; k++) {
        const Onnx__TensorShapeProto__Dimension *dim = shape->dim[k];
        if (dim && dim->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM)
            return diag_error(
                im->d, (Loc){0},
                "%s: graph input '%s' has no static shape: dim %zu is the symbolic '%s'; kiln's "
                "shapes are static, so give it a size (kiln: --dim %s=SIZE)",
                im->file, name, k, str(dim->dim_param), str(dim->dim_param));
        if (k == 0 && dim_name(dim, k))
            return diag_error(im->d, (Loc){0},
                              "%s: graph input '%s' has no static shape: dim 0 has no size or name; kiln "
                              "calls it %s, so give it a size (kiln: --dim %s=SIZE) or keep it a "
                              "symbolic batch (--dim '%s<=BOUND')",
                              im->file, name, UNNAMED_BATCH, UNNAMED_BATCH, UNNAMED_BATCH);
        if (!dim || dim->value_case != ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE)
            return diag_error(
                im->d, (Loc){0},
                "%s: graph input '%s' has no static shape: dim %zu has no size; kiln's shapes are "
                "static",
                im->file, name, k);
    }
    return diag_error(im->d, (Loc){0}, "%s: graph input '%s' has no shape; kiln's shapes are static",
                      im->file, name);
}

static int declare_input(Importer *im, const Onnx__ValueInfoProto *vi, Sym *s) {
    int32_t dtype;
    Type t = {0};
    bool known;
    if (declared_type(im, vi, &dtype, &t, &known))
        return -1;
    if (onnx_kiln_dtype(dtype) < 0)
        return diag_error(
            im->d, (Loc){0},
            "%s: graph input '%s' is %s; kiln's inputs are FLOAT, INT64, INT32 or BOOL. If it is a "
            "shape-like parameter, bind it to a constant (kiln: --bind %s=FILE.npy or FILE.pb)",
            im->file, s->name, onnx_dtype_name(dtype), s->name);
    t.dtype = (DType)onnx_kiln_dtype(dtype);
    if (!known)
        return no_static_shape(im, vi, s->name);
    int64_t numel = 1;
    for (int k = 0; k < t.rank; k++) {
        if (t.dims[k] < 1)
            return diag_error(im->d, (Loc){0},
                              "%s: graph input '%s' has dim %d of size %lld (kiln's are >= 1)", im->file,
                              s->name, k, (long long)t.dims[k]);
        if (!ck_mul(numel, t.dims[k], &numel) || numel > KILN_MAX_NUMEL)
            return diag_error(im->d, (Loc){0}, "%s: graph input '%s' is too large", im->file, s->name);
    }
    Node *n = graph_add_node(im->g, OP_INPUT, 0, 1, (Loc){0});
    int v = n ? graph_define(im->g, s->name, n, 0) : -1;
    if (v < 0)
        return diag_error(im->d, (Loc){0}, "out of memory");
    im->g->values[v].type = t;
    s->value = v;
    return 0;
}

/* Whether graph input vi has a symbolic dim called name. */
static bool has_dim(const Onnx__ValueInfoProto *vi, const char *name) {
    const Onnx__TypeProto *tp = vi->type;
    if (!tp || tp->value_case != ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE || !tp->tensor_type ||
        !tp->tensor_type->shape)
        return false;
    const Onnx__TensorShapeProto *shape = tp->tensor_type->shape;
    for (size_t k = 0; k < shape->n_dim; k++)
        if (dim_name(shape->dim[k], k) && strcmp(dim_name(shape->dim[k], k), name) == 0)
            return true;
    return false;
}

/* Step 3: initializers, bindings and inputs. */
static int declare_sources(Importer *im, const Onnx__GraphProto *gp, const OnnxBind *binds, int n_binds) {
    for (size_t k = 0; k < gp->n_initializer; k++) {
        const Onnx__TensorProto *t = gp->initializer[k];
        char what[512];
        snprintf(what, sizeof what, "initializer '%s'", str(t->name));
        if (check_name(im, t->name, "an initializer"))
            return -1;
        Sym *s = im_sym(im, t->name);
        if (onnx_tensor_decode(im, t, what, &s->c))
            return -1;
        s->c->initializer = true;
    }
    if (gp->n_sparse_initializer)
        return diag_error(im->d, (Loc){0}, "%s: sparse initializers are not supported", im->file);
    for (int b = 0; b < n_binds; b++) {
        bool found = false;
        for (size_t k = 0; k < gp->n_input && !found; k++)
            found = binds[b].file ? strcmp(str(gp->input[k]->name), binds[b].name) == 0
                                  : has_dim(gp->input[k], binds[b].name);
        if (!found && binds[b].file)
            return diag_error(im->d, (Loc){0}, "%s: '%s' is bound to '%s' but is not an input of the model",
                              im->file, binds[b].name, binds[b].file);
        if (!found)
            return diag_error(im->d, (Loc){0}, "%s: no graph input has a symbolic dim '%s' to fix at %lld",
                              im->file, binds[b].name, (long long)binds[b].size);
    }
    for (size_t k = 0; k < gp->n_input; k++) {
        const Onnx__ValueInfoProto *vi = gp->input[k];
        const char *name = str(vi->name);
        const OnnxBind *bind = NULL;
        for (int b = 0; b < n_binds; b++)
            if (binds[b].file && strcmp(binds[b].name, name) == 0)
                bind = &binds[b];
        Sym *s = *name ? im_sym(im, name) : NULL;
        bool seen = false;
        for (size_t j = 0; j < k && !seen; j++)
            seen = strcmp(str(gp->input[j]->name), name) == 0;
        if (seen)
            return diag_error(im->d, (Loc){0}, "%s: graph input '%s' is listed twice", im->file, name);
        if (s && s->c && !bind)
            continue; /* an input with an initializer (IR < 4): the initializer is its value */
        if (!s && check_name(im, name, "a graph input"))
            return -1;
        s = im_sym(im, name);
        if (bind) {
            OConst *c;
            if (read_binding(im, bind, &c))
                return -1;
            int32_t dtype;
            Type t = {0};
            bool known;
            if (declared_type(im, vi, &dtype, &t, &known))
                return -1;
            if (known &&
                (t.rank != c->rank || memcmp(t.dims, c->dims, sizeof(int64_t) * (size_t)t.rank) != 0)) {
                Type got = type_make(c->rank, c->dims);
                char a[128], bb[128];
                return diag_error(
                    im->d, (Loc){0}, "%s: input '%s' is bound to '%s' of shape %s, but it is declared %s",
                    im->file, name, bind->file, type_str(&got, bb, sizeof bb), type_str(&t, a, sizeof a));
            }
            bool want_int = dtype != 1 && dtype != 10 && dtype != 11 && dtype != 16;
            if (!want_int)
                c->is_int = false; /* its f32 values stand */
            if (want_int && !c->is_int) {
                c->is_int = true;
                c->ints = arena_alloc(&im->arena, sizeof(int64_t) * (size_t)(c->numel ? c->numel : 1));
                if (!c->ints)
                    return diag_error(im->d, (Loc){0}, "out of memory");
                for (int64_t i = 0; i < c->numel; i++)
                    c->ints[i] = (int64_t)c->f[i];
            }
            s->c = c;
            if (bind->if_needed)
                s->lazy = vi;
            continue;
        }
        if (declare_input(im, vi, s))
            return -1;
    }
    return 0;
}

/* Step 3 continued: the nodes' outputs as symbols, and the nodes in dependency
 * order (a depth-first sort; a node on the stack reached again is a cycle). */
static int sort_nodes(Importer *im, const Onnx__GraphProto *gp, int *order) {
    int n = (int)gp->n_node;
    for (int i = 0; i < n; i++) {
        const Onnx__NodeProto *p = gp->node[i];
        for (size_t k = 0; k < p->n_output; k++) {
            if (!*str(p->output[k]))
                continue; /* an output not asked for */
            char what[512];
            snprintf(what, sizeof what, "an output of node '%s' (%s)", str(p->name), str(p->op_type));
            if (check_name(im, p->output[k], what))
                return -1;
        }
    }
    /* producer of each symbol, by a second table: sym index -> node */
    int *prod = ir_malloc(sizeof(int) * (size_t)im->cap_syms);
    int *state = ir_calloc((size_t)n + 1, sizeof(int));
    int *stack = ir_malloc(sizeof(int) * (size_t)(n + 1));
    int *next_in = ir_calloc((size_t)n + 1, sizeof(int));
    int rc = 0, placed = 0;
    if (!prod || !state || !stack || !next_in) {
        rc = diag_error(im->d, (Loc){0}, "out of memory");
        goto done;
    }
    for (int i = 0; i < im->cap_syms; i++)
        prod[i] = -1;
    for (int i = 0; i < n; i++)
        for (size_t k = 0; k < gp->node[i]->n_output; k++)
            if (*str(gp->node[i]->output[k]))
                prod[im_sym(im, gp->node[i]->output[k]) - im->syms] = i;
    for (int root = 0; root < n && !rc; root++) {
        if (state[root])
            continue;
        int top = 0;
        stack[top++] = root;
        state[root] = 1;
        while (top > 0 && !rc) {
            int i = stack[top - 1];
            const Onnx__NodeProto *p = gp->node[i];
            int next = -1;
            while (next_in[i] < (int)p->n_input && next < 0) {
                const char *in = str(p->input[next_in[i]++]);
                if (!*in)
                    continue;
                Sym *s = im_sym(im, in);
                char who[320];
                node_desc(p, i, who, sizeof who);
                if (!s) {
                    rc = diag_error(im->d, (Loc){0},
                                    "%s: %s (%s) uses '%s', which no node, input or initializer defines",
                                    im->file, who, str(p->op_type), in);
                    break;
                }
                int def = prod[s - im->syms];
                if (def >= 0 && state[def] == 1) {
                    rc = diag_error(im->d, (Loc){0},
                                    "%s: the graph has a cycle: %s (%s) uses '%s', which depends on it",
                                    im->file, who, str(p->op_type), in);
                    break;
                }
                if (def >= 0 && state[def] == 0)
                    next = def;
            }
            if (rc)
                break;
            if (next >= 0) {
                state[next] = 1;
                stack[top++] = next;
            } else {
                state[i] = 2;
                order[placed++] = i;
                top--;
            }
        }
    }
done:
    ir_free(prod);
    ir_free(state);
    ir_free(stack);
    ir_free(next_in);
    return rc;
}

static int import_node(Importer *im, const Onnx__NodeProto *p, int index) {
    im->node = p;
    im->node_index = index;
    im->attr_used = ir_calloc(p->n_attribute + 1, sizeof(bool));
    if (!im->attr_used)
        return im_error(im, "out of memory");
    int rc = onnx_find_op(str(p->op_type))(im);
    for (size_t k = 0; !rc && k < p->n_attribute; k++)
        if (!im->attr_used[k])
            rc = im_error(im, "attribute '%s' is not supported", str(p->attribute[k]->name));
    /* every output asked for must have been defined */
    for (size_t k = 0; !rc && k < p->n_output; k++) {
        Sym *s = *str(p->output[k]) ? im_sym(im, p->output[k]) : NULL;
        if (s && s->value < 0 && !s->c)
            rc = im_error(im, "output %zu ('%s') is not supported", k + 1, s->name);
    }
    ir_free(im->attr_used);
    im->attr_used = NULL;
    im->node = NULL;
    return rc;
}

/* Step 5: outputs, checked against their declared types. */
static int set_outputs(Importer *im, const Onnx__GraphProto *gp) {
    if (!gp->n_output)
        return diag_error(im->d, (Loc){0}, "%s: the graph has no outputs", im->file);
    im->g->outputs = arena_alloc(&im->g->arena, sizeof(int) * gp->n_output);
    if (!im->g->outputs)
        return diag_error(im->d, (Loc){0}, "out of memory");
    for (size_t k = 0; k < gp->n_output; k++) {
        const Onnx__ValueInfoProto *vi = gp->output[k];
        Sym *s = im_sym(im, str(vi->name));
        if (!s)
            return diag_error(im->d, (Loc){0}, "%s: graph output '%s' is not defined", im->file,
                              str(vi->name));
        if (s->value < 0 && s->lazy) {
            s->c = NULL;
            if (declare_input(im, s->lazy, s))
                return -1;
        }
        if (s->value < 0 && materialize(im, s))
            return -1;
        int32_t dtype;
        Type t = {0};
        bool known;
        if (declared_type(im, vi, &dtype, &t, &known))
            return -1;
        const Type *got = &im->g->values[s->value].type;
        if (dtype != 0 && onnx_kiln_dtype(dtype) != (int)got->dtype)
            return diag_error(im->d, (Loc){0}, "%s: graph output '%s' is %s; kiln has it as %s", im->file,
                              s->name, onnx_dtype_name(dtype), dtype_name(got->dtype));
        t.dtype = got->dtype;
        if (known && !type_equal(&t, got)) {
            char a[128], b[128];
            return diag_error(im->d, (Loc){0}, "%s: graph output '%s' is declared %s, but kiln infers %s",
                              im->file, s->name, type_str(&t, a, sizeof a), type_str(got, b, sizeof b));
        }
        for (size_t j = 0; j < k; j++)
            if (im->g->outputs[j] == s->value)
                return diag_error(im->d, (Loc){0}, "%s: graph output '%s' is listed twice", im->file,
                                  s->name);
        im->g->outputs[im->g->n_outputs++] = s->value;
    }
    return 0;
}

/* Declarations first, each group in the order it was made. */
static int hoist_decls(Graph *g) {
    Node **order = ir_malloc(sizeof *order * (size_t)(g->n_nodes + 1));
    if (!order)
        return -1;
    int k = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < g->n_nodes; i++)
            if (op_is_decl(g->nodes[i]->op) == (pass == 0))
                order[k++] = g->nodes[i];
    for (int i = 0; i < g->n_nodes; i++) {
        g->nodes[i] = order[i];
        for (int j = 0; j < order[i]->n_out; j++)
            g->values[order[i]->out[j]].node = i;
    }
    ir_free(order);
    return 0;
}

static const char *stem(Arena *a, const char *path) {
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    size_t n = strlen(base);
    if (n > 5 && strcmp(base + n - 5, ".onnx") == 0)
        n -= 5;
    return arena_strndup(a, base, n);
}

static Graph *import_once(const unsigned char *buf, size_t len, const char *name, const char *dir,
                          const OnnxBind *binds, int n_binds, TensorList *weights, Diag *d) {
    Importer im = {.file = name, .dir = dir, .weights = weights, .d = d, .binds = binds, .n_binds = n_binds};
    int n_weights = weights->n;
    int *order = NULL;
    bool oom = false;
    ProtobufCAllocator pa = onnx_allocator(&oom);
    Onnx__ModelProto *m = onnx__model_proto__unpack(&pa, len, buf);
    int rc = 0;
    if (!m && oom)
        rc = diag_error(d, (Loc){0}, "%s: out of memory reading the model", name);
    else if (!m)
        rc = diag_error(d, (Loc){0}, "%s: not an ONNX model (the protobuf is malformed or truncated)", name);
    else if (!m->graph)
        rc = diag_error(d, (Loc){0}, "%s: the model has no graph", name);
    const Onnx__GraphProto *gp = rc ? NULL : m->graph;
    if (!rc && !(im.g = graph_new()))
        rc = diag_error(d, (Loc){0}, "out of memory");
    if (!rc)
        rc = read_opset(&im, m);
    if (!rc)
        rc = check_supported(&im, m, gp);
    if (!rc && !(order = ir_malloc(sizeof(int) * (gp->n_node + 1))))
        rc = diag_error(d, (Loc){0}, "out of memory");
    if (!rc)
        rc = declare_sources(&im, gp, binds, n_binds);
    if (!rc)
        rc = sort_nodes(&im, gp, order);
    for (size_t i = 0; !rc && i < gp->n_node; i++)
        rc = import_node(&im, gp->node[order[i]], order[i]);
    if (!rc)
        rc = set_outputs(&im, gp);
    if (!rc) {
        const char *gname = *str(gp->name) ? gp->name : NULL;
        im.g->name = arena_strdup(&im.g->arena, gname ? gname : "model");
        if (!gname) /* any other name prints and compiles: names are data */
            im.g->name = stem(&im.g->arena, name);
        if (!im.g->name || hoist_decls(im.g))
            rc = diag_error(d, (Loc){0}, "out of memory");
    }
    if (!rc && verify_graph(im.g, d))
        rc = -1;
    ir_free(order);
    ir_free(im.syms);
    arena_free(&im.arena);
    if (m)
        onnx__model_proto__free_unpacked(m, &pa);
    if (rc) {
        graph_free(im.g);
        while (weights->n > n_weights) { /* leave the list as it was */
            weights->n--;
            ir_free(weights->items[weights->n].name);
            tensor_free(weights->items[weights->n].tensor);
        }
        return NULL;
    }
    return im.g;
}

/* With a binding that keeps a symbolic dim, the model imported at its bound and at
 * the bound - 1, and the two made one graph (onnx_sym.c). */
Graph *onnx_import_buffer(const unsigned char *buf, size_t len, const char *name, const char *dir,
                          const OnnxBind *binds, int n_binds, TensorList *weights, Diag *d) {
    int sym = -1;
    for (int b = 0; b < n_binds; b++)
        if (binds[b].bound && sym >= 0) {
            diag_error(d, (Loc){0}, "%s: two symbolic dims, '%s' and '%s': kiln keeps at most one", name,
                       binds[sym].name, binds[b].name);
            return NULL;
        } else if (binds[b].bound) {
            sym = b;
        }
    int n_weights = weights->n;
    Graph *g = import_once(buf, len, name, dir, binds, n_binds, weights, d);
    if (!g || sym < 0)
        return g;
    OnnxBind *probe_binds = ir_malloc(sizeof *probe_binds * (size_t)n_binds);
    TensorList probe_weights = {0};
    Graph *probe = NULL;
    if (probe_binds) {
        memcpy(probe_binds, binds, sizeof *probe_binds * (size_t)n_binds);
        probe_binds[sym].size--; /* below the bound: a table of the bound's size still holds it */
        probe = import_once(buf, len, name, dir, probe_binds, n_binds, &probe_weights, d);
    } else {
        diag_error(d, (Loc){0}, "out of memory");
    }
    int rc = probe ? onnx_generalize(g, probe, binds[sym].name, binds[sym].size, name, d) : -1;
    graph_free(probe);
    tensors_free(&probe_weights);
    ir_free(probe_binds);
    if (rc) {
        graph_free(g);
        while (weights->n > n_weights) { /* leave the list as it was */
            weights->n--;
            ir_free(weights->items[weights->n].name);
            tensor_free(weights->items[weights->n].tensor);
        }
        return NULL;
    }
    return g;
}

char *path_dir(const char *path) {
    const char *slash = strrchr(path, '/');
    if (!slash)
        return ir_strdup(".");
    size_t n = slash == path ? 1 : (size_t)(slash - path);
    char *dir = ir_malloc(n + 1);
    if (dir) {
        memcpy(dir, path, n);
        dir[n] = 0;
    }
    return dir;
}

Graph *onnx_import(const char *path, const OnnxBind *binds, int n_binds, TensorList *weights, Diag *d) {
    unsigned char *buf;
    size_t len;
    if (read_file_bytes(path, &buf, &len, d))
        return NULL;
    char *dir = path_dir(path);
    Graph *g = dir ? onnx_import_buffer(buf, len, path, dir, binds, n_binds, weights, d) : NULL;
    if (!dir)
        diag_error(d, (Loc){0}, "out of memory");
    ir_free(dir);
    ir_free(buf);
    return g;
}

static bool external(const Onnx__TensorProto *t) {
    return t && t->has_data_location && t->data_location == ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL;
}

static bool graph_external(const Onnx__GraphProto *g) {
    bool found = false;
    for (size_t i = 0; g && !found && i < g->n_initializer; i++)
        found = external(g->initializer[i]);
    for (size_t i = 0; g && !found && i < g->n_node; i++)
        for (size_t k = 0; !found && k < g->node[i]->n_attribute; k++) {
            const Onnx__AttributeProto *a = g->node[i]->attribute[k];
            found = external(a->t) || graph_external(a->g);
            for (size_t j = 0; !found && j < a->n_tensors; j++)
                found = external(a->tensors[j]);
            for (size_t j = 0; !found && j < a->n_graphs; j++)
                found = graph_external(a->graphs[j]);
        }
    return found;
}

bool onnx_uses_external_data(const unsigned char *buf, size_t len) {
    bool oom = false;
    ProtobufCAllocator pa = onnx_allocator(&oom);
    Onnx__ModelProto *m = onnx__model_proto__unpack(&pa, len, buf);
    bool found = m && graph_external(m->graph);
    if (m)
        onnx__model_proto__free_unpacked(m, &pa);
    return found;
}
