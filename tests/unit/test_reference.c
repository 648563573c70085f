/* The interpreter against independent reference values, one test per battery.
 *
 * tests/ref/gen_reference.py writes, for each battery NAME, a model NAME.kiln whose
 * every input is a param, the param values NAME.safetensors, and the outputs that
 * PyTorch (or numpy following the ONNX specification) computes for them,
 * NAME.expected.safetensors. This test parses each model, runs it in the reference
 * interpreter with those weights, and compares every output with its expected tensor
 * by name within the project's tolerance |a-b| <= 1e-4 + 1e-4*|b| (NaN matches NaN,
 * an infinity the same infinity). A failing battery lists its mismatches (the first
 * few of each output in full) and their count. battery.c holds what this test shares
 * with test_target_c.c: loading a battery, the comparison, the search for batteries
 * and the main.
 *
 * Usage: test_reference [DIR]; DIR defaults to KILN_REF_DIR (else the source tree's
 * tests/ref). */
#include <stdio.h>
#include <stdlib.h>

#include "battery.h"

/* Parses, runs and compares one battery; returns the number of mismatches, or -1
 * when the battery could not run at all. Frees everything before returning, so that
 * a failing assertion leaks nothing. */
static long check_battery(const Battery *b) {
    Diag d;
    diag_init(&d, stdout);
    BatteryModel m = {0};
    Tensor **outs = NULL;
    long bad = -1;
    if (battery_load(b, &m, &d)) {
        outs = calloc((size_t)m.g->n_outputs + 1, sizeof *outs);
        if (outs && interp_run(m.g, &m.weights, NULL, outs, &d) == 0)
            bad = battery_compare_outputs(b, &m, outs, NULL);
    }
    if (outs)
        for (int k = 0; k < m.g->n_outputs; k++)
            tensor_free(outs[k]);
    free(outs);
    battery_unload(&m);
    return bad;
}

int main(int argc, char **argv) {
    static const BatterySuite suite = {"reference", "run", check_battery};
    return battery_main(argc, argv, &suite);
}
