/* The op table and everything read off it: attribute schemas, flags, arity,
 * signatures for error messages, attribute access with defaults (and the attribute
 * values of a unary op as its row in unary.def reads them), and the normalization
 * that makes equal graphs print the same.
 *
 * Each attribute schema is an array terminated by an entry with a NULL name; its
 * order is the order the printer writes attributes in. The elementwise ops' schemas,
 * and the op choices of their gradient ops, come from the rows of unary.def and
 * binary.def. */
#include "ops_impl.h"

#include <math.h>
#include <string.h>

/* The schema tables read best as written. */
/* clang-format off */
#define INT(nm, d) {nm, A_INT, DEF_VALUE, d, NULL, NULL, LEN_ANY}
#define INT_REQ(nm) {nm, A_INT, DEF_REQUIRED, 0, NULL, NULL, LEN_ANY}
#define FLOAT(nm, d) {nm, A_FLOAT, DEF_VALUE, d, NULL, NULL, LEN_ANY}
#define BOOL(nm, d) {nm, A_BOOL, DEF_VALUE, d, NULL, NULL, LEN_ANY}
#define ENUM(nm, d, choices) {nm, A_ENUM, DEF_VALUE, 0, d, choices, LEN_ANY}
#define STRING_REQ(nm) {nm, A_STRING, DEF_REQUIRED, 0, NULL, NULL, LEN_ANY}
#define INTS(nm, fill, len) {nm, A_INTS, DEF_VALUE, fill, NULL, NULL, len}
#define INTS_REQ(nm, len) {nm, A_INTS, DEF_REQUIRED, 0, NULL, NULL, len}
#define INTS_OPT(nm, shown, len) {nm, A_INTS, DEF_NONE, 0, shown, NULL, len}
#define FLOATS_OPT(nm, shown, len) {nm, A_FLOATS, DEF_NONE, 0, shown, NULL, len}
#define LAYOUT ENUM("layout", "nchw", "nchw|nhwc")
#define END {NULL, 0, 0, 0, NULL, NULL, 0}

#define UNPAREN(...) __VA_ARGS__

static const AttrSpec NO_ATTRS[] = {END};
/* attrs_RELU, attrs_LEAKY_RELU, ...: the attribute columns of unary.def */
#define UNARY(id, name, attrs, ...) static const AttrSpec attrs_##id[] = {UNPAREN attrs};
#include "unary.def"
#undef UNARY
static const AttrSpec attrs_elementwise[] = {STRING_REQ("expr"), END};
static const AttrSpec attrs_reduce[] = {INTS_OPT("axes", "all", LEN_ANY), BOOL("keepdims", 0), END};
static const AttrSpec attrs_softmax[] = {INT("axis", -1), END};
static const AttrSpec attrs_batch_norm[] = {FLOAT("epsilon", 1e-5), LAYOUT, END};
static const AttrSpec attrs_layer_norm[] = {INT("axis", -1), FLOAT("epsilon", 1e-5), END};
static const AttrSpec attrs_gemm[] = {FLOAT("alpha", 1), FLOAT("beta", 1), BOOL("trans_a", 0),
                                      BOOL("trans_b", 0), END};
static const AttrSpec attrs_conv[] = {INTS("strides", 1, LEN_SPATIAL), INTS("pads", 0, LEN_PADS),
                                      INTS("dilations", 1, LEN_SPATIAL), INT("groups", 1), LAYOUT,
                                      END};
static const AttrSpec attrs_fused_linear[] = {STRING_REQ("expr"), END};
static const AttrSpec attrs_fused_conv[] = {INTS("strides", 1, LEN_SPATIAL), INTS("pads", 0, LEN_PADS),
                                            INTS("dilations", 1, LEN_SPATIAL), INT("groups", 1), LAYOUT,
                                            STRING_REQ("expr"), END};
static const AttrSpec attrs_conv_transpose[] = {
    INTS("strides", 1, LEN_SPATIAL), INTS("pads", 0, LEN_PADS),
    INTS("output_padding", 0, LEN_SPATIAL), INTS("dilations", 1, LEN_SPATIAL), INT("groups", 1),
    LAYOUT, END};
static const AttrSpec attrs_conv_weight_grad[] = {
    INTS_REQ("kernel", LEN_SPATIAL), INTS("strides", 1, LEN_SPATIAL), INTS("pads", 0, LEN_PADS),
    INTS("dilations", 1, LEN_SPATIAL), INT("groups", 1), LAYOUT, END};
static const AttrSpec attrs_max_pool[] = {
    INTS_REQ("kernel", LEN_SPATIAL), INTS("strides", 1, LEN_SPATIAL), INTS("pads", 0, LEN_PADS),
    INTS("dilations", 1, LEN_SPATIAL), BOOL("ceil_mode", 0), LAYOUT, END};
static const AttrSpec attrs_avg_pool[] = {
    INTS_REQ("kernel", LEN_SPATIAL), INTS("strides", 1, LEN_SPATIAL), INTS("pads", 0, LEN_PADS),
    BOOL("ceil_mode", 0), BOOL("count_include_pad", 0), LAYOUT, END};
static const AttrSpec attrs_layout[] = {LAYOUT, END};
static const AttrSpec attrs_adaptive_avg_pool[] = {INTS_REQ("output_size", LEN_SPATIAL), LAYOUT,
                                                   END};
static const AttrSpec attrs_resize[] = {
    INTS_OPT("sizes", "none", LEN_RANK),
    FLOATS_OPT("scales", "none", LEN_RANK),
    ENUM("mode", "nearest", "nearest|linear|cubic"),
    ENUM("coordinate_transformation_mode", "half_pixel",
         "half_pixel|pytorch_half_pixel|align_corners|asymmetric|tf_half_pixel_for_nn|"
         "tf_crop_and_resize"),
    ENUM("nearest_mode", "round_prefer_floor", "round_prefer_floor|round_prefer_ceil|floor|ceil"),
    FLOAT("cubic_coeff_a", -0.75),
    BOOL("exclude_outside", 0),
    FLOATS_OPT("roi", "none", LEN_RANK2),
    FLOAT("extrapolation_value", 0),
    END};
static const AttrSpec attrs_interpolate[] = {
    INTS_OPT("size", "none", LEN_SPATIAL),
    FLOATS_OPT("scale_factor", "none", LEN_SPATIAL),
    ENUM("mode", "nearest", "nearest|nearest-exact|linear|bilinear|bicubic|trilinear|area"),
    BOOL("align_corners", 0),
    BOOL("recompute_scale_factor", 0),
    END};
static const AttrSpec attrs_reshape[] = {INTS_REQ("shape", LEN_ANY), END};
static const AttrSpec attrs_flatten[] = {INT("axis", 1), END};
static const AttrSpec attrs_transpose[] = {INTS_OPT("perm", "reversed", LEN_ANY), END};
static const AttrSpec attrs_concat[] = {INT_REQ("axis"), END};
static const AttrSpec attrs_slice[] = {INTS_REQ("starts", LEN_ANY), INTS_REQ("ends", LEN_ANY),
                                       INTS_OPT("axes", "all", LEN_ANY),
                                       INTS("steps", 1, LEN_ANY), END};
static const AttrSpec attrs_pad[] = {INTS_REQ("pads", LEN_RANK2),
                                     ENUM("mode", "constant", "constant|reflect|edge"),
                                     FLOAT("value", 0), END};
static const AttrSpec attrs_expand[] = {INTS_REQ("shape", LEN_ANY), END};
/* The gradient ops name the op they differentiate: "relu|sigmoid|...", the rows'
 * names, joined as "|relu|sigmoid|..." and read from their second character. */
static const char unary_names[] =
#define UNARY(id, name, ...) "|" name
#include "unary.def"
#undef UNARY
    ;
static const char binary_names[] =
#define BINARY(id, name, ...) "|" name
#include "binary.def"
#undef BINARY
    ;
/* unary_grad's schema: the op, then the union of the rows' attributes that the last
 * line of unary.def lists */
#define UNARY(id, name, ...)
#define UNARY_GRAD_ATTRS(attrs)                                                                   \
    static const AttrSpec attrs_unary_grad[] = {                                                  \
        {"op", A_ENUM, DEF_REQUIRED, 0, NULL, unary_names + 1, LEN_ANY}, UNPAREN attrs};
#include "unary.def"
#undef UNARY
static const AttrSpec attrs_binary_grad[] = {
    {"op", A_ENUM, DEF_REQUIRED, 0, NULL, binary_names + 1, LEN_ANY}, ENUM("wrt", "a", "a|b"), END};
static const AttrSpec attrs_squeeze[] = {INTS_OPT("axes", "size-1 dims", LEN_ANY), END};
static const AttrSpec attrs_unsqueeze[] = {INTS_REQ("axes", LEN_ANY), END};

/* clang-format on */

#define N_ATTRS(a) ((int)(sizeof(a) / sizeof(a[0])) - 1)

const OpInfo op_table[OP_COUNT] = {
#define OP(id, nm, inputs, attrs, infer, eval, lower, flags)                                                 \
    [OP_##id] = {nm, inputs, attrs, N_ATTRS(attrs), infer, eval, flags},
#include "ops.def"
#undef OP
};

bool op_is_decl(OpId op) {
    return op_has(op, F_DECL);
}

bool op_has(OpId op, unsigned flags) {
    return (op_table[op].flags & flags) == flags;
}

int op_lookup(const char *name) {
    for (int i = 0; i < OP_COUNT; i++)
        if (!op_is_decl((OpId)i) && strcmp(op_table[i].name, name) == 0)
            return i;
    return -1;
}

void op_arity(OpId op, int *min, int *max) {
    const char *s = op_table[op].inputs;
    int names = 0, optional = 0;
    bool variadic = strstr(s, "...") != NULL;
    for (const char *p = s; *p;) {
        while (*p == ' ' || *p == ',')
            p++;
        if (!*p)
            break;
        if (*p == '.') {
            p += 3;
            continue;
        }
        names++;
        while (*p && *p != ',')
            if (*p++ == '?')
                optional++;
    }
    *min = names - optional;
    *max = variadic ? -1 : names;
}

bool op_input_optional(OpId op, int i) {
    const char *p = op_table[op].inputs;
    for (int k = 0; k < i && p; k++)
        if ((p = strchr(p, ',')))
            p++;
    return p && memchr(p, '?', strcspn(p, ",")) != NULL;
}

static const char *kind_name(AttrKind k) {
    switch (k) {
    case A_INT: return "int";
    case A_FLOAT: return "float";
    case A_BOOL: return "bool";
    case A_ENUM: return "enum";
    case A_STRING: return "string";
    case A_INTS: return "ints";
    case A_FLOATS: return "floats";
    }
    return "?";
}

const char *attr_kind_name(AttrKind k) {
    return kind_name(k);
}

void op_signature(OpId op, char *buf, size_t n) {
    const OpInfo *o = &op_table[op];
    size_t len = (size_t)snprintf(buf, n, "%s(%s", o->name, o->inputs);
    for (int i = 0; i < o->n_attrs && len < n; i++) {
        const AttrSpec *a = &o->attrs[i];
        char dflt[64];
        if (a->def == DEF_REQUIRED)
            snprintf(dflt, sizeof dflt, "required");
        else if (a->kind == A_ENUM || a->def == DEF_NONE)
            snprintf(dflt, sizeof dflt, "%s", a->dflt_word);
        else if (a->kind == A_BOOL)
            snprintf(dflt, sizeof dflt, "%s", a->dflt != 0 ? "true" : "false");
        else
            format_double(a->dflt, dflt, sizeof dflt);
        const char *kind = a->kind == A_ENUM ? a->choices : kind_name(a->kind);
        bool list = a->kind == A_INTS || a->kind == A_FLOATS;
        const char *each = list && a->def == DEF_VALUE ? " each" : "";
        len += (size_t)snprintf(buf + len, n - len, ", %s: %s = %s%s", a->name, kind, dflt, each);
    }
    if (len < n)
        snprintf(buf + len, n - len, ")");
}

/* ---- Attribute access ---- */

int op_attr_index(OpId op, const char *name) {
    const OpInfo *o = &op_table[op];
    for (int i = 0; i < o->n_attrs; i++)
        if (strcmp(o->attrs[i].name, name) == 0)
            return i;
    return -1;
}

static const AttrSpec *spec_of(const Node *n, const char *name, int *idx) {
    *idx = op_attr_index(n->op, name);
    KILN_ASSERT(*idx >= 0);
    return &op_table[n->op].attrs[*idx];
}

const Attr *node_attr(const Node *n, const char *name) {
    int i;
    spec_of(n, name, &i);
    return &n->attrs[i];
}

bool node_has(const Node *n, const char *name) {
    return node_attr(n, name)->set;
}

int64_t node_int(const Node *n, const char *name) {
    int i;
    const AttrSpec *s = spec_of(n, name, &i);
    KILN_ASSERT(s->kind == A_INT || s->kind == A_BOOL);
    return n->attrs[i].set ? n->attrs[i].i : (int64_t)s->dflt;
}

double node_float(const Node *n, const char *name) {
    int i;
    const AttrSpec *s = spec_of(n, name, &i);
    KILN_ASSERT(s->kind == A_FLOAT);
    return n->attrs[i].set ? n->attrs[i].f : s->dflt;
}

bool node_bool(const Node *n, const char *name) {
    return node_int(n, name) != 0;
}

const char *node_enum(const Node *n, const char *name) {
    int i;
    const AttrSpec *s = spec_of(n, name, &i);
    KILN_ASSERT(s->kind == A_ENUM);
    return n->attrs[i].set ? n->attrs[i].s : s->dflt_word;
}

int node_ints(const Node *n, const char *name, int64_t *out, int cap, int count) {
    int i;
    const AttrSpec *s = spec_of(n, name, &i);
    KILN_ASSERT(s->kind == A_INTS);
    const Attr *a = &n->attrs[i];
    int m = a->set ? a->n : count;
    KILN_ASSERT(m <= cap);
    for (int k = 0; k < m; k++)
        out[k] = a->set ? a->ints[k] : (int64_t)s->dflt;
    return m;
}

int node_floats(const Node *n, const char *name, double *out, int cap, int count) {
    int i;
    const AttrSpec *s = spec_of(n, name, &i);
    KILN_ASSERT(s->kind == A_FLOATS);
    const Attr *a = &n->attrs[i];
    int m = a->set ? a->n : count;
    KILN_ASSERT(m <= cap);
    for (int k = 0; k < m; k++)
        out[k] = a->set ? a->floats[k] : s->dflt;
    return m;
}

int unary_params(OpId op, const Node *n, double *p) {
    const OpInfo *o = &op_table[op];
    KILN_ASSERT(op_has(op, F_UNARY) && o->n_attrs <= UNARY_MAX_PARAMS);
    for (int k = 0; k < o->n_attrs; k++) {
        const AttrSpec *s = &o->attrs[k];
        if (s->kind == A_FLOAT) {
            p[k] = node_float(n, s->name);
            continue;
        }
        KILN_ASSERT(s->kind == A_ENUM);
        const char *word = node_enum(n, s->name), *c = s->choices;
        size_t len = strlen(word);
        p[k] = 0;
        while (strncmp(c, word, len) != 0 || (c[len] != '|' && c[len] != 0)) {
            c = strchr(c, '|');
            KILN_ASSERT(c != NULL);
            c++;
            p[k]++;
        }
    }
    return o->n_attrs;
}

/* ---- Normalization ---- */

static int expected_len(AttrLen len, int rank) {
    switch (len) {
    case LEN_ANY: return -1;
    case LEN_SPATIAL: return rank - 2;
    case LEN_PADS: return 2 * (rank - 2);
    case LEN_RANK2: return 2 * rank;
    case LEN_RANK: return rank;
    }
    return -1;
}

static const char *len_words(AttrLen len) {
    switch (len) {
    case LEN_SPATIAL: return "one per spatial dimension";
    case LEN_PADS: return "a begin and an end per spatial dimension";
    case LEN_RANK2: return "a begin and an end per dimension";
    case LEN_RANK: return "one per dimension";
    default: return "";
    }
}

static bool equals_default(const AttrSpec *s, const Attr *a) {
    if (s->def != DEF_VALUE)
        return false;
    switch (s->kind) {
    case A_INT:
    case A_BOOL: return (double)a->i == s->dflt;
    case A_FLOAT: return a->f == s->dflt;
    case A_ENUM:
    case A_STRING: return strcmp(a->s, s->dflt_word) == 0;
    case A_INTS:
        for (int k = 0; k < a->n; k++)
            if ((double)a->ints[k] != s->dflt)
                return false;
        return true;
    case A_FLOATS:
        for (int k = 0; k < a->n; k++)
            if (a->floats[k] != s->dflt)
                return false;
        return true;
    }
    return false;
}

int attrs_normalize(Graph *g, Node *n, Diag *d) {
    const OpInfo *o = &op_table[n->op];
    int rank = n->n_in > 0 && n->in[0] >= 0 ? g->values[n->in[0]].type.rank : 0;
    for (int i = 0; i < o->n_attrs; i++) {
        const AttrSpec *s = &o->attrs[i];
        Attr *a = &n->attrs[i];
        if (!a->set) {
            if (s->def == DEF_REQUIRED)
                return diag_error(d, n->loc, "%s needs the attribute '%s'", o->name, s->name);
            continue;
        }
        int want = expected_len(s->len, rank);
        if ((s->kind == A_INTS || s->kind == A_FLOATS) && want >= 0) {
            if (want <= 0)
                return diag_error(
                    d, a->loc, "%s's '%s' needs an input with %s, got rank %d", o->name, s->name,
                    s->len == LEN_SPATIAL || s->len == LEN_PADS ? "spatial dimensions" : "dimensions", rank);
            if (a->n == 1 && want > 1) {
                if (s->kind == A_INTS) {
                    int64_t *v = arena_alloc(&g->arena, sizeof *v * (size_t)want);
                    if (!v)
                        return diag_error(d, a->loc, "out of memory");
                    for (int k = 0; k < want; k++)
                        v[k] = a->ints[0];
                    a->ints = v;
                } else {
                    double *v = arena_alloc(&g->arena, sizeof *v * (size_t)want);
                    if (!v)
                        return diag_error(d, a->loc, "out of memory");
                    for (int k = 0; k < want; k++)
                        v[k] = a->floats[0];
                    a->floats = v;
                }
                a->n = want;
            }
            if (a->n != want)
                return diag_error(d, a->loc, "%s's '%s' needs %d values (%s), got %d", o->name, s->name, want,
                                  len_words(s->len), a->n);
        }
        if (equals_default(s, a))
            a->set = false;
    }
    return 0;
}
