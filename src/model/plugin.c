/* Model plugins (dsim/spi/model.h): loading a shared object and checking
 * its table. A loaded object is never closed: specs hold its table for the
 * life of the process. */
#include <dlfcn.h>
#include <stdint.h>
#include <string.h>

#include "dsim/log.h"
#include "dsim/spi/model.h"

dsim_err dsim_model_check_ops(const dsim_model_ops *ops, const char *where)
{
    if (!where)
        where = "model plugin";
    if (!ops)
        return DSIM_ERR(DSIM_EINVAL, -1, "%s: the ops table is NULL", where);
    if (ops->size != sizeof(dsim_model_ops))
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "%s: its table's size is %zu bytes, this libdsim's dsim_model_ops is "
                        "%zu: set .size = sizeof(struct dsim_model_ops) and rebuild it against "
                        "this dsim/spi/model.h",
                        where, ops->size, sizeof(dsim_model_ops));
    const char *missing = !ops->name         ? "name"
                          : !ops->num_params ? "num_params"
                          : !ops->init       ? "init"
                          : !ops->loss_grad  ? "loss_grad"
                                             : NULL;
    if (missing)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "%s: its table has no %s, which is required (dsim/spi/model.h)", where,
                        missing);
    if (ops->loss != DSIM_LOSS_MSE && ops->loss != DSIM_LOSS_XENT)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "%s: its table's loss is %d: set DSIM_LOSS_MSE (regression targets) or "
                        "DSIM_LOSS_XENT (class indices)",
                        where, (int)ops->loss);
    return DSIM_OK;
}

dsim_err dsim_model_load(const char *path, const dsim_model_ops **out)
{
    if (!path || !*path || !out)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "dsim_model_load: give the shared object's path (e.g. ./libmymodel.so) "
                        "and where to put its table");
    *out = NULL;
    dlerror();
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *why = dlerror();
        return DSIM_ERR(DSIM_ENOENT, -1, "cannot load model plugin '%s': %s", path,
                        why ? why : "dlopen failed");
    }
    dlerror();
    void *sym = dlsym(h, DSIM_MODEL_PLUGIN_SYMBOL);
    const char *why = dlerror();
    if (!sym || why) {
        dsim_err e =
            DSIM_ERR(DSIM_EINVAL, -1,
                     "'%s' is not a model plugin: it has no symbol '%s' (%s); a plugin "
                     "exports `const struct dsim_model_ops *%s(uint32_t *abi_version)`, "
                     "see examples/model_plugin",
                     path, DSIM_MODEL_PLUGIN_SYMBOL, why ? why : "NULL", DSIM_MODEL_PLUGIN_SYMBOL);
        dlclose(h);
        return e;
    }
    dsim_model_plugin_fn *fn;
    memcpy(&fn, &sym, sizeof fn);
    uint32_t abi = 0;
    const dsim_model_ops *ops = fn(&abi);
    dsim_err e = DSIM_OK;
    if (abi != DSIM_MODEL_ABI_VERSION)
        e = DSIM_ERR(DSIM_EINVAL, -1,
                     "'%s' was built against model ABI version %u but this libdsim speaks "
                     "version %u; rebuild the plugin against this dsim/spi/model.h",
                     path, abi, DSIM_MODEL_ABI_VERSION);
    else
        e = dsim_model_check_ops(ops, path);
    if (e != DSIM_OK) {
        dlclose(h);
        return e;
    }
    dsim_info("loaded model '%s' from %s", ops->name, path);
    *out = ops;
    return DSIM_OK;
}
