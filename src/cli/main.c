/* memfit command line: train, profile, estimate, sample, eval, tokenize. */
#include "memfit/config.h"
#include "memfit/core.h"
#include "memfit/data.h"
#include "dist/dist.h"
#include "io/io.h"
#include "memfit/kernels.h"
#include "memfit/model.h"
#include "memfit/monitor.h"
#include "memfit/planner.h"
#include "memfit/train.h"
#include "observe.h"
#include "profile.h"
#include "convert.h"
#include "eval_chat.h"
#include "merge.h"
#include "quantize.h"
#include "help.h"
#include "report.h"

#include <errno.h>
#include <omp.h>
#include <signal.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_POS 8

static int die(const char *what) {
    fprintf(stderr, "memfit: error: %s\n", what);
    return 1;
}

/* ---- OpenBLAS kernel choice -------------------------------------------
 * OpenBLAS reads OPENBLAS_CORETYPE once, when the library loads, before
 * main runs. To change it we set the variable and re-execute ourselves.
 * "auto": on a CPU with AVX-512, an inherited setting naming an older core
 * (e.g. Haswell, which pins the AVX2 kernels at about half the speed) is
 * dropped so OpenBLAS detects the CPU itself; elsewhere it is kept. "env"
 * keeps whatever the environment says; any other value is used as is. */
static const char *arg_value(int argc, char **argv, const char *key) {
    size_t n = strlen(key);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strncmp(a, "--", 2) != 0) continue;
        a += 2;
        size_t k = 0;
        while (k < n && (a[k] == key[k] || (key[k] == '_' && a[k] == '-'))) k++;
        if (k != n) continue;
        if (a[n] == '=') return a + n + 1;
        if (a[n] == 0 && i + 1 < argc) return argv[i + 1];
    }
    return NULL;
}

/* returns 1 if it changed the environment (a re-exec is needed) */
static int blas_coretype_setup(int argc, char **argv) {
    const char *want = arg_value(argc, argv, "blas_coretype");
    if (!want) want = getenv("MEMFIT_BLAS_CORETYPE");
    if (!want) want = "auto";
    const char *cur = getenv("OPENBLAS_CORETYPE");
    int change = 0;
    if (strcmp(want, "env") == 0) return 0;
    if (strcmp(want, "auto") == 0) {
        __builtin_cpu_init();
        int avx512 = __builtin_cpu_supports("avx512f");
        /* cores whose kernels use AVX-512: an inherited setting naming one is kept */
        static const char *const avx512_cores[] = {"SkylakeX", "Cooperlake", "SapphireRapids", NULL};
        int keep = !cur;
        for (int i = 0; cur && avx512_cores[i]; i++) keep |= strcasecmp(cur, avx512_cores[i]) == 0;
        if (avx512 && !keep) { unsetenv("OPENBLAS_CORETYPE"); change = 1; }
    } else if (!cur || strcmp(cur, want) != 0) {
        setenv("OPENBLAS_CORETYPE", want, 1);
        change = 1;
    }
    return change;
}

/* ---- OpenMP wait policy -----------------------------------------------
 * libgomp reads OMP_WAIT_POLICY when it loads, so like the BLAS core type
 * it is set before a re-exec. A thread that reaches a barrier first spins
 * (by default, for a while) waiting for the others. On a machine where other
 * processes compete for the cores, the partner it waits for is often not
 * running, and the spin burns the very time slice the partner needs: on the
 * 2-core project machine at load 18, a bytes-level L4 C256 model trained at
 * 457-538 tokens/s spinning and 2157-2179 sleeping (docs/performance.md).
 * "auto" sleeps (passive) when OMP_WAIT_POLICY is unset and other
 * processes want the cores now: the 1-minute load average at start is at
 * least the number of online cores, and so is the number of other runnable
 * tasks, averaged over 20 looks at /proc/loadavg 5 ms apart. The load
 * average alone lags by a minute: a run started just after another one
 * ended (a script's next run) saw load 2 on the idle 2-core machine, slept
 * at every barrier and took 0.042 s a step against 0.036 spinning for
 * gpt2-1m B8 T128. Otherwise libgomp's default; "active" / "passive" force
 * one; "env" keeps the environment. An invalid value is left for the
 * config parser to report. Returns 1 if it changed the environment. */
static double others_runnable(void) {
    double sum = 0;
    int n = 0;
    for (int i = 0; i < 20; i++) {
        FILE *f = fopen("/proc/loadavg", "r");
        int run = 0, tot = 0;
        if (f && fscanf(f, "%*f %*f %*f %d/%d", &run, &tot) == 2) sum += run > 0 ? run - 1 : 0, n++;  /* not us */
        if (f) fclose(f);
        if (i < 19) nanosleep(&(struct timespec){0, 5000000L}, NULL);
    }
    return n ? sum / n : 1e9;  /* unreadable: trust the load average */
}

static int omp_wait_setup(int argc, char **argv) {
    const char *want = arg_value(argc, argv, "omp_wait");
    if (!want) want = getenv("MEMFIT_OMP_WAIT");
    if (!want) want = "auto";
    const char *cur = getenv("OMP_WAIT_POLICY"), *set = NULL;
    if (strcmp(want, "auto") == 0) {
        double la;
        long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
        if (cur || getloadavg(&la, 1) != 1 || ncpu < 1 || la < (double)ncpu) return 0;
        if (others_runnable() < (double)ncpu) return 0;
        set = "passive";
    } else if (strcmp(want, "active") == 0 || strcmp(want, "passive") == 0) {
        set = want;
    } else {
        return 0;
    }
    if (cur && strcasecmp(cur, set) == 0) return 0;
    setenv("OMP_WAIT_POLICY", set, 1);
    return 1;
}

static void env_setup(int argc, char **argv) {
    if (getenv("MEMFIT_REEXEC")) return;
    int change = blas_coretype_setup(argc, argv);
    change |= omp_wait_setup(argc, argv);
    if (!change) return;
    setenv("MEMFIT_REEXEC", "1", 1);
    execv("/proc/self/exe", argv);
    /* if re-exec fails we carry on with the environment we loaded with */
}

/* ---- commands ---------------------------------------------------------- */

/* Copies the tokenizer.json at src to dir/tokenizer.json (temp file and
 * rename), unless it is that file already. */
static int copy_tokenizer(const char *src, const char *dir) {
    char dst[MF_PATH_MAX + 32], tmp[MF_PATH_MAX + 64];
    snprintf(dst, sizeof dst, "%s/tokenizer.json", dir);
    struct stat a, b;
    if (stat(src, &a) == 0 && stat(dst, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino) return 0;
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", dst, (long)getpid());
    FILE *in = fopen(src, "rb"), *out = in ? fopen(tmp, "wb") : NULL;
    int ok = in && out;
    char buf[1 << 16];
    size_t n;
    while (ok && (n = fread(buf, 1, sizeof buf, in)) > 0) ok = fwrite(buf, 1, n, out) == n;
    if (in && ferror(in)) ok = 0;
    if (in) fclose(in);
    if (out && fclose(out) != 0) ok = 0;
    if (ok && rename(tmp, dst) == 0) return 0;
    int e = errno;
    if (out) unlink(tmp);
    return mf_fail("cannot copy the tokenizer %s to %s: %s", src, dst, strerror(e));
}

static int parse(mf_config *cfg, int argc, char **argv, char **pos, int *npos) {
    mf_config_defaults(cfg);
    int n = mf_config_parse_args(cfg, argc, argv, pos, MAX_POS);
    if (n < 0) return -1;
    *npos = n;
    return 0;
}

static int wants_help(int argc, char **argv) {
    for (int i = 0; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) return 1;
    return 0;
}

static int mkdir_p(const char *dir) {
    char tmp[MF_PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s", dir);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(tmp, 0755) && errno != EEXIST) return mf_fail("cannot create %s: %s", tmp, strerror(errno));
        *p = '/';
    }
    if (mkdir(tmp, 0755) && errno != EEXIST) return mf_fail("cannot create %s: %s", tmp, strerror(errno));
    return 0;
}

static void usage_train(FILE *f) {
    fprintf(f, "usage: memfit train [--config FILE.yaml] [--key=value ...]\n"
               "  Trains a GPT-2 or Llama-family model inside its memory plan and ends with the memory report.\n"
               "  Shorthand: --model PRESET --batch B --seq T --steps N --budget SIZE.\n"
               "  --tokenizer gpt2|bytes|PATH/tokenizer.json with any model whose vocab_size holds its ids\n"
               "  (--init DIR: DIR/tokenizer.json by default); --data must be tokenized with that tokenizer.\n"
               "  --trace FILE.json writes phases, steps and memory by category (ui.perfetto.dev);\n"
               "  --report DIR writes DIR/report.html (and DIR/metrics.jsonl unless --metrics is given).\n"
               "  Under mpirun -np N: data parallel over N ranks, --batch split over them, --zero 0-3 shards state.\n"
               "  Example: memfit train --model gpt2-124m --batch 4 --seq 256 --steps 3\n"
               "  Example: mpirun -np 2 memfit train --model gpt2-10m --batch 8 --zero 1\n"
               "  LoRA: --lora r=8,alpha=16,dropout=0.05,targets=attn.c_attn,attn.c_proj,mlp.c_fc,mlp.c_proj freezes\n"
               "  the base (--init) and trains adapters; --save-adapter DIR writes them in PEFT's layout.\n\n");
    mf_config_print_help(f);
    mf_report_presets(f);
}

static void usage_profile(FILE *f) {
    fprintf(f, "usage: memfit profile [same keys as train]\n"
               "  Runs a few training steps (default 3; no validation, checkpoints or samples) timing each\n"
               "  phase, then prints per layer: activations kept, scratch peak, forward and backward ms and\n"
               "  FLOPs; the bytes per category (the ledger's); the top 5 buffers; and what other settings\n"
               "  would save, from their real plans.\n"
               "  Example: memfit profile --model gpt2-10m --batch 8 --seq 256\n\n");
    mf_config_print_help(f);
    mf_report_presets(f);
}

/* Creates the report folder (one level): a clear error when its parent is
 * missing or the path is not a folder. */
static int report_dir(const char *dir) {
    struct stat st;
    if (mkdir(dir, 0755) == 0) return 0;
    if (errno == EEXIST) {
        if (stat(dir, &st) == 0 && S_ISDIR(st.st_mode)) return 0;
        return mf_fail("report folder %s exists and is not a folder", dir);
    }
    if (errno == ENOENT)
        return mf_fail("cannot create report folder %s: its parent folder does not exist (create it first)", dir);
    return mf_fail("cannot create report folder %s: %s", dir, strerror(errno));
}

/* The planner's rates when the cache has none (or busy ones, mf_rates_busy): measured in a child
 * process, so the calibration's buffers never count in this process's peak
 * RSS (which the budget bounds). The trainer then reads the cache; if the
 * child failed, the trainer calibrates itself. Runs before this process
 * uses OpenMP. */
static void calibrate_apart(int threads) {
    int n = threads > 0 ? threads : omp_get_num_procs();
    mf_rates r;
    if (mf_planner_rates_cached(&r, n) == 0 && !mf_rates_busy(&r)) return; /* a busy one: measured again */
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        mf_threads_setup(n);
        _exit(mf_planner_rates(&r, n, 1, NULL) ? 1 : 0);
    }
    if (pid > 0) waitpid(pid, NULL, 0);
}

/* SIGINT / SIGTERM during training: the first asks the loop to stop after
 * the step in progress (checkpoint, exit 0); a second one means "now". */
static volatile sig_atomic_t stop_signal;

static void on_stop_signal(int sig) {
    if (stop_signal) {
        static const char msg[] = "\nmemfit: second signal: stopping at once, without a checkpoint "
                                  "(the last complete one is kept)\n";
        ssize_t w = write(2, msg, sizeof msg - 1);
        (void)w;
        _exit(128 + sig);
    }
    stop_signal = sig;
}

static void stop_signals_install(void) {
    /* The handler runs on a stack of its own: a signal frame pushed on the
     * interrupted stack corrupts oneDNN's sgemm (3 runs in 10 aborted in
     * free() when SIGTERM arrived mid-step), which keeps data below the
     * stack pointer. kill(pid) goes to the main thread, which has this stack. */
    static char alt[1 << 16];
    stack_t ss = {.ss_sp = alt, .ss_size = sizeof alt, .ss_flags = 0};
    int onstack = sigaltstack(&ss, NULL) == 0;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    /* reads and writes in flight carry on; the loop looks at the flag */
    sa.sa_flags = SA_RESTART | (onstack ? SA_ONSTACK : 0);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

/* --resume auto: the checkpoint memfit keeps in --out_dir (written
 * atomically, so if it is there it is complete) or none: start fresh. */
static int resume_auto(mf_config *cfg) {
    if (strcmp(cfg->resume, "auto") != 0) return 0;
    if (!cfg->out_dir[0]) return mf_fail("--resume auto looks for the checkpoint in --out_dir: give --out_dir");
    char p[MF_PATH_MAX + 64], shard[MF_PATH_MAX + 96];
    snprintf(p, sizeof p, "%s/checkpoint.safetensors", cfg->out_dir);
    int found = access(p, R_OK) == 0;
    if (!found && mf_dist_world() > 1) {
        mf_trainer_shard_path(p, mf_dist_rank(), mf_dist_world(), shard, sizeof shard);
        found = access(shard, R_OK) == 0;
    }
    if (found) {
        if (strlen(p) >= sizeof cfg->resume) return mf_fail("--resume auto: path %s is too long", p);
        snprintf(cfg->resume, sizeof cfg->resume, "%s", p);
        if (mf_dist_rank() == 0) printf("resume auto: resuming from %s\n", p);
    } else {
        cfg->resume[0] = 0;
        if (mf_dist_rank() == 0) printf("resume auto: no checkpoint in %s, starting fresh\n", cfg->out_dir);
    }
    return 0;
}

/* train and profile: the same run; profile skips validation, checkpoints
 * and samples, and prints its tables at the end. */
static int cmd_train(int argc, char **argv, int profile) {
    if (wants_help(argc, argv)) { if (profile) usage_profile(stdout); else usage_train(stdout); return 0; }
    mf_config cfg;
    char *pos[MAX_POS];
    int npos;
    const char *cmd = profile ? "profile" : "train";
    if (parse(&cfg, argc, argv, pos, &npos)) return die(mf_error());
    if (npos) { mf_fail("%s takes no positional arguments ('%s')", cmd, pos[0]); return die(mf_error()); }
    if (profile) {
        if (!mf_config_was_set(&cfg, "steps")) cfg.steps = 3;
        cfg.out_dir[0] = 0;
        cfg.sample_tokens = 0;
        cfg.sample_every = 0;
        cfg.val_every = 0;
        cfg.ckpt_every = 0;
    }
    if (mf_dist_rank() > 0) cfg.report[0] = cfg.trace[0] = 0;  /* rank 0 writes the job's report and trace */
    if (cfg.out_dir[0] && mkdir_p(cfg.out_dir)) return die(mf_error());
    if (cfg.out_dir[0]) {
        /* temp files of writers that were killed mid-write (kill -9, power) */
        char names[512];
        int n = mf_atomic_clean_stale(cfg.out_dir, names, sizeof names);
        if (n < 0) return die(mf_error());
        if (n > 0) printf("removed %d stale temp file%s in %s left by processes that are gone: %s\n", n,
                          n > 1 ? "s" : "", cfg.out_dir, names);
    }
    if (resume_auto(&cfg)) return die(mf_error());
    if (mf_health_configure(cfg.health_levels)) return die(mf_error());
    char metrics_path[MF_PATH_MAX + 32];
    snprintf(metrics_path, sizeof metrics_path, "%s", cfg.metrics);
    if (cfg.report[0]) {
        if (report_dir(cfg.report)) return die(mf_error());
        if (!metrics_path[0]) snprintf(metrics_path, sizeof metrics_path, "%s/metrics.jsonl", cfg.report);
    }
    /* data parallel: ranks other than 0 write theirs beside rank 0's */
    if (metrics_path[0] && mf_dist_rank() > 0)
        snprintf(metrics_path + strlen(metrics_path), sizeof metrics_path - strlen(metrics_path), ".rank%d", mf_dist_rank());
    FILE *metrics = NULL;
    if (metrics_path[0] && !(metrics = fopen(metrics_path, cfg.resume[0] ? "a" : "w"))) {
        mf_fail("cannot open metrics file %s: %s", metrics_path, strerror(errno));
        return die(mf_error());
    }
    mf_trace *trace = NULL;
    if (cfg.trace[0] && !(trace = mf_trace_open(cfg.trace))) {
        if (metrics) fclose(metrics);
        return die(mf_error());
    }
    if (cfg.budget && strcmp(cfg.plan, "auto") == 0 && mf_dist_world() == 1) calibrate_apart(cfg.threads);
    double t0 = mf_time_now();
    mf_trainer t;
    mf_dims sd;
    /* cross-layer sharing: a Llama's out_dir is a Hugging Face folder, one
     * weight set per layer, which a shared model does not have (refused
     * before training, not after it; docs/sharing.md) */
    if (cfg.share_layers && cfg.out_dir[0] && mf_model_dims(&cfg, &sd) == 0 && sd.share && sd.arch == MF_ARCH_LLAMA) {
        mf_fail("share_layers %d with --out_dir: a Llama-family model is saved as a Hugging Face folder, which has no "
                "shared layers; export of a shared Llama is not supported (drop --out_dir, or --share_layers)",
                cfg.share_layers);
        if (trace) mf_trace_close(trace);
        if (metrics) fclose(metrics);
        return die(mf_error());
    }
    if (mf_trainer_init(&t, &cfg, MF_MODE_TRAIN)) {
        int rc = die(mf_error());
        mf_trace_span(trace, "setup (failed)", "init", t0, mf_time_now());
        if (mf_trace_close(trace)) die(mf_error());
        if (metrics) fclose(metrics);
        return rc;
    }
    mf_trace_span(trace, "setup", "init", t0, mf_time_now());
    mf_observer obs;
    if (mf_observer_init(&obs, &t, trace)) {
        int rc = die(mf_error());
        if (mf_trace_close(trace)) die(mf_error());
        if (metrics) fclose(metrics);
        mf_trainer_free(&t);
        return rc;
    }
    /* profile times the steps after the first (warm-up) when there are two */
    obs.count_from = t.step + (cfg.steps - t.step >= 2 ? 2 : 1);
    mf_report_header(stdout, &t);
    int progress = cfg.progress < 0 ? isatty(1) : cfg.progress;
    int rc = 0;
    double val = NAN, first_val = NAN;
    if (!profile && t.step == 0 && cfg.steps > 0) {
        double r0 = mf_time_now();
        first_val = mf_trainer_val_loss(&t);
        mf_observer_region(&obs, "validation", "eval", r0);
        if (!isnan(first_val)) printf("val loss before training: %.4f\n", first_val);
    }
    char ckpt[MF_PATH_MAX + 64];
    snprintf(ckpt, sizeof ckpt, "%s/checkpoint.safetensors", cfg.out_dir);
    /* step times after the first (warm-up of the libraries) for the planner's report: the
     * last 1024, in a fixed array (nothing allocated per step) */
    static double step_s[1024];
    int n_step_s = 0, first_step = t.step + 1, stopped = 0;
    /* one process only: under mpirun dist.c handles the launcher's SIGTERM
     * (a signalled job, or a rank that died) and the ranks agree on the step
     * to stop after (mf_dist_stop_agree, below) */
    if (!profile && mf_dist_world() == 1) stop_signals_install();
    while (t.step < cfg.steps) {
        mf_step_stats st;
        mf_observer_step_begin(&obs, t.step + 1);
        if (mf_trainer_step(&t, &st)) {
            rc = die(mf_error());
            mf_observer_step_end(&obs, 0);
            break;
        }
        int leak = mf_observer_step_end(&obs, 1);
        /* the prediction is for the planned shape: not seq_warmup's steps */
        if (t.step > first_step && st.seq == t.T) step_s[n_step_s++ % 1024] = st.seconds;
        char leak_msg[1024];
        if (leak) snprintf(leak_msg, sizeof leak_msg, "%s", mf_error());
        int last = t.step == cfg.steps;
        val = NAN;
        if (!profile && ((cfg.val_every && t.step % cfg.val_every == 0) || last)) {
            double r0 = mf_time_now();
            val = mf_trainer_val_loss(&t);
            mf_observer_region(&obs, "validation", "eval", r0);
        }
        mf_report_step(stdout, &t, &st, val, progress, metrics, obs.step_at_peak);
        if (leak) {
            if (progress) printf("\n");
            rc = die(leak_msg);
            break;
        }
        if (cfg.sample_every && t.step % cfg.sample_every == 0 && !last && cfg.sample_tokens > 0) {
            double r0 = mf_time_now();
            printf("--- sample at step %d ---\n", t.step);
            int bad = mf_trainer_sample(&t, cfg.prompt, cfg.sample_tokens, stdout);
            mf_observer_region(&obs, "sample", "sample", r0);
            if (bad) { rc = die(mf_error()); break; }
        }
        if (cfg.out_dir[0] && ((cfg.ckpt_every && t.step % cfg.ckpt_every == 0) || last)) {
            double r0 = mf_time_now();
            int bad = mf_trainer_save_checkpoint(&t, ckpt);
            mf_observer_region(&obs, "checkpoint", "io", r0);
            if (bad) { rc = die(mf_error()); break; }
        }
        /* under mpirun the ranks agree on stopping after this step (dist.c) */
        int stop = stop_signal;
        if (!profile && mf_dist_stop_agree(&stop)) { rc = die(mf_error()); break; }
        if (!profile && !last && stop) {
            /* the step is done: keep it, and stop cleanly */
            stopped = 1;
            if (progress) printf("\n");
            int bad = 0;
            if (cfg.out_dir[0] && !(cfg.ckpt_every && t.step % cfg.ckpt_every == 0)) {
                double r0 = mf_time_now();
                bad = mf_trainer_save_checkpoint(&t, ckpt);
                mf_observer_region(&obs, "checkpoint", "io", r0);
            }
            if (bad) rc = die(mf_error());
            else if (cfg.out_dir[0])
                printf("stopped by %s after step %d; checkpoint %s written (continue with --resume auto --out_dir %s)\n",
                       stop == SIGINT ? "SIGINT" : "SIGTERM", t.step, ckpt, cfg.out_dir);
            else
                printf("stopped by %s after step %d; no --out_dir, so no checkpoint was written\n",
                       stop == SIGINT ? "SIGINT" : "SIGTERM", t.step);
            break;
        }
    }
    if (progress && !stopped) printf("\n");
    if (!rc && !stopped && cfg.out_dir[0]) {
        char model[MF_PATH_MAX + 64];
        snprintf(model, sizeof model, "%s/model.safetensors", cfg.out_dir);
        double r0 = mf_time_now();
        int bad = mf_trainer_save_weights(&t, model);
        /* a Llama-family model: the folder is a Hugging Face model folder
         * (config.json beside model.safetensors, HF names and layout) */
        char hfc[MF_PATH_MAX + 64] = "";
        if (!bad && t.d.arch == MF_ARCH_LLAMA && t.rank == 0) {
            snprintf(hfc, sizeof hfc, "%s/config.json", cfg.out_dir);
            bad = mf_hf_write_config(hfc, &t.d);
            /* with its tokenizer.json, so --init OUT_DIR finds it */
            if (!bad && mf_tokenizer_spec_is_json(t.d.tokenizer)) bad = copy_tokenizer(t.d.tokenizer, cfg.out_dir);
        }
        mf_observer_region(&obs, "save weights", "io", r0);
        if (bad) rc = die(mf_error());
        else if (hfc[0] && mf_tokenizer_spec_is_json(t.d.tokenizer))
            printf("wrote %s, %s, %s and %s/tokenizer.json\n", ckpt, model, hfc, cfg.out_dir);
        else if (hfc[0]) printf("wrote %s, %s and %s\n", ckpt, model, hfc);
        else printf("wrote %s and %s\n", ckpt, model);
    }
    if (!rc && !stopped && cfg.save_adapter[0]) {
        int bad = mf_lora_save_adapter(&t.model, &t.arena, cfg.save_adapter, cfg.init[0] ? cfg.init : cfg.model);
        if (bad) rc = die(mf_error());
        else if (mf_dist_rank() == 0)  /* under mpirun rank 0 writes the one folder */
            printf("wrote %s/adapter_model.safetensors and %s/adapter_config.json\n", cfg.save_adapter, cfg.save_adapter);
    }
    if (!rc && !stopped && cfg.sample_tokens > 0 && t.tok) {
        double r0 = mf_time_now();
        printf("--- sample ---\n");
        int bad = mf_trainer_sample(&t, cfg.prompt, cfg.sample_tokens, stdout);
        mf_observer_region(&obs, "sample", "sample", r0);
        if (bad) rc = die(mf_error());
    }
    if (!rc) {
        mf_report_memory(stdout, &t);
        mf_report_planner(stdout, &t, step_s, n_step_s < 1024 ? n_step_s : 1024);
        mf_observer_print_leak(stdout, &obs);
        if (profile) mf_profile_print(stdout, &t, &obs);
    }
    mf_observer_free(&obs);
    if (metrics) fclose(metrics);
    /* the report and the trace are written for a failed run too: they are
     * what shows how it failed */
    if (cfg.report[0]) {
        char html[MF_PATH_MAX + 32], title[128];
        snprintf(html, sizeof html, "%s/report.html", cfg.report);
        snprintf(title, sizeof title, "memfit %s: %s%s", cmd, cfg.model, rc ? " (failed)" : "");
        char *plan = mf_report_plan_json_string(&cfg, &t.d, &t.plan, &t.model, t.ledger.rss_baseline);
        if (!plan) rc = die("out of memory for the plan's JSON");
        else if (mf_report_html(html, metrics_path, plan, title)) rc = die(mf_error());
        else printf("wrote %s\n", html);
        free(plan);
    }
    if (trace) {
        if (mf_trace_close(trace)) rc = die(mf_error());
        else printf("wrote %s\n", cfg.trace);
    }
    mf_trainer_free(&t);
    return rc;
}

/* An over-budget message of a fixed config, with what the planner finds:
 * the fastest setting that would fit, or the smallest feasible budget. */
static const char *over_budget_hint(const mf_config *cfg, size_t runtime, int nthreads) {
    static char msg[2048];
    snprintf(msg, sizeof msg, "%s", mf_error());
    mf_rates rates;
    mf_planner_result r;
    char path[MF_PATH_MAX], d[256], a[32];
    mf_planner_offload_path(cfg, path, sizeof path);
    mf_config c = *cfg;
    /* the planner may vary everything here: the user's keys are what failed */
    memset(c.set_by_user, 0, sizeof c.set_by_user);
    if (mf_planner_rates(&rates, nthreads, 0, NULL) ||
        mf_planner_search(&c, c.effective_batch, strcmp(c.allow, "lossy") == 0, runtime, nthreads, &rates, path, &r))
        return msg;
    size_t len = strlen(msg);
    if (r.chosen >= 0)
        snprintf(msg + len, sizeof msg - len, "; the fastest setting that fits: %s (%s, predicted %.3f s/step; "
                 "memfit plan shows the others)", mf_planner_describe(&r.c[r.chosen], d, sizeof d),
                 mf_size_format(r.c[r.chosen].need, a, sizeof a), r.c[r.chosen].pred_s);
    else
        snprintf(msg + len, sizeof msg - len, "; no setting fits: the smallest feasible budget is %s, with %s",
                 mf_size_format(r.c[r.smallest].need, a, sizeof a), mf_planner_describe(&r.c[r.smallest], d, sizeof d));
    mf_planner_free(&r);
    return msg;
}

static int cmd_estimate(int argc, char **argv) {
    int json = 0;
    char *args[256];
    int n = 0;
    for (int i = 0; i < argc && n < 255; i++) {
        if (strcmp(argv[i], "--json") == 0) json = 1;
        else args[n++] = argv[i];
    }
    if (wants_help(n, args)) {
        printf("usage: memfit estimate [--json] [same keys as train]\n"
               "  Prints the memory plan per category and per layer without allocating it.\n"
               "  Example: memfit estimate --model gpt2-124m --batch 4 --seq 256\n\n");
        mf_config_print_help(stdout);
        mf_report_presets(stdout);
        return 0;
    }
    mf_config cfg;
    char *pos[MAX_POS];
    int npos;
    if (parse(&cfg, n, args, pos, &npos)) return die(mf_error());
    if (npos) { mf_fail("estimate takes no positional arguments ('%s')", pos[0]); return die(mf_error()); }
    int nthreads = mf_threads_setup(cfg.threads);
    mf_dims d;
    mf_plan plan;
    mf_model model;
    /* the runtime outside the arena, measured as train measures it */
    if (mf_model_dims(&cfg, &d)) return die(mf_error());
    int T = cfg.seq ? cfg.seq : d.maxT;
    mf_blas_warmup(&d, cfg.batch * T, mf_blas_warm_shapes(&cfg));
    size_t runtime = mf_rss_current();
    if (mf_model_build_plan(&cfg, MF_MODE_TRAIN, nthreads, runtime, &d, &plan, &model)) return die(mf_error());
    if (json) mf_report_estimate_json(stdout, &cfg, &d, &plan, &model, runtime);
    else mf_report_estimate(stdout, &cfg, &d, &plan, &model, runtime);
    int rc = 0;
    if (mf_plan_check_budget(&plan, runtime, cfg.budget)) rc = die(cfg.world_size > 1 ? mf_error() : over_budget_hint(&cfg, runtime, nthreads));
    mf_model_free(&model);
    mf_plan_free(&plan);
    return rc;
}

/* plan / estimate options that are not config keys */
static int take_flag(int argc, char **argv, const char *flag, int *n, char **out) {
    int hit = 0;
    *n = 0;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], flag) == 0) hit = 1;
        else out[(*n)++] = argv[i];
    }
    return hit;
}

/* Expert parallel (docs/moe.md): the all-to-all bytes of one optimizer step
 * for one rank's tokens. Per layer and micro-batch the rank's S slot rows
 * (mf_moe_ep_bounds: tokens x top-k dropless, fewer with a capacity) go to
 * their experts' owners and their outputs come back (2 directions), and
 * backward moves their gradients the same two ways (x 2), fp32 rows of C:
 * L x grad_accum x S x C x 4 B x 2 x 2. An upper bound on the wire: the
 * rows whose expert is on the rank itself are MPI_Alltoallv's local copy
 * (about 1/N of them with balanced routing). */
static void print_alltoall(const mf_dims *d, const mf_planner_choice *c, int seq) {
    int64_t S = 0;
    if (mf_moe_ep_bounds(d, c->batch * seq, &S, NULL, NULL, NULL)) return;
    double bytes = (double)d->L * c->grad_accum * (double)S * d->C * 4 * 2 * 2;
    char a[32];
    printf("expert parallel over groups of %d ranks: per rank per step %s of all-to-all (%.0f bytes = %d layers x "
           "%d micro-batch(es) x %lld slot rows (batch %d x seq %d x top-%d%s) x C %d x 4 B x 2 directions (dispatch, "
           "combine) x 2 (forward, backward)), not included in s/step\n",
           d->ep, mf_size_format((size_t)bytes, a, sizeof a), bytes, d->L, c->grad_accum, (long long)S, c->batch, seq,
           d->top_k, d->capacity_factor > 0 ? ", at most, capacity-bounded" : "", d->C);
}

static int cmd_plan(int argc, char **argv) {
    char *a1[256], *a2[256], *a3[256], *args[256];
    int n1, n2, n3, n;
    if (argc > 255) argc = 255;
    int json = take_flag(argc, argv, "--json", &n1, a1);
    int all = take_flag(n1, a1, "--all", &n2, a2);
    int recal = take_flag(n2, a2, "--recalibrate", &n3, a3);
    memcpy(args, a3, sizeof(char *) * (size_t)n3);
    n = n3;
    if (wants_help(n, args)) {
        printf("usage: memfit plan --model M --batch B --seq T [--effective-batch N] --budget SIZE [--allow lossy]\n"
               "                   [--json] [--all] [--recalibrate] [other train keys]\n"
               "  Plans every setting of the run (recompute, micro-batch x grad_accum with the effective batch\n"
               "  fixed, update_in_backward when grad_clip is 0, optimizer state offloaded to disk; with\n"
               "  --allow lossy also adamw8bit and adafactor for adamw, bf16, and LoRA r=8 on an fp32, bf16,\n"
               "  int8 or nf4 base when --init is given), predicts each one's step time from this\n"
               "  machine's calibrated rates, prints the Pareto frontier (memory vs time) and marks the fastest\n"
               "  setting that fits the budget; the one `memfit train --budget` would use. Keys you set are kept.\n"
               "  --all lists every setting; --recalibrate re-measures the rates (cached in $MEMFIT_CACHE).\n"
               "  A budget below every setting: the smallest feasible budget and its setting, exit 1.\n"
               "  Example: memfit plan --model gpt2-124m --batch 4 --seq 256 --effective-batch 16 --budget 2GiB\n\n");
        mf_config_print_help(stdout);
        mf_report_presets(stdout);
        return 0;
    }
    mf_config cfg;
    char *pos[MAX_POS];
    int npos;
    if (parse(&cfg, n, args, pos, &npos)) return die(mf_error());
    if (npos) { mf_fail("plan takes no positional arguments ('%s')", pos[0]); return die(mf_error()); }
    int eff = cfg.effective_batch ? cfg.effective_batch : cfg.batch * cfg.grad_accum;
    if (mf_config_was_set(&cfg, "grad_accum") && cfg.effective_batch && cfg.batch * cfg.grad_accum != cfg.effective_batch) {
        mf_fail("batch %d x grad_accum %d is not effective_batch %d", cfg.batch, cfg.grad_accum, cfg.effective_batch);
        return die(mf_error());
    }
    int nthreads = mf_threads_setup(cfg.threads);
    mf_rates rates;
    int cached = 0;
    if (mf_planner_rates(&rates, nthreads, recal ? 1 : 2, &cached)) return die(mf_error());
    mf_dims d;
    if (mf_model_dims(&cfg, &d)) return die(mf_error());
    int T = cfg.seq ? cfg.seq : d.maxT;
    mf_blas_warmup(&d, cfg.batch * T, mf_blas_warm_shapes(&cfg));
    size_t runtime = mf_rss_current();
    char path[MF_PATH_MAX];
    mf_planner_offload_path(&cfg, path, sizeof path);
    mf_planner_result r;
    if (mf_planner_search(&cfg, eff, strcmp(cfg.allow, "lossy") == 0, runtime, nthreads, &rates, path, &r))
        return die(mf_error());
    char a[32], b[32];
    if (json) mf_planner_print_json(stdout, &r);
    else {
        printf("plan: %s, effective batch %d x seq %d, budget %s, %s\n", cfg.model, eff, r.seq,
               cfg.budget ? mf_size_format(cfg.budget, a, sizeof a) : "none",
               strcmp(cfg.allow, "lossy") == 0 ? "lossy settings allowed" : "exact settings only (--allow lossy adds others)");
        printf("rates (%s, %d threads): GEMM %.1f GFLOP/s at this model's width and micro-batch rows, "
               "attention %.1f GFLOP/s at its T and head size, element-wise %.1f GB/s, disk %.2f GB/s\n", cached ? "cached" : "calibrated now",
               nthreads, mf_rates_gemm(&rates, d.C, cfg.batch * T), mf_rates_attn(&rates, T, d.hd), rates.elem_gbs,
               rates.disk_gbs);
        if (mf_rates_busy(&rates))
            printf("note: other processes used %.2f cores while the rates were measured, so they are low and the times "
                   "below long; the next plan measures them again\n", rates.busy_cores);
        printf("process bytes = planned arena + runtime outside it (%s measured here; train's runtime also holds its\n"
               "tokenizer and data, so train re-plans with its own); offloaded settings use %s\n",
               mf_size_format(runtime, b, sizeof b), path);
        mf_planner_print(stdout, &r, all);
        if (r.chosen >= 0 && d.n_experts > 0 && d.ep > 1 && r.world > 1) print_alltoall(&d, &r.c[r.chosen], r.seq);
    }
    int rc = 0;
    if (r.chosen < 0) {
        mf_planner_refuse(&r);
        rc = die(mf_error());
    }
    mf_planner_free(&r);
    return rc;
}

/* --init FILE written by memfit quantize: its "quant" metadata sets
 * base_dtype (given explicitly it must agree); out receives the dtype's
 * name, "" for an unquantised file. */
static int infer_quant(mf_config *cfg, char *out, size_t n) {
    struct stat sb;
    out[0] = 0;
    if (!cfg->init[0] || stat(cfg->init, &sb) != 0 || !S_ISREG(sb.st_mode)) return 0;
    mf_st_file f;
    if (mf_st_open(&f, cfg->init)) return -1;
    const char *q = mf_st_meta(&f, "quant");
    int rc = 0;
    if (q && mf_config_was_set(cfg, "base_dtype") && strcmp(cfg->base_dtype, q) != 0)
        rc = mf_fail("%s is quantised to %s; --base_dtype %s disagrees (drop it)", cfg->init, q, cfg->base_dtype);
    else if (q && mf_config_set(cfg, "base_dtype", q)) rc = mf_fail("%s: quant metadata '%s': %s", cfg->init, q, mf_error());
    else if (q) snprintf(out, n, "%s", q);
    mf_st_close(&f);
    return rc;
}

static int cmd_infer(int argc, char **argv, int sample) {
    if (wants_help(argc, argv)) {
        if (sample) printf("usage: memfit sample --init MODEL.safetensors|HF_DIR [--model PRESET] [--prompt TEXT] [--sample_tokens N]\n"
                           "       [--temperature X] [--top_k K] [--seed S] [--tokenizer gpt2|bytes|PATH/tokenizer.json]\n"
                           "  Generates text from trained weights, decoded with the tokenizer (HF_DIR/tokenizer.json by default).\n\n");
        else printf("usage: memfit eval --init MODEL.safetensors|HF_DIR [--model PRESET] [--data FILE.tok | --val_data FILE.tok]\n"
                    "       [--tokenizer gpt2|bytes|PATH/tokenizer.json]\n"
                    "       [--compare FP32_MODEL.safetensors]\n"
                    "  Prints the mean loss over the validation batches (token files of the run's tokenizer) and the\n"
                    "  resident bytes (planned == ledger, peak RSS). A model from memfit quantize: --compare evaluates\n"
                    "  its fp32 source after it, on the same batches, and prints both losses (docs/quantize.md).\n\n");
        mf_config_print_help(stdout);
        return 0;
    }
    /* eval --compare FILE: a second model evaluated after the first */
    const char *compare = NULL;
    char *args[256];
    int na = 0;
    for (int i = 0; i < argc && na < 255; i++) {
        if (!sample && strcmp(argv[i], "--compare") == 0 && i + 1 < argc) compare = argv[++i];
        else if (!sample && strcmp(argv[i], "--compare") == 0) { mf_fail("--compare needs a model file"); return die(mf_error()); }
        else args[na++] = argv[i];
    }
    argc = na, argv = args;
    mf_config cfg;
    char *pos[MAX_POS];
    int npos;
    if (parse(&cfg, argc, argv, pos, &npos)) return die(mf_error());
    if (npos) { mf_fail("unexpected argument '%s'", pos[0]); return die(mf_error()); }
    if (!cfg.init[0] && !cfg.resume[0]) { mf_fail("give the weights with --init FILE.safetensors (or --resume CHECKPOINT)"); return die(mf_error()); }
    if (sample) {
        if (!mf_config_was_set(&cfg, "batch")) cfg.batch = 1;
        if (!mf_config_was_set(&cfg, "sample_tokens")) cfg.sample_tokens = 200;
    } else cfg.sample_tokens = 0;
    /* a quantised model (memfit quantize): its block matrices are planned
     * packed and multiplied by the dequantise-in-GEMM kernels */
    char quant[16] = "";
    if (infer_quant(&cfg, quant, sizeof quant)) return die(mf_error());
    /* (--base_dtype on an fp32 file or HF folder: quantised as it loads) */
    if (!quant[0] && strcmp(cfg.base_dtype, "fp32") != 0) snprintf(quant, sizeof quant, "%s", cfg.base_dtype);
    mf_trainer t;
    if (mf_trainer_init(&t, &cfg, MF_MODE_INFER)) return die(mf_error());
    int rc = 0;
    double v = NAN;
    if (sample) {
        if (mf_trainer_sample(&t, cfg.prompt, cfg.sample_tokens, stdout)) rc = die(mf_error());
    } else {
        v = mf_trainer_val_loss(&t);
        if (isnan(v)) rc = die("validation data is shorter than one batch");
        else printf("val loss %.6f over %d batches of %d x %d\n", v, t.n_val_batches, t.B, t.T);
    }
    if (!rc && (!sample || quant[0])) {
        /* resident bytes: this plan (== the ledger's peak) and the process
         * peak, beside the fp32 model's plan of the same shape (sample:
         * from a quantised file, on stderr, after the text) */
        FILE *o = sample ? stderr : stdout;
        mf_config c32 = cfg;
        snprintf(c32.base_dtype, sizeof c32.base_dtype, "fp32");
        mf_dims d32;
        mf_plan p32;
        mf_model m32;
        size_t a32 = 0;
        if (quant[0] && mf_model_build_plan(&c32, MF_MODE_INFER, 1, 0, &d32, &p32, &m32) == 0) {
            a32 = p32.arena_bytes;
            mf_model_free(&m32);
            mf_plan_free(&p32);
        }
        fprintf(o, "resident %s: planned arena %zu B (%.2f MiB), ledger peak %zu B (%s), process peak RSS %.2f MiB",
               quant[0] ? quant : "fp32", t.plan.arena_bytes, (double)t.plan.arena_bytes / (1 << 20),
               t.ledger.peak_total, t.ledger.peak_total == t.plan.peak_bytes ? "== planned" : "!= planned",
               (double)mf_rss_peak() / (1 << 20));
        if (a32) fprintf(o, "; the fp32 model's planned arena %zu B (%.2f MiB, %.2fx)", a32, (double)a32 / (1 << 20),
                         (double)a32 / (double)t.plan.arena_bytes);
        fprintf(o, "\n");
    }
    mf_trainer_free(&t);
    if (!rc && compare) {
        /* the fp32 source on the same validation batches (its peak RSS is
         * not separable from the first model's, so only its plan is shown) */
        mf_config c2 = cfg;
        snprintf(c2.init, sizeof c2.init, "%s", compare);
        snprintf(c2.base_dtype, sizeof c2.base_dtype, "fp32");
        char q2[16];
        if (infer_quant(&c2, q2, sizeof q2)) return die(mf_error());
        if (q2[0]) { mf_fail("--compare %s is quantised (%s): compare with the fp32 source", compare, q2); return die(mf_error()); }
        if (mf_trainer_init(&t, &c2, MF_MODE_INFER)) return die(mf_error());
        double v2 = mf_trainer_val_loss(&t);
        printf("compare fp32 %s: val loss %.6f, planned arena %zu B (%.2f MiB), ledger peak %zu B (%s); %s loss %+.3f%% "
               "of fp32's\n", compare, v2, t.plan.arena_bytes, (double)t.plan.arena_bytes / (1 << 20), t.ledger.peak_total,
               t.ledger.peak_total == t.plan.peak_bytes ? "== planned" : "!= planned", quant[0] ? quant : "this model",
               100.0 * (v - v2) / v2);
        mf_trainer_free(&t);
    }
    return rc;
}

static void print_id(int32_t id, void *ctx) {
    int *first = ctx;
    printf(*first ? "%d" : " %d", id);
    *first = 0;
}

/* "--decode IDS": ids separated by commas and/or white space. */
static int parse_ids(const char *s, int32_t **out, size_t *n) {
    size_t cap = 16, k = 0;
    int32_t *v = malloc(cap * sizeof *v);
    if (!v) return mf_fail("out of memory");
    const char *p = s;
    for (;;) {
        while (*p == ',' || *p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
        if (!*p) break;
        char *end;
        errno = 0;
        long x = strtol(p, &end, 10);
        if (end == p || errno || x < 0 || x > INT32_MAX || (*end && !strchr(", \t\n\r", *end))) {
            free(v);
            return mf_fail("--decode: '%.*s' is not a token id (ids are non-negative integers separated by commas or "
                           "spaces)", (int)strcspn(p, ", \t\n\r"), p);
        }
        if (k == cap) {
            int32_t *nv = realloc(v, (cap *= 2) * sizeof *nv);
            if (!nv) { free(v); return mf_fail("out of memory"); }
            v = nv;
        }
        v[k++] = (int32_t)x;
        p = end;
    }
    *out = v;
    *n = k;
    return 0;
}

static int cmd_tokenize(int argc, char **argv) {
    int encode = 0, decode = 0;
    const char *text = NULL, *ids_arg = NULL;
    char *args[256];
    int n = 0;
    for (int i = 0; i < argc && n < 255; i++) {
        if (strcmp(argv[i], "--encode") == 0) {
            encode = 1;
            /* --encode TEXT; bare --encode (next is an option or nothing) reads stdin */
            if (i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0) text = argv[++i];
        } else if (strncmp(argv[i], "--encode=", 9) == 0) {
            encode = 1;
            text = argv[i] + 9;
        } else if (strcmp(argv[i], "--decode") == 0 && i + 1 < argc) {
            decode = 1;
            ids_arg = argv[++i];
        } else if (strncmp(argv[i], "--decode=", 9) == 0) {
            decode = 1;
            ids_arg = argv[i] + 9;
        } else {
            args[n++] = argv[i];
        }
    }
    if (wants_help(n, args)) {
        printf("usage: memfit tokenize [--tokenizer gpt2|bytes|PATH/tokenizer.json] INPUT.txt OUTPUT.tok\n"
               "       memfit tokenize --encode [TEXT] [--tokenizer ...]   (prints ids; no TEXT: reads stdin)\n"
               "       memfit tokenize --decode IDS [--tokenizer ...]      (ids separated by commas/spaces -> text)\n"
               "  The GPT-2 files come from tokenizer_dir (default $MEMFIT_CACHE/gpt2). A tokenizer.json\n"
               "  (Hugging Face BPE: Llama 3, Qwen, Llama 2, ...) encodes without adding BOS/EOS.\n"
               "  OUTPUT.tok records the tokenizer (its hash) and holds u32 ids when its vocabulary exceeds\n"
               "  65536 (docs/formats.md); train and eval take it only with the same --tokenizer.\n");
        return 0;
    }
    if (encode && decode) return die("tokenize takes --encode or --decode, not both");
    mf_config cfg;
    char *pos[MAX_POS];
    int npos;
    if (parse(&cfg, n, args, pos, &npos)) return die(mf_error());
    if ((encode || decode) ? npos != 0 : npos != 2) {
        mf_fail(encode ? "tokenize --encode takes TEXT or reads stdin, and no file arguments"
                : decode ? "tokenize --decode takes IDS and no file arguments"
                       : "tokenize needs INPUT.txt and OUTPUT.tok (see memfit tokenize --help)");
        return die(mf_error());
    }
    mf_tokenizer *tok = mf_tokenizer_open(cfg.tokenizer[0] ? cfg.tokenizer : "gpt2", cfg.tokenizer_dir);
    if (!tok) return die(mf_error());
    int rc = 0;
    if (decode) {
        int32_t *ids = NULL;
        size_t k = 0, len = 0;
        char *out = NULL;
        if (parse_ids(ids_arg, &ids, &k) || mf_tokenizer_decode_text(tok, ids, k, &out, &len)) rc = die(mf_error());
        else {
            fwrite(out, 1, len, stdout);
            printf("\n");
        }
        free(ids);
        free(out);
    } else if (encode && text) {
        int first = 1;
        if (mf_tokenizer_encode(tok, text, strlen(text), print_id, &first)) rc = die(mf_error());
        else printf("\n");
    } else if (encode) {
        size_t cap = 1 << 16, len = 0;
        char *buf = malloc(cap);
        size_t r;
        while (buf && (r = fread(buf + len, 1, cap - len, stdin)) > 0) {
            len += r;
            if (len == cap) { char *nb = realloc(buf, cap *= 2); if (!nb) { free(buf); buf = NULL; } else buf = nb; }
        }
        if (!buf) rc = die("out of memory reading stdin");
        else {
            int first = 1;
            if (mf_tokenizer_encode(tok, buf, len, print_id, &first)) rc = die(mf_error());
            else printf("\n");
        }
        free(buf);
    } else {
        if (mf_tokenize_file(tok, pos[0], pos[1])) rc = die(mf_error());
        else {
            mf_tokfile f;
            if (mf_tokfile_open(&f, pos[1]) == 0) {
                printf("wrote %s: %llu tokens (%s tokenizer)\n", pos[1], (unsigned long long)f.n,
                       f.kind == MF_TOK_GPT2 ? "gpt2" : f.kind == MF_TOK_HF ? "tokenizer.json" : "bytes");
                mf_tokfile_close(&f);
            } else rc = die(mf_error());
        }
    }
    mf_tokenizer_free(tok);
    return rc;
}

static void usage(FILE *f) { mf_cli_usage(f); }

/* Under AddressSanitizer freed memory waits in a quarantine (256 MiB by
 * default) before the allocator reuses it; freed GEMM scratch then stays
 * resident and the per-step leak check reads it as growth.  A 4 MiB
 * quarantine keeps use-after-free detection for recent frees.  The
 * environment's ASAN_OPTIONS are applied after these and can override. */
#if defined(__SANITIZE_ADDRESS__)
#define MF_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define MF_ASAN 1
#endif
#endif
#ifdef MF_ASAN
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "quarantine_size_mb=4"; }
#endif

int main(int argc, char **argv) {
    env_setup(argc, argv);
    if (argc < 2) { usage(stderr); return 2; }
    if (mf_kernels_isa_init()) return die(mf_error());
    const char *cmd = argv[1];
    /* under mpirun: MPI starts first and ends with the command's status */
    if (strcmp(cmd, "train") == 0) return mf_dist_finish(mf_dist_init() ? die(mf_error()) : cmd_train(argc - 2, argv + 2, 0));
    if (strcmp(cmd, "profile") == 0) return mf_dist_finish(mf_dist_init() ? die(mf_error()) : cmd_train(argc - 2, argv + 2, 1));
    if (strcmp(cmd, "estimate") == 0) return cmd_estimate(argc - 2, argv + 2);
    if (strcmp(cmd, "plan") == 0) return cmd_plan(argc - 2, argv + 2);
    if (strcmp(cmd, "sample") == 0) return mf_dist_finish(cmd_infer(argc - 2, argv + 2, 1));
    if (strcmp(cmd, "eval") == 0) return mf_dist_finish(cmd_infer(argc - 2, argv + 2, 0));
    if (strcmp(cmd, "eval-chat") == 0) return mf_cli_eval_chat(argc - 2, argv + 2);
    if (strcmp(cmd, "tokenize") == 0) return cmd_tokenize(argc - 2, argv + 2);
    if (strcmp(cmd, "convert") == 0) return mf_cli_convert(argc - 2, argv + 2);
    if (strcmp(cmd, "merge") == 0) return mf_cli_merge(argc - 2, argv + 2);
    if (strcmp(cmd, "quantize") == 0) return mf_cli_quantize(argc - 2, argv + 2);
    if (strcmp(cmd, "help") == 0) return mf_cli_help(argc - 2, argv + 2);
    if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0) { usage(stdout); return 0; }
    fprintf(stderr, "memfit: error: unknown command '%s'\n", cmd);
    usage(stderr);
    return 2;
}
