/* What the battery tests (test_reference.c, test_target_c.c) share: finding the
 * batteries in a directory, reading their tensors, comparing an output with a
 * reference tensor within the project's tolerance, and the cmocka main that runs
 * one test per battery.
 *
 * A battery NAME is NAME.kiln, a model whose every input is a param, its param
 * values NAME.safetensors, and the outputs PyTorch (or numpy following the ONNX
 * specification) computes for them, NAME.expected.safetensors; tests/ref holds them,
 * written by tests/ref/gen_reference.py. A test brings only its check of one
 * battery. */
#ifndef KILN_TEST_BATTERY_H
#define KILN_TEST_BATTERY_H

#include "frontend/frontend.h"

typedef struct {
    const char *dir;
    char *name; /* the battery: NAME of NAME.kiln */
} Battery;

/* What a check starts from: the model parsed, its params and expected outputs. */
typedef struct {
    SrcFile *src;
    Graph *g;
    TensorList weights, expected;
} BatteryModel;

/* Reads and parses NAME.kiln, reads NAME.safetensors and NAME.expected.safetensors
 * into m (zeroed by the caller), and expands grad (the autodiff pass, which every
 * target needs); false after a diagnostic. battery_unload frees what
 * was read either way. */
bool battery_load(const Battery *b, BatteryModel *m, Diag *d);
void battery_unload(BatteryModel *m);
/* Compares each output got[k] of the model with the expected tensor of its name and,
 * when ref is not NULL, with ref[k] (the interpreter's), within |a-b| <= 1e-4 +
 * 1e-4*|b| (NaN matches NaN, an infinity the same infinity); prints the first few
 * mismatches of each in full and their count, and returns the count. */
long battery_compare_outputs(const Battery *b, const BatteryModel *m, Tensor *const *got, Tensor *const *ref);

typedef struct {
    const char *group; /* cmocka's group name; the program is test_GROUP */
    const char *doing; /* for the failure "battery NAME did not DOING": "run" */
    /* Runs and compares one battery; returns the number of mismatches, or -1 when
     * the battery could not run at all. It must free everything before returning,
     * so that a failing assertion leaks nothing. */
    long (*check)(const Battery *b);
} BatterySuite;

/* The main of a battery test: one cmocka test per NAME.kiln in argv[1] (by default
 * KILN_REF_DIR, else the source tree's tests/ref), in the order of their names, each
 * failing with its mismatches' count. */
int battery_main(int argc, char **argv, const BatterySuite *suite);

#endif
