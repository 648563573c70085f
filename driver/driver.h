/* The `kiln` command: option parsing shared by the subcommands, their outputs, and
 * the commands.
 *
 * Each command describes itself in one table (a Command: its options with their
 * values and meanings); the parser accepts exactly the options of the table and
 * --help prints them all, so the two cannot disagree.
 *
 * Exit statuses (cli.md): 0 success; 1 the model, a weight or an input is wrong,
 * or the target cannot run here; 2 the command line is malformed; 3 kiln failed. */
#ifndef KILN_DRIVER_H
#define KILN_DRIVER_H

#include "../codegen/jit.h"
#include "../frontend/frontend.h"
#include "../passes/passes.h"

#include <sys/types.h>

enum { EXIT_USER = 1, EXIT_USAGE = 2, EXIT_BUG = 3 };
enum { MAX_FILES = 256, MAX_OUTPUTS = MAX_FILES + 8 };
/* The most inputs or outputs of a model that run and bench take (a training step's
 * outputs are one gradient per parameter). */
enum { MAX_PORTS = 4096 };

/* One option of a command: its name ("-o", "--weights"; "-O" stands for -O0, -O1
 * and -O2, "--no-PASS" for --no-NAME of any pass), its value's name (NULL: it takes
 * none) and what it does, for --help. */
typedef struct {
    const char *name, *value, *help;
} OptionSpec;

typedef struct {
    const char *name;          /* run, compile, ... */
    const char *synopsis;      /* after "usage: kiln NAME " */
    const char *about;         /* the paragraph under the usage line */
    const OptionSpec *options; /* ends with a row whose name is NULL */
} Command;

/* The rows several commands share. */
#define OPT_WEIGHTS                                                                                          \
    { "--weights", "FILE.safetensors", "values for params, by name; may be given several times" }
#define OPT_BIND                                                                                             \
    { "--bind", "NAME=FILE", "make the ONNX graph input NAME the constant in FILE (.npy or TensorProto .pb)" }
#define OPT_DIM                                                                                              \
    {                                                                                                        \
        "--dim", "NAME=SIZE|NAME<=BOUND",                                                                    \
            "fix the ONNX symbolic dim NAME (a dim_param of the graph inputs) at SIZE, or keep it the "      \
            "model's "                                                                                       \
            "symbolic batch, from 1 to BOUND"                                                                \
    }
#define OPT_LEVEL                                                                                            \
    { "-O", "0|1|2", "no optimization, cheap passes, or everything (default -O2)" }
#define OPT_PASSES                                                                                           \
    { "--passes", "P,...", "run these passes (--passes=P1,P2) instead of the -O level's pipeline" }
#define OPT_NO_PASS                                                                                          \
    { "--no-PASS", NULL, "turn the pass PASS off (kiln opt --list-passes names them)" }
#define OPT_DUMP_DIR                                                                                         \
    { "--dump-dir", "DIR", "write the graph after every pass as DIR/NN-PASS.kiln, and the generated source" }
#define OPT_CPU                                                                                              \
    {                                                                                                        \
        "--cpu", "CPU",                                                                                      \
            "build the code for CPU (-march): native (default: this machine's CPU, whose code may not run "  \
            "on an "                                                                                         \
            "older one), x86-64, x86-64-v2, x86-64-v3 or x86-64-v4"                                          \
    }
#define OPT_CHECK                                                                                            \
    {                                                                                                        \
        "--check", NULL,                                                                                     \
            "run the interpreter before the passes and after each, and fail naming the first pass that "     \
            "changes an "                                                                                    \
            "output beyond 1e-4 + 1e-4|expected|"                                                            \
    }
#define OPT_HELP                                                                                             \
    { "--help", NULL, "print this help (also -h)" }
#define OPT_QUIET                                                                                            \
    { "--quiet", NULL, "no progress line on stderr while the model compiles (it shows only on a terminal)" }

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
    struct {
        const char *name;
        long size;
        bool bound;    /* NAME<=SIZE: the model's symbolic dim, of that bound */
    } dims[MAX_FILES]; /* --dim NAME=SIZE: ONNX symbolic dims fixed */
    int n_dims;
    const char *weights_out;  /* --weights-out (kiln import) */
    const char *save_weights; /* --save-weights (kiln run) */
    PipelineOptions pipeline;
    const char *disabled[MAX_FILES];
    bool list_passes;
    const char *emit_source; /* --emit-source */
    const char *header;      /* --header */
    bool memory_report;      /* --memory-report */
    long steps;              /* --steps: runs of a training step (kiln run) */
    long iters, warmup;      /* --iters, --warmup (kiln bench) */
    long sizes[16];          /* --batch: sizes of the symbolic dim to time (kiln bench) */
    int n_sizes;
    bool profile;           /* --profile (kiln bench) */
    bool quiet;             /* --quiet: no progress line */
    const char *cpu;        /* --cpu: the -march; NULL: native */
    kiln_options settings;  /* the compile's settings from the environment (kiln_options_from_env) */
    const Command *command; /* the command being parsed, for its messages */
} Options;

/* An output file of a command (outputs.c). */
typedef struct {
    const char *path, *what; /* as given, and the option that gave it ("-o") */
    char name[4096];         /* the path with its directory resolved: what is written */
    char tmp[4200];          /* its temporary; "" when none */
    int fd;                  /* /dev/stdout and the like: the descriptor; else -1 */
    bool through;            /* a FIFO, a device or a descriptor: written, never replaced */
    bool exists;
    dev_t dev;
    ino_t ino;
    mode_t mode; /* an existing file's permissions, which its replacement keeps */
    int slot;    /* in the signal handler's registry (ir/tempfiles.h) */
} Output;

typedef struct {
    Output items[MAX_OUTPUTS];
    int n;
} Outputs;

void outputs_init(Outputs *s);
/* Registers an output path, before any work; returns its index (or -1 when there
 * are too many, which the option limits prevent). */
int outputs_add(Outputs *s, const char *path, const char *what);
/* Refuses an output that is one of the files the options read or another output,
 * by name or identity, and one that is a directory, a block device, a socket or a
 * dangling symlink. 0, or -1 after a message. */
int outputs_check(Outputs *s, const Options *o, Diag *d);
/* The temporary file that becomes output i, made empty if not yet there (for a
 * writer that needs a path); NULL after a message. */
const char *outputs_temp(Outputs *s, int i, Diag *d);
/* Writes buf as the contents of output i (into its temporary). */
int outputs_write(Outputs *s, int i, const void *buf, size_t len, Diag *d);
/* Puts every output in place: FIFOs and devices written first, then the temporaries
 * renamed. 0, or -1 after a message; on failure before any rename, nothing is left. */
int outputs_commit(Outputs *s, Diag *d);
/* Removes every temporary: the command failed. */
void outputs_abort(Outputs *s);

/* The exit status of a command that returned rc (0, EXIT_USAGE, or any other
 * failure) with the diagnostics in d, after a failed internal assertion is
 * reported there (diag_take_assert): 3 when kiln itself failed (an error of kind
 * DIAG_INTERNAL), else 1, also for running out of memory (docs/cli.md). */
int exit_status(int rc, Diag *d);
/* The type of a compiled model's tensor t (kiln/model.h); -1 after a diagnostic
 * naming it and `model` when kiln does not handle its dtype or rank. */
int tensor_info_type(const char *model, const kiln_model_def *def, const kiln_tensor_info *t, Type *type,
                     Diag *d);

/* How the options compile a graph in process: the environment's settings with
 * --target and --cpu, memory planning as the pipeline selects it, and the
 * generated source into the dump directory. -1 after a diagnostic. */
int jit_options(const Options *o, JitOptions *jo, Diag *d);

/* Parses argv[first..argc) into o: the options of cmd's table, and one MODEL.
 * Returns 0, or EXIT_USAGE after a one-line message. */
int parse_options(int argc, char **argv, int first, const Command *cmd, Options *o);
/* Whether argv asks for the command's help (--help or -h anywhere after the
 * command); if so, prints it. */
bool help_requested(int argc, char **argv, const Command *cmd);
/* Prints cmd's help: usage, what it does, every option, the environment. */
void print_help(const Command *cmd, FILE *out);
/* A malformed command line: one line naming the problem and pointing at --help.
 * Returns EXIT_USAGE. */
int usage_error(const Command *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Reads the model (.kiln text, or .onnx through the importer, whose weights come
 * first in `weights`) and its weights files into *in, parses and checks it (every param
 * without an initializer must have a weight when require_weights). The graph points
 * into *in: model_input_free it after the graph. 0 or EXIT_USER. */
int load_model(const Options *o, bool require_weights, Diag *d, ModelInput *in, Graph **g,
               TensorList *weights);
/* load_model in two steps: reading the files, then parsing what was read. */
int read_model(const Options *o, ModelInput *in, Diag *d);
int parse_read_model(const Options *o, const ModelInput *in, bool require_weights, Diag *d, Graph **g,
                     TensorList *weights);

/* Whether a model path names a compiled model rather than a model file. */
bool is_shared_object(const char *path);

/* The progress line of a long compile on stderr (progress.c): started for the
 * model, when stderr is a terminal and not quiet; each stage replaces the last
 * (a string that lives until the end); ended (and erased) before the command
 * prints anything of its own. */
void progress_start(const char *model, bool quiet);
void progress_stage(const char *stage);
void progress_end(void);

int cmd_run(int argc, char **argv);
int cmd_compile(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_opt(int argc, char **argv);
int cmd_dot(int argc, char **argv);
int cmd_import(int argc, char **argv);

#endif
