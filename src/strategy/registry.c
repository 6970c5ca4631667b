/* The strategy registry: built-ins registered on first use, a user's own
 * strategies registered by table or loaded from a shared object. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "dsim/log.h"
#include "strategy_int.h"

#define REGISTRY_MAX 64

static dsim_strategy registry_entries[REGISTRY_MAX];
static int registry_count;
static int registry_builtins_done;
static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;

static const char *const registry_ps_modes[DSIM_PS_MODE_COUNT] = {
    [DSIM_PS_SYNC] = "sync",
    [DSIM_PS_ASYNC] = "async",
};

const char *dsim_ps_mode_name(dsim_ps_mode m)
{
    if ((int)m < 0 || m >= DSIM_PS_MODE_COUNT)
        return "unknown";
    return registry_ps_modes[m];
}

dsim_err dsim_ps_mode_parse(const char *s, dsim_ps_mode *out)
{
    if (!s || !out)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_ps_mode_parse: NULL argument");
    for (int m = 0; m < DSIM_PS_MODE_COUNT; m++) {
        if (strcasecmp(s, registry_ps_modes[m]) == 0) {
            *out = (dsim_ps_mode)m;
            return DSIM_OK;
        }
    }
    return DSIM_ERR(DSIM_EINVAL, -1, "unknown parameter-server mode \"%s\"; use sync or async", s);
}

static int registry_name_ok(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n >= STRATEGY_NAME_MAX)
        return 0;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= '0' && *s <= '9') || *s == '_'))
            return 0;
    return 1;
}

dsim_err dsim_strategy_check_ops(const struct dsim_strategy_ops *ops, const char *where)
{
    if (!ops)
        return DSIM_ERR(DSIM_EINVAL, -1, "%s: the strategy table is NULL", where);
    if (ops->size != sizeof(struct dsim_strategy_ops))
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "%s: the strategy table has size %zu, expected %zu: set .size = "
                        "sizeof(struct dsim_strategy_ops) and rebuild against this "
                        "dsim/spi/strategy.h",
                        where, ops->size, sizeof(struct dsim_strategy_ops));
    if (!ops->name || !registry_name_ok(ops->name))
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "%s: the strategy's name \"%s\" is not 1-%d characters of [a-z0-9_]", where,
                        ops->name ? ops->name : "(null)", STRATEGY_NAME_MAX - 1);
    const char *missing = !ops->check_shape        ? "check_shape"
                          : !ops->create_variables ? "create_variables"
                          : !ops->apply_gradients  ? "apply_gradients"
                          : !ops->reduce           ? "reduce"
                                                   : NULL;
    if (missing)
        return DSIM_ERR(DSIM_EINVAL, -1, "%s: strategy '%s' lacks the required member '%s'", where,
                        ops->name, missing);
    if ((int)ops->placement < 0 || ops->placement >= DSIM_PLACE_COUNT)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "%s: strategy '%s' has placement %d, not a dsim_var_placement", where,
                        ops->name, (int)ops->placement);
    if (ops->replica_priv_size > ((size_t)1 << 30) || ops->server_priv_size > ((size_t)1 << 30))
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "%s: strategy '%s' asks for %zu/%zu private bytes (at most 1 GiB)", where,
                        ops->name, ops->replica_priv_size, ops->server_priv_size);
    return DSIM_OK;
}

static dsim_err registry_add_locked(const char *name, const struct dsim_strategy_ops *ops,
                                    const char *path)
{
    const char *where = path && *path ? path : "dsim_strategy_register";
    DSIM_CHECK(dsim_strategy_check_ops(ops, where));
    if (!name)
        name = ops->name;
    if (!registry_name_ok(name))
        return DSIM_ERR(DSIM_EINVAL, -1, "%s: the name \"%s\" is not 1-%d characters of [a-z0-9_]",
                        where, name, STRATEGY_NAME_MAX - 1);
    for (int i = 0; i < registry_count; i++) {
        if (strcmp(registry_entries[i].name, name) != 0)
            continue;
        if (registry_entries[i].ops == ops)
            return DSIM_OK;
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "%s: a different strategy named '%s' is already registered%s%s; choose "
                        "another name",
                        where, name, registry_entries[i].path[0] ? " from " : "",
                        registry_entries[i].path);
    }
    if (registry_count == REGISTRY_MAX)
        return DSIM_ERR(DSIM_ENOMEM, -1, "%s: too many strategies registered (at most %d)", where,
                        REGISTRY_MAX);
    dsim_strategy *s = &registry_entries[registry_count];
    memset(s, 0, sizeof *s);
    snprintf(s->name, sizeof s->name, "%s", name);
    snprintf(s->path, sizeof s->path, "%s", path ? path : "");
    s->ops = ops;
    registry_count++;
    return DSIM_OK;
}

static void registry_builtins_locked(void)
{
    if (registry_builtins_done)
        return;
    registry_builtins_done = 1;
    static const struct dsim_strategy_ops *const builtins[] = {
        &dsim_strategy_one_device_ops,
        &dsim_strategy_mirrored_ops,
        &dsim_strategy_multi_worker_mirrored_ops,
        &dsim_strategy_central_storage_ops,
        &dsim_strategy_parameter_server_ops,
        &dsim_strategy_tpu_ops,
    };
    for (size_t i = 0; i < sizeof builtins / sizeof builtins[0]; i++)
        if (registry_add_locked(NULL, builtins[i], NULL) != DSIM_OK)
            dsim_error_log("built-in strategy %zu failed to register: %s", i, dsim_errmsg());
        else
            registry_entries[registry_count - 1].builtin = true;
}

dsim_err dsim_strategy_register(const struct dsim_strategy_ops *ops)
{
    pthread_mutex_lock(&registry_lock);
    registry_builtins_locked();
    dsim_err e = registry_add_locked(NULL, ops, NULL);
    pthread_mutex_unlock(&registry_lock);
    return e;
}

static void registry_names_locked(char *buf, size_t cap)
{
    if (!buf || cap == 0)
        return;
    buf[0] = '\0';
    for (int i = 0; i < registry_count; i++) {
        size_t l = strlen(buf);
        if (l + 1 >= cap)
            break;
        /* A long list loses its tail (the names are for a message). */
        int n = snprintf(buf + l, cap - l, "%s%.*s", i ? ", " : "", (int)(cap - l - 1),
                         registry_entries[i].name);
        (void)n;
    }
}

dsim_err dsim_strategy_lookup(const char *name, const dsim_strategy **out)
{
    *out = NULL;
    char names[512];
    pthread_mutex_lock(&registry_lock);
    registry_builtins_locked();
    for (int i = 0; name && i < registry_count; i++) {
        if (strcmp(registry_entries[i].name, name) == 0) {
            *out = &registry_entries[i];
            break;
        }
    }
    registry_names_locked(names, sizeof names);
    pthread_mutex_unlock(&registry_lock);
    if (*out)
        return DSIM_OK;
    if (!name)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "no strategy given; name one of: %s (or load your own with "
                        "plugin_path / dsim_strategy_load)",
                        names);
    return DSIM_ERR(DSIM_ENOENT, -1,
                    "no strategy named '%s'; registered: %s (load your own with plugin_path / "
                    "dsim_strategy_load)",
                    name, names);
}

int dsim_strategy_exists(const char *name)
{
    const dsim_strategy *s;
    dsim_error saved;
    dsim_error_copy(&saved);
    int found = dsim_strategy_lookup(name, &s) == DSIM_OK;
    if (!found) {
        /* A question, not a failure: leave the caller's error context alone. */
        if (saved.code == DSIM_OK)
            dsim_clear_error();
        else
            dsim_error_restore(&saved);
    }
    return found;
}

int dsim_strategy_list(char *buf, size_t cap)
{
    pthread_mutex_lock(&registry_lock);
    registry_builtins_locked();
    registry_names_locked(buf, cap);
    int n = registry_count;
    pthread_mutex_unlock(&registry_lock);
    return n;
}

const char *dsim_strategy_summary(const char *name)
{
    const char *summary = NULL;
    pthread_mutex_lock(&registry_lock);
    registry_builtins_locked();
    for (int i = 0; name && i < registry_count; i++)
        if (strcmp(registry_entries[i].name, name) == 0)
            summary = registry_entries[i].ops->summary;
    pthread_mutex_unlock(&registry_lock);
    return summary;
}

dsim_err dsim_strategy_probe(const char *name, const dsim_strategy_shape *shape,
                             dsim_strategy_traits *out)
{
    memset(out, 0, sizeof *out);
    const dsim_strategy *s;
    DSIM_CHECK(dsim_strategy_lookup(name, &s));
    if (!shape)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_strategy_probe: no shape given");
    out->replicas_in_sync = dsim_strategy_replicas_in_sync(s, shape);
    out->can_save = s->ops->save != NULL;
    out->has_servers = s->ops->serve != NULL;
    out->placement = s->ops->placement;
    return dsim_strategy_check_shape(s, shape);
}

/* Opens a plugin: dlopen, its plugin function, its ABI version (in *abi)
 * and, when that is this library's, its table in *ops (checked). On any
 * failure the object is closed again and *h is NULL; *ops is set only when
 * the version matched; *found is 1 once the plugin function was found (the
 * object is a strategy plugin, refused or not). */
static dsim_err registry_open(const char *path, void **h, const struct dsim_strategy_ops **ops,
                              uint32_t *abi, int *found)
{
    *h = NULL;
    *ops = NULL;
    *abi = 0;
    *found = 0;
    if (!path || !*path)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "dsim_strategy_load: no path given; pass the shared object's path "
                        "(e.g. ./libmy_strategy.so)");
    /* RTLD_LOCAL keeps two plugins' symbols apart. */
    dlerror();
    void *o = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!o) {
        const char *why = dlerror();
        return DSIM_ERR(DSIM_ENOENT, -1, "cannot load strategy plugin '%s': %s", path,
                        why ? why : "dlopen failed");
    }
    dlerror();
    void *sym = dlsym(o, DSIM_STRATEGY_PLUGIN_SYMBOL);
    const char *why = dlerror();
    if (!sym || why) {
        dsim_err e = DSIM_ERR(
            DSIM_EINVAL, -1,
            "'%s' is not a strategy plugin: it has no symbol '%s' (%s); a plugin "
            "exports `const struct dsim_strategy_ops *%s(uint32_t *abi_version)`, "
            "see examples/custom_strategy",
            path, DSIM_STRATEGY_PLUGIN_SYMBOL, why ? why : "NULL", DSIM_STRATEGY_PLUGIN_SYMBOL);
        dlclose(o);
        return e;
    }
    /* dlsym hands back data pointers; POSIX guarantees the conversion. */
    dsim_strategy_plugin_fn *fn;
    memcpy(&fn, &sym, sizeof fn);
    *found = 1;
    const struct dsim_strategy_ops *t = fn(abi);
    if (*abi != DSIM_STRATEGY_ABI_VERSION) {
        /* Say which one it has, which one this is, and what to rebuild
         * with what: the plugin's own source against these headers. The
         * table is not read: its layout is another version's. */
        unsigned a = *abi;
        dsim_err e = DSIM_ERR(
            DSIM_EINVAL, -1,
            "'%s' was built against strategy ABI version %u (%s) but this libdsim speaks "
            "version %u: rebuild the plugin from its source against this dsim's "
            "dsim/spi/strategy.h (cc -shared -fPIC $(pkg-config --cflags --libs dsim) ...; "
            "pkg-config --variable=strategy_abi dsim prints %u)",
            path, a,
            a == 0                          ? "it set no version"
            : a < DSIM_STRATEGY_ABI_VERSION ? "an older dsim, before this one's interface"
                                            : "a newer dsim than this one",
            DSIM_STRATEGY_ABI_VERSION, DSIM_STRATEGY_ABI_VERSION);
        dlclose(o);
        return e;
    }
    dsim_err e = dsim_strategy_check_ops(t, path);
    if (e != DSIM_OK) {
        dlclose(o); /* the table is gone with it */
        return e;
    }
    *ops = t;
    *h = o;
    return DSIM_OK;
}

dsim_err dsim_strategy_plugin_probe(const char *path, dsim_strategy_plugin_info *out)
{
    if (!out)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_strategy_plugin_probe: out is NULL");
    memset(out, 0, sizeof *out);
    void *h = NULL;
    const struct dsim_strategy_ops *ops = NULL;
    uint32_t abi = 0;
    int found = 0;
    dsim_err e = registry_open(path, &h, &ops, &abi, &found);
    out->abi_version = abi;
    if (e == DSIM_OK) {
        out->usable = 1;
        snprintf(out->name, sizeof out->name, "%s", ops->name);
        snprintf(out->summary, sizeof out->summary, "%s", ops->summary ? ops->summary : "");
        dlclose(h);
        return DSIM_OK;
    }
    if (!found)
        return e;
    /* a plugin, refused: another version, or an incomplete table (whose
     * name its message holds: the object is closed) */
    snprintf(out->why, sizeof out->why, "%s", dsim_errmsg());
    return DSIM_OK;
}

dsim_err dsim_strategy_load(const char *name, const char *path)
{
    /* A loaded object is never closed: its table stays registered for the
     * life of the process. One that is refused is closed again. */
    void *h = NULL;
    const struct dsim_strategy_ops *ops = NULL;
    uint32_t abi = 0;
    int found = 0;
    DSIM_CHECK(registry_open(path, &h, &ops, &abi, &found));
    /* One name per strategy: the one in its table, which its own messages
     * and checkpoints use. Registering it under another (a scenario's
     * strategy.name that says something else) would make the store and the
     * strategy disagree about what ran, so a mismatch is refused. */
    dsim_err e = DSIM_OK;
    if (name && strcmp(name, ops->name) != 0)
        e = DSIM_ERR(DSIM_EINVAL, -1,
                     "'%s' names its strategy '%s' in its ops table, not '%s' as asked: use "
                     "'%s' (a scenario's strategy.name), or change .name in the plugin's table",
                     path, ops->name, name, ops->name);
    if (e == DSIM_OK) {
        pthread_mutex_lock(&registry_lock);
        registry_builtins_locked();
        e = registry_add_locked(name, ops, path);
        pthread_mutex_unlock(&registry_lock);
    }
    if (e != DSIM_OK) {
        /* Refused (a name taken): the registry holds nothing of it. If an
         * earlier load of the same object succeeded, dlopen counted this
         * one and dlclose only drops that count. */
        dlclose(h);
    } else {
        dsim_info("loaded strategy '%s' from %s", name ? name : ops->name, path);
    }
    return e;
}
