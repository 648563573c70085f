/* The `kiln` command: option parsing shared by the subcommands, and the commands.
 *
 * Exit statuses (cli.md): 0 success; 1 the model, a weight or an input is wrong,
 * or the target cannot run here; 2 the command line is malformed; 3 kiln failed. */
#ifndef KILN_DRIVER_H
#define KILN_DRIVER_H

#include "../codegen/jit.h"
#include "../frontend/frontend.h"
#include "../passes/passes.h"

enum { EXIT_USER = 1, EXIT_USAGE = 2, EXIT_BUG = 3 };
enum { MAX_FILES = 256 };

typedef struct {
    const char *name; /* NAME of NAME=FILE */
    const char *file;
} Binding;

typedef struct {
    const char *model;
    const char *out;    /* -o */
    const char *target; /* interp, c, cuda */
    const char *weights[MAX_FILES];
    int n_weights;
    Binding inputs[MAX_FILES], outputs[MAX_FILES];
    int n_inputs, n_outputs;
    Binding binds[MAX_FILES]; /* --bind: ONNX graph inputs made constants */
    int n_binds;
    const char *weights_out;  /* --weights-out (kiln import) */
    PipelineOptions pipeline;
    const char *disabled[MAX_FILES];
    bool list_passes;
    const char *emit_source; /* --emit-source */
    const char *header;      /* --header */
    bool memory_report;      /* --memory-report */
    long steps;              /* --steps: runs of a training step (kiln run) */
} Options;

/* How the options compile a graph in process: memory planning as the pipeline
 * selects it, and the generated source into the dump directory. */
JitOptions jit_options(const Options *o);

/* Parses argv[first..argc) into o; what a command accepts is in `allowed`, a string of
 * option names such as "-o --weights --input". Returns 0, or EXIT_USAGE after a message. */
int parse_options(int argc, char **argv, int first, const char *allowed, const char *usage, Options *o);

/* Reads and parses the model (.kiln text, or .onnx through the importer, whose
 * weights come first in `weights`), checks it, and reads the weights (every param without
 * an initializer must have one when require_weights). 0 or EXIT_USER. */
int load_model(const Options *o, bool require_weights, Diag *d, SrcFile **src, Graph **g,
               TensorList *weights);

/* Whether a model path names a compiled model rather than a model file. */
bool is_shared_object(const char *path);

int cmd_run(int argc, char **argv);
int cmd_compile(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_opt(int argc, char **argv);
int cmd_dot(int argc, char **argv);
int cmd_import(int argc, char **argv);

#endif
