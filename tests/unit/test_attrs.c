/* Unit tests for the attribute ids and enum choices generated from ir/attrs.def.
 *
 * The schemas in ir/ops.c name attributes by id, and the parser, printer and
 * importers translate between ids and names through the tables ir/attrs.def
 * generates. These tests walk the op table and check that the two agree: every
 * schema entry's id resolves to a name and back to the same slot, no op lists an
 * attribute twice, every declared id is used by some op, every enum default is one
 * of its choices, and each choice's word finds its own index. A parsed model shows
 * the round trip end to end: the word in the text becomes the generated constant,
 * and the printer writes the word again. */
/* cmocka needs these first, in this order */
/* clang-format off */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
/* clang-format on */

#include "frontend/frontend.h"
#include "ir/ir.h"

#include <stdlib.h>
#include <string.h>

static void test_names_and_ids_agree(void **state) {
    (void)state;
    for (int id = 0; id < ATTR_COUNT; id++) {
        const char *name = attr_name((AttrId)id);
        assert_non_null(name);
        assert_int_equal(attr_lookup(name), id);
        for (int other = 0; other < id; other++)
            assert_string_not_equal(attr_name((AttrId)other), name);
    }
    assert_int_equal(attr_lookup("no_such_attribute"), -1);
}

static void test_schema_ids_resolve(void **state) {
    (void)state;
    bool used[ATTR_COUNT] = {false};
    for (int op = 0; op < OP_COUNT; op++) {
        const OpInfo *o = &op_table[op];
        assert_int_equal(o->attrs[o->n_attrs].id, ATTR_COUNT); /* the terminator */
        for (int i = 0; i < o->n_attrs; i++) {
            AttrId id = o->attrs[i].id;
            assert_true(id >= 0 && id < ATTR_COUNT);
            /* the first entry with the id is this one: no op lists an id twice */
            assert_int_equal(op_attr_index((OpId)op, id), i);
            assert_int_equal(op_attr_index_named((OpId)op, attr_name(id)), i);
            used[id] = true;
        }
    }
    for (int id = 0; id < ATTR_COUNT; id++)
        if (!used[id])
            fail_msg("attribute '%s' is declared in ir/attrs.def but no op has it", attr_name((AttrId)id));
    assert_int_equal(op_attr_index(OP_RELU, ATTR_AXIS), -1);
    assert_int_equal(op_attr_index_named(OP_CONV, "stride"), -1);
}

static void test_enum_defaults_are_choices(void **state) {
    (void)state;
    for (int op = 0; op < OP_COUNT; op++) {
        const OpInfo *o = &op_table[op];
        for (int i = 0; i < o->n_attrs; i++) {
            const AttrSpec *s = &o->attrs[i];
            if (s->kind != A_ENUM)
                continue;
            assert_true(s->set >= 0 && s->set < ENUM_COUNT);
            if (s->def == DEF_VALUE) {
                int dflt = (int)s->dflt;
                assert_true(dflt == s->dflt && dflt >= 0 && dflt < enum_choices[s->set].n);
            } else {
                assert_int_equal(s->def, DEF_REQUIRED);
            }
        }
    }
}

static void test_choices_round_trip(void **state) {
    (void)state;
    for (int set = 0; set < ENUM_COUNT; set++) {
        const EnumChoices *c = &enum_choices[set];
        assert_true(c->n > 0);
        char joined[512] = "";
        for (int i = 0; i < c->n; i++) {
            assert_non_null(c->words[i]);
            assert_int_equal(enum_lookup((EnumSet)set, c->words[i], strlen(c->words[i])), i);
            if (i)
                strcat(joined, "|");
            strcat(joined, c->words[i]);
        }
        assert_string_equal(c->text, joined);
        assert_int_equal(enum_lookup((EnumSet)set, "no-such-choice", strlen("no-such-choice")), -1);
    }
    /* a prefix of a word is not the word */
    assert_int_equal(enum_lookup(ENUM_LAYOUT, "nchw", 3), -1);
    assert_int_equal(enum_lookup(ENUM_INTERPOLATE_MODE, "nearest-exact", 13), INTERPOLATE_MODE_NEAREST_EXACT);
}

static void test_parsed_enums(void **state) {
    (void)state;
    const char *text = "model m\n"
                       "input x : f32[1, 2, 4, 4]\n"
                       "y = pad(x, pads=[0, 0, 1, 1, 0, 0, 1, 1], mode=edge)\n"
                       "z = gelu(y, approximate=tanh)\n"
                       "w = max_pool(z, kernel=2)\n"
                       "output w\n";
    SrcFile *src = srcfile_from_string("t.kiln", text);
    Diag d;
    diag_init(&d, stderr);
    Graph *g = parse_model(src, &d);
    assert_non_null(g);
    const Node *pad = g->nodes[g->values[graph_find(g, "y")].node];
    const Node *gelu = g->nodes[g->values[graph_find(g, "z")].node];
    const Node *pool = g->nodes[g->values[graph_find(g, "w")].node];
    assert_int_equal(node_enum(pad, ATTR_MODE), PAD_MODE_EDGE);
    assert_string_equal(node_enum_word(pad, ATTR_MODE), "edge");
    assert_int_equal(node_enum(gelu, ATTR_APPROXIMATE), GELU_TANH);
    assert_int_equal(node_enum(pool, ATTR_LAYOUT), LAYOUT_NCHW); /* the default, unset */
    assert_false(node_has(pool, ATTR_LAYOUT));

    char *printed = NULL;
    size_t len;
    FILE *f = open_memstream(&printed, &len);
    print_graph(g, f);
    fclose(f);
    assert_non_null(strstr(printed, "mode=edge)"));
    assert_non_null(strstr(printed, "approximate=tanh)"));
    assert_null(strstr(printed, "layout="));
    free(printed);
    graph_free(g);
    srcfile_free(src);
}

static void test_bad_enum_word(void **state) {
    (void)state;
    const char *text = "model m\ninput x : f32[2]\ny = gelu(x, approximate=fast)\noutput y\n";
    SrcFile *src = srcfile_from_string("t.kiln", text);
    char *msg = NULL;
    size_t len;
    FILE *f = open_memstream(&msg, &len);
    Diag d;
    diag_init(&d, f);
    Graph *g = parse_model(src, &d);
    fclose(f);
    assert_null(g);
    assert_non_null(strstr(msg, "gelu's 'approximate' must be one of none|tanh, got 'fast'"));
    free(msg);
    srcfile_free(src);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names_and_ids_agree),
        cmocka_unit_test(test_schema_ids_resolve),
        cmocka_unit_test(test_enum_defaults_are_choices),
        cmocka_unit_test(test_choices_round_trip),
        cmocka_unit_test(test_parsed_enums),
        cmocka_unit_test(test_bad_enum_word),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
