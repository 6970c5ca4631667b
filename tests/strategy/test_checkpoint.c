/* Checkpoints: the file round-trips, a damaged one is refused with its name,
 * only the chief writes, and a run restored from the chief's checkpoint ends
 * with the same bits as a run that was never interrupted (BackupAndRestore). */
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "dsim/strategy.h"
#include "strat_common.h"

static char ck_dir[64];

static int setup_dir(void **state)
{
    (void)state;
    snprintf(ck_dir, sizeof ck_dir, "/tmp/dsim-ckpt-XXXXXX");
    return mkdtemp(ck_dir) ? 0 : -1;
}

static int remove_dir(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", ck_dir);
    return system(cmd) == 0 ? 0 : -1;
}

static void ck_path(char *buf, size_t cap, const char *name)
{
    snprintf(buf, cap, "%s/%s", ck_dir, name);
}

static void test_file_roundtrip_and_damage(void **state)
{
    (void)state;
    float params[5] = {1.5f, -2.25f, 0.0f, 3e-8f, -0.0f};
    float slots[10];
    for (int i = 0; i < 10; i++)
        slots[i] = (float)i * 0.125f - 0.5f;
    dsim_checkpoint ck = {
        .epoch = 1,
        .step = 3,
        .global_step = 11,
        .optim_kind = DSIM_OPTIM_ADAM,
        .optim_step = 11,
        .n_params = 5,
        .params = params,
        .optim_state_len = 10,
        .optim_state = slots,
        .global_batch = 48,
        .hosts = 3,
        .devices_per_host = 2,
        .shard = DSIM_SHARD_FILE,
        .n_examples = 1000,
        .n_files = 7,
        .shuffle = true,
        .drop_remainder = true,
        .seed = 0x123456789abcdefull,
        .steps_per_epoch = 21,
        .epochs = 4,
        .has_loss_scale = true,
        .loss_scale = 4096.0f,
        .loss_scale_counter = 17,
    };
    char path[128], tmp[140];
    ck_path(path, sizeof path, "unit.ckpt");
    assert_int_equal(dsim_checkpoint_write(path, &ck), DSIM_OK);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    assert_int_not_equal(access(tmp, F_OK), 0); /* renamed away, nothing left over */
    dsim_checkpoint *back = NULL;
    assert_int_equal(dsim_checkpoint_read(path, &back), DSIM_OK);
    assert_int_equal(back->epoch, 1);
    assert_int_equal(back->step, 3);
    assert_int_equal(back->global_step, 11);
    assert_int_equal(back->optim_kind, DSIM_OPTIM_ADAM);
    assert_int_equal(back->optim_step, 11);
    assert_int_equal(back->n_params, 5);
    assert_int_equal(back->optim_state_len, 10);
    assert_int_equal(back->version, DSIM_CHECKPOINT_VERSION);
    assert_int_equal(back->global_batch, 48);
    assert_int_equal(back->hosts, 3);
    assert_int_equal(back->devices_per_host, 2);
    assert_int_equal(back->shard, DSIM_SHARD_FILE);
    assert_int_equal(back->n_examples, 1000);
    assert_int_equal(back->n_files, 7);
    assert_true(back->shuffle);
    assert_true(back->drop_remainder);
    assert_int_equal(back->seed, 0x123456789abcdefull);
    assert_int_equal(back->steps_per_epoch, 21);
    assert_int_equal(back->epochs, 4);
    assert_true(back->has_loss_scale);
    assert_true(back->loss_scale == 4096.0f);
    assert_int_equal(back->loss_scale_counter, 17);
    assert_memory_equal(back->params, params, sizeof params);
    assert_memory_equal(back->optim_state, slots, sizeof slots);
    dsim_checkpoint_free(back);

    /* Flip each byte in turn: every one is caught, and named. */
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    unsigned char good[512];
    size_t len = fread(good, 1, sizeof good, f);
    fclose(f);
    assert_int_equal(len, 128 + 4 * 15 + 8);
    for (size_t i = 0; i < len; i++) {
        unsigned char bad[512];
        memcpy(bad, good, len);
        bad[i] ^= 0x20;
        f = fopen(path, "wb");
        assert_non_null(f);
        assert_int_equal(fwrite(bad, 1, len, f), len);
        fclose(f);
        dsim_err e = dsim_checkpoint_read(path, &back);
        if (e != DSIM_EPROTO)
            fail_msg("byte %zu flipped: got %s", i, dsim_strerror(e));
        assert_null(back);
        assert_non_null(strstr(dsim_errmsg(), path));
    }
    printf("# %s\n", dsim_errmsg());
    /* Truncated. */
    f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(good, 1, len - 9, f), len - 9);
    fclose(f);
    assert_int_equal(dsim_checkpoint_read(path, &back), DSIM_EPROTO);
    assert_non_null(strstr(dsim_errmsg(), "truncated"));
    printf("# %s\n", dsim_errmsg());
    /* Missing. */
    ck_path(path, sizeof path, "none.ckpt");
    assert_int_equal(dsim_checkpoint_read(path, &back), DSIM_ENOENT);
    assert_non_null(strstr(dsim_errmsg(), path));
}

/* Interrupted after `stop` steps with a checkpoint every `every`, then
 * restored: the same bits as the uninterrupted run, step by step. */
static void roundtrip(const char *strategy, int hosts, int devices, int ps, dsim_optim_kind kind,
                      uint64_t every, uint64_t stop)
{
    char path[128];
    ck_path(path, sizeof path, strategy);
    unlink(path);
    dsim_train_cfg cfg;
    sc_cfg(&cfg, strategy, hosts, devices);
    cfg.num_ps = ps;
    dsim_optim_spec_default(&cfg.optim, kind);
    cfg.optim.lr = kind == DSIM_OPTIM_ADAM ? 0.01 : 0.05;
    cfg.epochs = 3;
    dsim_train_result a, b, c;
    if (dsim_train(&cfg, &a) != DSIM_OK)
        fail_msg("%s uninterrupted: %s", strategy, dsim_errmsg());

    cfg.checkpoint_path = path;
    cfg.checkpoint_every = every;
    cfg.stop_after = stop;
    cfg.restore = true; /* nothing there yet: a fresh start */
    if (dsim_train(&cfg, &b) != DSIM_OK)
        fail_msg("%s interrupted: %s", strategy, dsim_errmsg());
    assert_int_equal(b.first_step, 0);
    assert_int_equal(b.steps, stop);
    uint64_t saved = stop / every;
    int N = hosts * devices;
    /* Only the chief writes. */
    assert_int_equal(b.checkpoints_written, saved);
    assert_int_equal(b.checkpoint_writes[0], saved);
    for (int r = 1; r < N; r++)
        assert_int_equal(b.checkpoint_writes[r], 0);
    /* Up to the interruption it is the same run. */
    assert_memory_equal(b.checksum, a.checksum, stop * (size_t)N * sizeof(uint64_t));

    cfg.stop_after = 0;
    if (dsim_train(&cfg, &c) != DSIM_OK)
        fail_msg("%s restored: %s", strategy, dsim_errmsg());
    uint64_t resumed = saved * every;
    assert_int_equal(c.first_step, resumed);
    assert_int_equal(c.steps, a.steps - resumed);
    assert_memory_equal(c.checksum, a.checksum + resumed * (uint64_t)N,
                        c.steps * (size_t)N * sizeof(uint64_t));
    assert_memory_equal(c.params, a.params, a.n_params * sizeof(float));
    assert_true(c.replicas_agree);
    printf(
        "# %s %dx%d ps %d (%s): stopped at %llu, resumed from %llu, %llu more steps, same bits\n",
        strategy, hosts, devices, ps, dsim_optim_kind_name(kind), (unsigned long long)stop,
        (unsigned long long)resumed, (unsigned long long)c.steps);
    dsim_train_result_free(&a);
    dsim_train_result_free(&b);
    dsim_train_result_free(&c);
}

static void test_restore_same_bits(void **state)
{
    (void)state;
    roundtrip("one_device", 1, 1, 0, DSIM_OPTIM_ADAM, 5, 7);
    roundtrip("mirrored", 1, 2, 0, DSIM_OPTIM_MOMENTUM, 3, 7);
    roundtrip("multi_worker_mirrored", 2, 2, 0, DSIM_OPTIM_ADAM, 4, 10);
    roundtrip("central_storage", 1, 4, 0, DSIM_OPTIM_MOMENTUM, 2, 5);
    roundtrip("parameter_server", 2, 2, 2, DSIM_OPTIM_ADAM, 3, 6);
    /* At an epoch boundary (8 steps per epoch): resumes at epoch 1, step 0. */
    roundtrip("multi_worker_mirrored", 2, 1, 0, DSIM_OPTIM_SGD, 8, 9);
}

/* The worked example plugin checkpoints too. */
static void test_restore_plugin(void **state)
{
    (void)state;
    const char *p = sc_plugin("DSIM_CUSTOM_PLUGIN");
    if (!p)
        skip();
    assert_int_equal(dsim_strategy_load(NULL, p), DSIM_OK);
    roundtrip("custom_mirrored", 2, 2, 0, DSIM_OPTIM_MOMENTUM, 3, 7);
}

static void test_restore_refuses_bad_checkpoints(void **state)
{
    (void)state;
    char path[128];
    ck_path(path, sizeof path, "refuse.ckpt");
    dsim_train_cfg cfg;
    sc_cfg(&cfg, "mirrored", 1, 2);
    cfg.checkpoint_path = path;
    cfg.checkpoint_every = 4;
    cfg.stop_after = 4;
    dsim_train_result r;
    assert_int_equal(dsim_train(&cfg, &r), DSIM_OK);
    dsim_train_result_free(&r);

    /* Another optimizer than the one that wrote it. */
    cfg.stop_after = 0;
    cfg.restore = true;
    dsim_optim_spec_default(&cfg.optim, DSIM_OPTIM_ADAM);
    assert_int_equal(dsim_train(&cfg, &r), DSIM_EINVAL);
    assert_non_null(strstr(dsim_errmsg(), path));
    assert_non_null(strstr(dsim_errmsg(), "another optimizer"));
    printf("# %s\n", dsim_errmsg());
    dsim_train_result_free(&r);

    /* The same kind with another number of slots: Adam's with amsgrad */
    cfg.restore = false;
    cfg.stop_after = 4;
    assert_int_equal(dsim_train(&cfg, &r), DSIM_OK);
    dsim_train_result_free(&r);
    cfg.restore = true;
    cfg.stop_after = 0;
    cfg.optim.amsgrad = 1;
    assert_int_equal(dsim_train(&cfg, &r), DSIM_EINVAL);
    assert_non_null(strstr(dsim_errmsg(), "another number of slots (Adam's amsgrad"));
    dsim_train_result_free(&r);
    cfg.optim.amsgrad = 0;
    dsim_optim_spec_default(&cfg.optim, DSIM_OPTIM_SGD);
    cfg.optim.lr = 0.1;
    cfg.restore = false;
    cfg.stop_after = 4;
    assert_int_equal(dsim_train(&cfg, &r), DSIM_OK); /* the file the cases below corrupt */
    dsim_train_result_free(&r);
    cfg.restore = true;
    cfg.stop_after = 0;

    /* Corrupt: one byte of the parameters flipped. */
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    assert_int_equal(fseek(f, 70, SEEK_SET), 0);
    int ch = fgetc(f);
    assert_int_equal(fseek(f, 70, SEEK_SET), 0);
    fputc(ch ^ 1, f);
    fclose(f);
    sc_cfg(&cfg, "mirrored", 1, 2);
    cfg.checkpoint_path = path;
    cfg.restore = true;
    assert_int_equal(dsim_train(&cfg, &r), DSIM_EPROTO);
    assert_non_null(strstr(dsim_errmsg(), path));
    assert_non_null(strstr(dsim_errmsg(), "corrupt"));
    printf("# %s\n", dsim_errmsg());
    dsim_train_result_free(&r);
}

/* A notice that arrives while the job runs: replica 0's observer raises it
 * after `at` steps, and only replica `to` hears it (as one worker gets
 * SIGTERM), at whatever boundary it next looks. */
typedef struct pre_notice {
    uint64_t at;
    int to;
    atomic_int raised;
} pre_notice;

static void pre_observe(const dsim_train_step_info *info, void *user)
{
    pre_notice *n = user;
    if (info->replica == 0 && info->global_step + 1 == n->at)
        atomic_store(&n->raised, 1);
}

static int pre_notice_fn(void *user, int replica)
{
    pre_notice *n = user;
    return replica == n->to && atomic_load(&n->raised);
}

/* Preempted (by preempt_after, or by a notice to one replica at any time,
 * with a grace), then restarted from the checkpoint: the same bits as the
 * run that was never interrupted. */
static void preempt_roundtrip(const char *strategy, int hosts, int devices, int ps, uint64_t after,
                              int notify, uint64_t grace, uint64_t every)
{
    char path[128];
    ck_path(path, sizeof path, "preempt.ckpt");
    unlink(path);
    dsim_train_cfg cfg;
    sc_cfg(&cfg, strategy, hosts, devices);
    cfg.num_ps = ps;
    dsim_optim_spec_default(&cfg.optim, DSIM_OPTIM_ADAM);
    cfg.optim.lr = 0.01;
    cfg.epochs = 3;
    int N = hosts * devices;
    dsim_train_result a, b, c;
    if (dsim_train(&cfg, &a) != DSIM_OK)
        fail_msg("%s uninterrupted: %s", strategy, dsim_errmsg());

    pre_notice n = {.at = after, .to = N - 1};
    cfg.checkpoint_path = path;
    cfg.checkpoint_every = every;
    cfg.preempt_grace_steps = grace;
    if (notify) {
        cfg.observer = pre_observe;
        cfg.observer_user = &n;
        cfg.preempt_notice = pre_notice_fn;
        cfg.preempt_user = &n;
    } else {
        cfg.preempt_after = after;
    }
    dsim_err e = dsim_train(&cfg, &b);
    if (e != DSIM_EPREEMPTED)
        fail_msg("%s preempted: got %s: %s", strategy, dsim_strerror(e), b.error.msg);
    assert_true(b.preempted);
    assert_non_null(strstr(b.error.msg, "preempted after global step"));
    /* a notice to one replica at any time: all stop at one boundary, at
     * least the grace after it was raised */
    assert_true(b.preempted_at >= after + grace);
    if (!notify)
        assert_int_equal(b.preempted_at, after + grace);
    assert_int_equal(b.steps, b.preempted_at);
    for (int r = 0; r < N; r++) {
        assert_int_equal(b.replicas[r].status, DSIM_OK);
        assert_int_equal(b.replicas[r].global_step, b.preempted_at);
        if (r != 0)
            assert_int_equal(b.checkpoint_writes[r], 0);
    }
    uint64_t saves =
        (every ? b.preempted_at / every : 0) + (every && b.preempted_at % every == 0 ? 0 : 1);
    assert_int_equal(b.checkpoint_writes[0], saves);
    assert_memory_equal(b.checksum, a.checksum, b.steps * (size_t)N * sizeof(uint64_t));
    dsim_checkpoint *ck = NULL;
    assert_int_equal(dsim_checkpoint_read(path, &ck), DSIM_OK);
    assert_int_equal(ck->global_step, b.preempted_at);
    dsim_checkpoint_free(ck);

    /* restarted: resumes there and ends where the clean run ends */
    cfg.preempt_after = 0;
    cfg.preempt_notice = NULL;
    cfg.observer = NULL;
    cfg.restore = true;
    if (dsim_train(&cfg, &c) != DSIM_OK)
        fail_msg("%s restarted: %s", strategy, dsim_errmsg());
    assert_false(c.preempted);
    assert_int_equal(c.first_step, b.preempted_at);
    assert_int_equal(c.steps, a.steps - b.preempted_at);
    assert_memory_equal(c.checksum, a.checksum + b.preempted_at * (uint64_t)N,
                        c.steps * (size_t)N * sizeof(uint64_t));
    assert_memory_equal(c.params, a.params, a.n_params * sizeof(float));
    printf("# %s %dx%d ps %d: preempted %s%llu (grace %llu) after %llu steps, restarted, same "
           "bits\n",
           strategy, hosts, devices, ps, notify ? "by a notice raised at " : "at ",
           (unsigned long long)after, (unsigned long long)grace,
           (unsigned long long)b.preempted_at);
    dsim_train_result_free(&a);
    dsim_train_result_free(&b);
    dsim_train_result_free(&c);
}

static void test_preemption(void **state)
{
    (void)state;
    preempt_roundtrip("multi_worker_mirrored", 2, 2, 0, 7, 0, 0, 0);
    preempt_roundtrip("multi_worker_mirrored", 2, 2, 0, 5, 0, 2, 3); /* saves at 3, 6 and 7 */
    preempt_roundtrip("multi_worker_mirrored", 4, 1, 0, 4, 1, 1, 0);
    preempt_roundtrip("mirrored", 1, 3, 0, 9, 1, 0, 0);
    preempt_roundtrip("parameter_server", 2, 2, 1, 6, 0, 0, 0);

    /* a stop at or past the last step is the end of the job */
    char path[128];
    ck_path(path, sizeof path, "late.ckpt");
    dsim_train_cfg cfg;
    sc_cfg(&cfg, "mirrored", 1, 2);
    cfg.checkpoint_path = path;
    cfg.preempt_after = 15;
    cfg.preempt_grace_steps = 5;
    dsim_train_result r;
    assert_int_equal(dsim_train(&cfg, &r), DSIM_OK);
    assert_false(r.preempted);
    assert_int_equal(r.steps, 16);
    dsim_train_result_free(&r);

    /* a notice needs somewhere to save */
    cfg.checkpoint_path = NULL;
    assert_int_equal(dsim_train(&cfg, &r), DSIM_EINVAL);
    assert_non_null(strstr(r.error.msg, "checkpoint_path"));
    dsim_train_result_free(&r);
}

/* Writes a checkpoint of `strategy` hosts x devices after 4 steps. */
static void write_after_4(const char *path, const char *strategy, int hosts, int devices)
{
    unlink(path);
    dsim_train_cfg cfg;
    sc_cfg(&cfg, strategy, hosts, devices);
    cfg.checkpoint_path = path;
    cfg.checkpoint_every = 4;
    cfg.stop_after = 4;
    dsim_train_result r;
    if (dsim_train(&cfg, &r) != DSIM_OK)
        fail_msg("%s", dsim_errmsg());
    assert_int_equal(r.checkpoints_written, 1);
    dsim_train_result_free(&r);
}

/* Restores cfg and expects a refusal whose message holds `want`. */
static void expect_refused(dsim_train_cfg *cfg, const char *want)
{
    dsim_train_result r;
    cfg->restore = true;
    dsim_err e = dsim_train(cfg, &r);
    if (e != DSIM_EINVAL || !strstr(r.error.msg, want))
        fail_msg("expected a refusal with '%s'; got %s: %s", want, dsim_strerror(e), r.error.msg);
    printf("# %s\n", r.error.msg);
    dsim_train_result_free(&r);
}

/* A checkpoint resumes only a job with its global batch and data layout;
 * the refusal names the value in the file and the job's. */
static void test_restore_refuses_another_job(void **state)
{
    (void)state;
    char path[128], want[256];
    ck_path(path, sizeof path, "layout.ckpt");
    write_after_4(path, "multi_worker_mirrored", 2, 1);
    dsim_checkpoint *ck = NULL;
    assert_int_equal(dsim_checkpoint_read(path, &ck), DSIM_OK);
    assert_int_equal(ck->version, 2);
    assert_int_equal(ck->global_batch, 32);
    assert_int_equal(ck->hosts, 2);
    assert_int_equal(ck->devices_per_host, 1);
    assert_int_equal(ck->shard, DSIM_SHARD_FILE); /* AUTO over 8 files */
    assert_int_equal(ck->n_examples, 256);
    assert_int_equal(ck->n_files, 8);
    assert_true(ck->shuffle);
    assert_int_equal(ck->seed, 11);
    assert_int_equal(ck->steps_per_epoch, 8);
    assert_int_equal(ck->epochs, 2);
    dsim_checkpoint_free(ck);

    dsim_train_cfg cfg;
    sc_cfg(&cfg, "multi_worker_mirrored", 2, 1);
    cfg.checkpoint_path = path;
    cfg.global_batch = 64;
    snprintf(want, sizeof want, "checkpoint %s was written with global_batch 32; this job has 64",
             path);
    expect_refused(&cfg, want);

    sc_cfg(&cfg, "multi_worker_mirrored", 2, 2);
    cfg.checkpoint_path = path;
    snprintf(want, sizeof want, "checkpoint %s was written with devices_per_host 1; this job has 2",
             path);
    expect_refused(&cfg, want);

    sc_cfg(&cfg, "multi_worker_mirrored", 4, 1);
    cfg.checkpoint_path = path;
    snprintf(want, sizeof want, "checkpoint %s was written with hosts 2; this job has 4", path);
    expect_refused(&cfg, want);

    sc_cfg(&cfg, "multi_worker_mirrored", 2, 1);
    cfg.checkpoint_path = path;
    cfg.shard = DSIM_SHARD_DATA;
    snprintf(want, sizeof want,
             "checkpoint %s was written with shard policy file; this job has data", path);
    expect_refused(&cfg, want);

    sc_cfg(&cfg, "multi_worker_mirrored", 2, 1);
    cfg.checkpoint_path = path;
    cfg.shuffle = false;
    snprintf(want, sizeof want, "checkpoint %s was written with shuffle true; this job has false",
             path);
    expect_refused(&cfg, want);

    sc_cfg(&cfg, "multi_worker_mirrored", 2, 1);
    cfg.checkpoint_path = path;
    cfg.seed = 12;
    snprintf(want, sizeof want, "checkpoint %s was written with seed 11; this job has 12", path);
    expect_refused(&cfg, want);

    sc_cfg(&cfg, "multi_worker_mirrored", 2, 1);
    cfg.checkpoint_path = path;
    cfg.in_memory = true;
    snprintf(want, sizeof want,
             "checkpoint %s was written with shard policy file; this job has data", path);
    expect_refused(&cfg, want); /* no files: AUTO shards by DATA */

    /* more epochs is the same job, trained longer */
    sc_cfg(&cfg, "multi_worker_mirrored", 2, 1);
    cfg.checkpoint_path = path;
    cfg.epochs = 3;
    cfg.restore = true;
    dsim_train_result r;
    assert_int_equal(dsim_train(&cfg, &r), DSIM_OK);
    assert_int_equal(r.first_step, 4);
    dsim_train_result_free(&r);
}

static uint64_t fnv(const unsigned char *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

/* A version 1 file (no record of its job) still reads, but dsim_train will
 * not resume from it: it could not check the file belongs to the job. */
static void test_version_1_is_read_not_resumed(void **state)
{
    (void)state;
    char path[128];
    ck_path(path, sizeof path, "v1.ckpt");
    write_after_4(path, "mirrored", 1, 2);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    static unsigned char v2[1 << 16], v1[1 << 16];
    size_t len = fread(v2, 1, sizeof v2, f);
    fclose(f);
    assert_true(len > 136 && len < sizeof v2);
    /* the first 64 bytes, version 1 and the reserved word 0, the floats,
     * a new checksum */
    memcpy(v1, v2, 64);
    v1[8] = 1;
    memset(v1 + 20, 0, 4);
    size_t floats = len - 128 - 8;
    memcpy(v1 + 64, v2 + 128, floats);
    size_t n1 = 64 + floats;
    uint64_t h = fnv(v1, n1);
    for (int i = 0; i < 8; i++)
        v1[n1 + (size_t)i] = (unsigned char)(h >> (8 * i));
    f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(v1, 1, n1 + 8, f), n1 + 8);
    fclose(f);

    dsim_checkpoint *ck = NULL;
    assert_int_equal(dsim_checkpoint_read(path, &ck), DSIM_OK);
    assert_int_equal(ck->version, 1);
    assert_int_equal(ck->global_step, 4);
    assert_int_equal(ck->global_batch, 0);
    dsim_checkpoint_free(ck);

    dsim_train_cfg cfg;
    sc_cfg(&cfg, "mirrored", 1, 2);
    cfg.checkpoint_path = path;
    expect_refused(&cfg, "has format version 1, which does not record the global batch and data "
                         "layout");

    /* an unknown version is refused by the reader */
    v1[8] = 9;
    h = fnv(v1, n1);
    for (int i = 0; i < 8; i++)
        v1[n1 + (size_t)i] = (unsigned char)(h >> (8 * i));
    f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(v1, 1, n1 + 8, f), n1 + 8);
    fclose(f);
    assert_int_equal(dsim_checkpoint_read(path, &ck), DSIM_EPROTO);
    assert_non_null(strstr(dsim_errmsg(), "format version 9; this dsim reads versions 1 and 2"));
}

/* Two replicas whose strategy says is_chief: refused before any file is
 * read or written, naming both. */
static void test_two_chiefs_refused(void **state)
{
    (void)state;
    const char *p = sc_plugin("DSIM_TWO_CHIEFS_PLUGIN");
    if (!p)
        skip();
    assert_int_equal(dsim_strategy_load(NULL, p), DSIM_OK);
    char path[128], tmp[140];
    ck_path(path, sizeof path, "two.ckpt");
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    unlink(path);
    dsim_train_cfg cfg;
    sc_cfg(&cfg, "two_chiefs", 2, 2);
    cfg.checkpoint_path = path;
    cfg.checkpoint_every = 2;
    dsim_train_result r;
    assert_int_equal(dsim_train(&cfg, &r), DSIM_EINVAL);
    printf("# %s\n", r.error.msg);
    assert_non_null(strstr(r.error.msg, "replicas 0 and 2 both claim to be the chief; exactly one "
                                        "replica writes checkpoints"));
    assert_int_equal(r.steps, 0);
    assert_int_not_equal(access(path, F_OK), 0);
    assert_int_not_equal(access(tmp, F_OK), 0);
    dsim_train_result_free(&r);
}

/* Async parameter servers save too (what the servers hold at that moment)
 * and a restored async run finishes from where the checkpoint says. */
static void test_async_checkpoint(void **state)
{
    (void)state;
    char path[128];
    ck_path(path, sizeof path, "async.ckpt");
    dsim_train_cfg cfg;
    sc_cfg(&cfg, "parameter_server", 4, 1);
    cfg.num_ps = 2;
    cfg.ps_mode = DSIM_PS_ASYNC;
    dsim_optim_spec_default(&cfg.optim, DSIM_OPTIM_MOMENTUM);
    cfg.optim.lr = 0.05;
    cfg.checkpoint_path = path;
    cfg.checkpoint_every = 5;
    cfg.stop_after = 10;
    dsim_train_result r;
    assert_int_equal(dsim_train(&cfg, &r), DSIM_OK);
    assert_int_equal(r.checkpoint_writes[0], 2);
    dsim_train_result_free(&r);
    dsim_checkpoint *ck = NULL;
    assert_int_equal(dsim_checkpoint_read(path, &ck), DSIM_OK);
    /* it resumes where every replica's earlier steps are applied on both
     * servers: the chief's own step 10, or before it when another replica
     * was behind when the chief saved (those steps run again: at least
     * once); 8 steps an epoch */
    uint64_t g = ck->global_step;
    assert_true(g <= 10);
    assert_int_equal(ck->epoch, g / 8);
    assert_int_equal(ck->step, g % 8);
    dsim_checkpoint_free(ck);
    cfg.stop_after = 0;
    cfg.restore = true;
    assert_int_equal(dsim_train(&cfg, &r), DSIM_OK);
    assert_int_equal(r.first_step, g);
    assert_int_equal(r.steps, 16 - g);
    assert_true(r.final_loss < r.initial_loss);
    dsim_train_result_free(&r);
}

int main(void)
{
    if (!sc_dataset()) {
        fprintf(stderr, "cannot make the dataset: %s\n", dsim_errmsg());
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_file_roundtrip_and_damage),
        cmocka_unit_test(test_restore_same_bits),
        cmocka_unit_test(test_restore_plugin),
        cmocka_unit_test(test_restore_refuses_bad_checkpoints),
        cmocka_unit_test(test_async_checkpoint),
        cmocka_unit_test(test_restore_refuses_another_job),
        cmocka_unit_test(test_version_1_is_read_not_resumed),
        cmocka_unit_test(test_two_chiefs_refused),
        cmocka_unit_test(test_preemption),
    };
    return cmocka_run_group_tests(tests, setup_dir, remove_dir);
}
