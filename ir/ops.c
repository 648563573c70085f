/* The op table and everything read off it: attribute schemas, flags, arity,
 * signatures for error messages, attribute access with defaults (and the attribute
 * values of a unary op as its row in unary.def reads them), and the normalization
 * that makes equal graphs print the same.
 *
 * Each attribute schema is an array terminated by an entry with the id ATTR_COUNT;
 * its order is the order the printer writes attributes in. Schemas name attributes
 * by the ids of ir/attrs.def, which also spells their names and enum choices. The
 * elementwise ops' schemas come from the rows of unary.def and binary.def, as do the
 * op choices of their gradient ops (attrs.def). */
#include "ops_impl.h"

#include <math.h>
#include <string.h>

/* The schema tables read best as written. */
/* clang-format off */
#define INT(id, d) {ATTR_##id, A_INT, DEF_VALUE, d, NULL, 0, LEN_ANY}
#define INT_REQ(id) {ATTR_##id, A_INT, DEF_REQUIRED, 0, NULL, 0, LEN_ANY}
#define FLOAT(id, d) {ATTR_##id, A_FLOAT, DEF_VALUE, d, NULL, 0, LEN_ANY}
#define BOOL(id, d) {ATTR_##id, A_BOOL, DEF_VALUE, d, NULL, 0, LEN_ANY}
#define ENUM(id, set, d) {ATTR_##id, A_ENUM, DEF_VALUE, set##_##d, NULL, ENUM_##set, LEN_ANY}
#define ENUM_REQ(id, set) {ATTR_##id, A_ENUM, DEF_REQUIRED, 0, NULL, ENUM_##set, LEN_ANY}
#define STRING_REQ(id) {ATTR_##id, A_STRING, DEF_REQUIRED, 0, NULL, 0, LEN_ANY}
#define INTS(id, fill, len) {ATTR_##id, A_INTS, DEF_VALUE, fill, NULL, 0, len}
#define INTS_REQ(id, len) {ATTR_##id, A_INTS, DEF_REQUIRED, 0, NULL, 0, len}
#define INTS_OPT(id, shown, len) {ATTR_##id, A_INTS, DEF_NONE, 0, shown, 0, len}
#define FLOAT_OPT(id, shown) {ATTR_##id, A_FLOAT, DEF_NONE, 0, shown, 0, LEN_ANY}
#define FLOATS_OPT(id, shown, len) {ATTR_##id, A_FLOATS, DEF_NONE, 0, shown, 0, len}
#define IMAGE_LAYOUT ENUM(LAYOUT, LAYOUT, NCHW)
#define END {ATTR_COUNT, 0, 0, 0, NULL, 0, 0}

#define UNPAREN(...) __VA_ARGS__

static const AttrSpec NO_ATTRS[] = {END};
/* attrs_RELU, attrs_LEAKY_RELU, ...: the attribute columns of unary.def */
#define UNARY(id, name, attrs, ...) static const AttrSpec attrs_##id[] = {UNPAREN attrs};
#include "unary.def"
#undef UNARY
static const AttrSpec attrs_elementwise[] = {STRING_REQ(EXPR), END};
static const AttrSpec attrs_cast[] = {ENUM_REQ(TO, DTYPE), END};
static const AttrSpec attrs_gather[] = {INT(AXIS, 0), END};
static const AttrSpec attrs_argmax[] = {INT(AXIS, 0), BOOL(KEEPDIMS, 0), BOOL(SELECT_LAST, 0), END};
static const AttrSpec attrs_cumsum[] = {INT(AXIS, 0), BOOL(EXCLUSIVE, 0), BOOL(REVERSE, 0), END};
static const AttrSpec attrs_reduce[] = {INTS_OPT(AXES, "all", LEN_ANY), BOOL(KEEPDIMS, 0), END};
static const AttrSpec attrs_softmax[] = {INT(AXIS, -1), END};
static const AttrSpec attrs_batch_norm[] = {FLOAT(EPSILON, 1e-5), IMAGE_LAYOUT, END};
static const AttrSpec attrs_layer_norm[] = {INT(AXIS, -1), FLOAT(EPSILON, 1e-5), END};
static const AttrSpec attrs_gemm[] = {FLOAT(ALPHA, 1), FLOAT(BETA, 1), BOOL(TRANS_A, 0),
                                      BOOL(TRANS_B, 0), END};
static const AttrSpec attrs_conv[] = {INTS(STRIDES, 1, LEN_SPATIAL), INTS(PADS, 0, LEN_PADS),
                                      INTS(DILATIONS, 1, LEN_SPATIAL), INT(GROUPS, 1), IMAGE_LAYOUT,
                                      END};
static const AttrSpec attrs_attention[] = {FLOAT_OPT(SCALE, "1/sqrt(E)"), BOOL(IS_CAUSAL, 0), END};
static const AttrSpec attrs_fused_linear[] = {STRING_REQ(EXPR), END};
static const AttrSpec attrs_fused_conv[] = {INTS(STRIDES, 1, LEN_SPATIAL), INTS(PADS, 0, LEN_PADS),
                                            INTS(DILATIONS, 1, LEN_SPATIAL), INT(GROUPS, 1), IMAGE_LAYOUT,
                                            STRING_REQ(EXPR), END};
static const AttrSpec attrs_conv_transpose[] = {
    INTS(STRIDES, 1, LEN_SPATIAL), INTS(PADS, 0, LEN_PADS),
    INTS(OUTPUT_PADDING, 0, LEN_SPATIAL), INTS(DILATIONS, 1, LEN_SPATIAL), INT(GROUPS, 1),
    IMAGE_LAYOUT, END};
static const AttrSpec attrs_conv_weight_grad[] = {
    INTS_REQ(KERNEL, LEN_SPATIAL), INTS(STRIDES, 1, LEN_SPATIAL), INTS(PADS, 0, LEN_PADS),
    INTS(DILATIONS, 1, LEN_SPATIAL), INT(GROUPS, 1), IMAGE_LAYOUT, END};
static const AttrSpec attrs_max_pool[] = {
    INTS_REQ(KERNEL, LEN_SPATIAL), INTS(STRIDES, 1, LEN_SPATIAL), INTS(PADS, 0, LEN_PADS),
    INTS(DILATIONS, 1, LEN_SPATIAL), BOOL(CEIL_MODE, 0), IMAGE_LAYOUT, END};
static const AttrSpec attrs_avg_pool[] = {
    INTS_REQ(KERNEL, LEN_SPATIAL), INTS(STRIDES, 1, LEN_SPATIAL), INTS(PADS, 0, LEN_PADS),
    BOOL(CEIL_MODE, 0), BOOL(COUNT_INCLUDE_PAD, 0), IMAGE_LAYOUT, END};
static const AttrSpec attrs_layout[] = {IMAGE_LAYOUT, END};
static const AttrSpec attrs_adaptive_avg_pool[] = {INTS_REQ(OUTPUT_SIZE, LEN_SPATIAL), IMAGE_LAYOUT,
                                                   END};
static const AttrSpec attrs_resize[] = {
    INTS_OPT(SIZES, "none", LEN_RANK),
    FLOATS_OPT(SCALES, "none", LEN_RANK),
    ENUM(MODE, RESIZE_MODE, NEAREST),
    ENUM(COORDINATE_TRANSFORMATION_MODE, COORD, HALF_PIXEL),
    ENUM(NEAREST_MODE, NEAREST_MODE, ROUND_PREFER_FLOOR),
    FLOAT(CUBIC_COEFF_A, -0.75),
    BOOL(EXCLUDE_OUTSIDE, 0),
    FLOATS_OPT(ROI, "none", LEN_RANK2),
    FLOAT(EXTRAPOLATION_VALUE, 0),
    END};
static const AttrSpec attrs_interpolate[] = {
    INTS_OPT(SIZE, "none", LEN_SPATIAL),
    FLOATS_OPT(SCALE_FACTOR, "none", LEN_SPATIAL),
    ENUM(MODE, INTERPOLATE_MODE, NEAREST),
    BOOL(ALIGN_CORNERS, 0),
    BOOL(RECOMPUTE_SCALE_FACTOR, 0),
    END};
static const AttrSpec attrs_reshape[] = {INTS_REQ(SHAPE, LEN_ANY), END};
static const AttrSpec attrs_flatten[] = {INT(AXIS, 1), END};
static const AttrSpec attrs_transpose[] = {INTS_OPT(PERM, "reversed", LEN_ANY), END};
static const AttrSpec attrs_concat[] = {INT_REQ(AXIS), END};
static const AttrSpec attrs_slice[] = {INTS_REQ(STARTS, LEN_ANY), INTS_REQ(ENDS, LEN_ANY),
                                       INTS_OPT(AXES, "all", LEN_ANY),
                                       INTS(STEPS, 1, LEN_ANY), END};
static const AttrSpec attrs_pad[] = {INTS_REQ(PADS, LEN_RANK2),
                                     ENUM(MODE, PAD_MODE, CONSTANT),
                                     FLOAT(VALUE, 0), END};
static const AttrSpec attrs_expand[] = {INTS_REQ(SHAPE, LEN_ANY), END};
static const AttrSpec attrs_uniform[] = {INTS_REQ(SHAPE, LEN_ANY), END};
static const AttrSpec attrs_dropout[] = {FLOAT(P, 0.5), END};
static const AttrSpec attrs_allreduce[] = {ENUM(OP, ALLREDUCE_OP, SUM), END};
/* unary_grad's schema: the op, then the union of the rows' attributes that the last
 * line of unary.def lists */
#define UNARY(id, name, ...)
#define UNARY_GRAD_ATTRS(attrs) static const AttrSpec attrs_unary_grad[] = {ENUM_REQ(OP, UNARY_GRAD_OP), UNPAREN attrs};
#include "unary.def"
#undef UNARY
static const AttrSpec attrs_binary_grad[] = {
    ENUM_REQ(OP, BINARY_GRAD_OP), ENUM(WRT, WRT, A), END};
static const AttrSpec attrs_squeeze[] = {INTS_OPT(AXES, "size-1 dims", LEN_ANY), END};
static const AttrSpec attrs_unsqueeze[] = {INTS_REQ(AXES, LEN_ANY), END};

/* clang-format on */

static const char *const attr_names[ATTR_COUNT] = {
#define ATTR(id, name) [ATTR_##id] = name,
#include "attrs.def"
#undef ATTR
};

/* Each set's words, and all of them joined by '|' (the leading '|' skipped). */
#define ENUM_BEGIN(set) static const char *const set##_words[] = {
#define CHOICE(set, id, word) [set##_##id] = word,
#define ENUM_END(set)                                                                                        \
    }                                                                                                        \
    ;
#include "attrs.def"
#undef ENUM_BEGIN
#undef CHOICE
#undef ENUM_END

const EnumChoices enum_choices[ENUM_COUNT] = {
#define ENUM_BEGIN(set) [ENUM_##set] = {set##_words, set##_COUNT, &(""
#define CHOICE(set, id, word) "|" word
#define ENUM_END(set) )[1]                                                                                   \
    }                                                                                                        \
    ,
#include "attrs.def"
#undef ENUM_BEGIN
#undef CHOICE
#undef ENUM_END
};

const char *attr_name(AttrId id) {
    KILN_ASSERT(id >= 0 && id < ATTR_COUNT);
    return attr_names[id];
}

int attr_lookup(const char *name) {
    for (int i = 0; i < ATTR_COUNT; i++)
        if (strcmp(attr_names[i], name) == 0)
            return i;
    return -1;
}

int enum_lookup(EnumSet set, const char *word, size_t len) {
    const EnumChoices *c = &enum_choices[set];
    for (int i = 0; i < c->n; i++)
        if (strlen(c->words[i]) == len && memcmp(c->words[i], word, len) == 0)
            return i;
    return -1;
}

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
        else if (a->kind == A_ENUM)
            snprintf(dflt, sizeof dflt, "%s", enum_choices[a->set].words[(int)a->dflt]);
        else if (a->def == DEF_NONE)
            snprintf(dflt, sizeof dflt, "%s", a->shown);
        else if (a->kind == A_BOOL)
            snprintf(dflt, sizeof dflt, "%s", a->dflt != 0 ? "true" : "false");
        else
            format_double(a->dflt, dflt, sizeof dflt);
        const char *kind = a->kind == A_ENUM ? enum_choices[a->set].text : kind_name(a->kind);
        bool list = a->kind == A_INTS || a->kind == A_FLOATS;
        const char *each = list && a->def == DEF_VALUE ? " each" : "";
        len += (size_t)snprintf(buf + len, n - len, ", %s: %s = %s%s", attr_name(a->id), kind, dflt, each);
    }
    if (len < n)
        snprintf(buf + len, n - len, ")");
}

bool op_takes_ints(OpId op) {
    switch (op) {
    case OP_ADD:
    case OP_SUB:
    case OP_MUL:
    case OP_DIV:
    case OP_MAX:
    case OP_MIN:
    case OP_NEG:
    case OP_ABS: return true;
    default: return false;
    }
}

/* ---- Attribute access ---- */

int op_attr_index(OpId op, AttrId id) {
    const OpInfo *o = &op_table[op];
    for (int i = 0; i < o->n_attrs; i++)
        if (o->attrs[i].id == id)
            return i;
    return -1;
}

int op_attr_index_named(OpId op, const char *name) {
    int id = attr_lookup(name);
    return id < 0 ? -1 : op_attr_index(op, (AttrId)id);
}

static const AttrSpec *spec_of(const Node *n, AttrId id, int *idx) {
    *idx = op_attr_index(n->op, id);
    KILN_ASSERT(*idx >= 0);
    return &op_table[n->op].attrs[*idx];
}

const Attr *node_attr(const Node *n, AttrId id) {
    int i;
    spec_of(n, id, &i);
    return &n->attrs[i];
}

bool node_has(const Node *n, AttrId id) {
    return node_attr(n, id)->set;
}

int64_t node_int(const Node *n, AttrId id) {
    int i;
    const AttrSpec *s = spec_of(n, id, &i);
    KILN_ASSERT(s->kind == A_INT || s->kind == A_BOOL);
    return n->attrs[i].set ? n->attrs[i].i : (int64_t)s->dflt;
}

double node_float(const Node *n, AttrId id) {
    int i;
    const AttrSpec *s = spec_of(n, id, &i);
    KILN_ASSERT(s->kind == A_FLOAT);
    return n->attrs[i].set ? n->attrs[i].f : s->dflt;
}

bool node_bool(const Node *n, AttrId id) {
    return node_int(n, id) != 0;
}

int node_enum(const Node *n, AttrId id) {
    int i;
    const AttrSpec *s = spec_of(n, id, &i);
    KILN_ASSERT(s->kind == A_ENUM);
    return n->attrs[i].set ? (int)n->attrs[i].i : (int)s->dflt;
}

const char *node_enum_word(const Node *n, AttrId id) {
    int i;
    const AttrSpec *s = spec_of(n, id, &i);
    return enum_choices[s->set].words[node_enum(n, id)];
}

int node_ints(const Node *n, AttrId id, int64_t *out, int cap, int count) {
    int i;
    const AttrSpec *s = spec_of(n, id, &i);
    KILN_ASSERT(s->kind == A_INTS);
    const Attr *a = &n->attrs[i];
    int m = a->set ? a->n : count;
    KILN_ASSERT(m <= cap);
    for (int k = 0; k < m; k++)
        out[k] = a->set ? a->ints[k] : (int64_t)s->dflt;
    return m;
}

int node_floats(const Node *n, AttrId id, double *out, int cap, int count) {
    int i;
    const AttrSpec *s = spec_of(n, id, &i);
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
    for (int k = 0; k < o->n_attrs && k < UNARY_MAX_PARAMS; k++) {
        const AttrSpec *s = &o->attrs[k];
        KILN_ASSERT(s->kind == A_FLOAT || s->kind == A_ENUM);
        p[k] = s->kind == A_FLOAT ? node_float(n, s->id) : (double)node_enum(n, s->id);
    }
    return o->n_attrs;
}

/* The unary (binary) ops in the order of their rows, which is the order of the
 * gradient ops' `op` choices (attrs.def). */
static const OpId unary_rows[] = {
#define UNARY(id, ...) OP_##id,
#include "unary.def"
#undef UNARY
};
static const OpId binary_rows[] = {
#define BINARY(id, ...) OP_##id,
#include "binary.def"
#undef BINARY
};

OpId differentiated_op(const Node *n) {
    int choice = node_enum(n, ATTR_OP);
    if (n->op == OP_UNARY_GRAD)
        return unary_rows[choice];
    KILN_ASSERT(n->op == OP_BINARY_GRAD);
    return binary_rows[choice];
}

int grad_op_choice(OpId op) {
    const OpId *rows = op_has(op, F_UNARY) ? unary_rows : binary_rows;
    int n = op_has(op, F_UNARY) ? (int)(sizeof unary_rows / sizeof *unary_rows)
                                : (int)(sizeof binary_rows / sizeof *binary_rows);
    for (int k = 0; k < n; k++)
        if (rows[k] == op)
            return k;
    KILN_ASSERT(!"not an elementwise op");
    return 0;
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
    case A_BOOL:
    case A_ENUM: return (double)a->i == s->dflt;
    case A_FLOAT: return a->f == s->dflt;
    case A_STRING: return false;
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
                return diag_error(d, n->loc, "%s needs the attribute '%s'", o->name, attr_name(s->id));
            continue;
        }
        int want = expected_len(s->len, rank);
        if ((s->kind == A_INTS || s->kind == A_FLOATS) && want >= 0) {
            if (want <= 0)
                return diag_error(
                    d, a->loc, "%s's '%s' needs an input with %s, got rank %d", o->name, attr_name(s->id),
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
                return diag_error(d, a->loc, "%s's '%s' needs %d values (%s), got %d", o->name,
                                  attr_name(s->id), want, len_words(s->len), a->n);
        }
        if (equals_default(s, a))
            a->set = false;
    }
    return 0;
}
