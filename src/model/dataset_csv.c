/* Datasets read from a CSV file (dsim_dataset_load, dsim/dataset.h): a
 * header row of names, then rows of numbers; named label columns, every
 * other column a feature. Every refusal names the file, the line and the
 * column. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "dataset_int.h"

#define CSV_MAX_COLUMNS (1u << 20)

/* One line: [p, p + len) without its '\n' and '\r'; lineno from 1. */
typedef struct csv_line {
    const char *p;
    size_t len;
    size_t lineno;
} csv_line;

typedef struct csv_file {
    const char *path;
    char *buf;
    size_t len, pos, lineno;
} csv_file;

/* The header's cells, and which are labels. */
typedef struct csv_cols {
    const char **names;
    size_t *nlen;
    unsigned char *is_label;
} csv_cols;

static void csv_trim(const char **p, size_t *len)
{
    while (*len && (**p == ' ' || **p == '\t')) {
        (*p)++;
        (*len)--;
    }
    while (*len && ((*p)[*len - 1] == ' ' || (*p)[*len - 1] == '\t'))
        (*len)--;
    if (*len >= 2 && (*p)[0] == '"' && (*p)[*len - 1] == '"') {
        (*p)++;
        *len -= 2;
    }
}

/* The next line that is not blank; 0 at the end of the file. */
static int csv_next(csv_file *f, csv_line *out)
{
    while (f->pos < f->len) {
        const char *s = f->buf + f->pos;
        const char *nl = memchr(s, '\n', f->len - f->pos);
        size_t n = nl ? (size_t)(nl - s) : f->len - f->pos;
        f->pos += n + (nl ? 1 : 0);
        f->lineno++;
        if (n && s[n - 1] == '\r')
            n--;
        const char *t = s;
        size_t tl = n;
        csv_trim(&t, &tl);
        if (tl == 0 && memchr(s, ',', n) == NULL)
            continue;
        out->p = s;
        out->len = n;
        out->lineno = f->lineno;
        return 1;
    }
    return 0;
}

/* Splits a line at its commas into up to cap cells (trimmed); returns the
 * number of cells, which may exceed cap (the rest are not stored). */
static size_t csv_split(const csv_line *l, const char **cell, size_t *cl, size_t cap)
{
    size_t idx = 0;
    const char *s = l->p, *end = l->p + l->len;
    for (;;) {
        const char *c = memchr(s, ',', (size_t)(end - s));
        const char *e = c ? c : end;
        if (idx < cap) {
            cell[idx] = s;
            cl[idx] = (size_t)(e - s);
            csv_trim(&cell[idx], &cl[idx]);
        }
        idx++;
        if (!c)
            return idx;
        s = c + 1;
    }
}

static dsim_err csv_read(csv_file *f)
{
    FILE *fp = fopen(f->path, "rb");
    if (!fp) {
        int er = errno;
        if (er == ENOENT)
            return DSIM_ERR(DSIM_ENOENT, -1, "%s: no such file", f->path);
        return DSIM_ERR(DSIM_EIO, -1, "%s: cannot open: %s", f->path, strerror(er));
    }
    struct stat st;
    if (fstat(fileno(fp), &st) != 0 || !S_ISREG(st.st_mode)) {
        fclose(fp);
        return DSIM_ERR(DSIM_EINVAL, -1, "%s: not a regular file", f->path);
    }
    f->len = (size_t)st.st_size;
    f->buf = malloc(f->len + 1);
    if (!f->buf) {
        fclose(fp);
        return DSIM_ERR(DSIM_ENOMEM, -1, "%s: out of memory for %zu bytes", f->path, f->len);
    }
    size_t got = fread(f->buf, 1, f->len, fp);
    fclose(fp);
    if (got != f->len)
        return DSIM_ERR(DSIM_EIO, -1, "%s: read error", f->path);
    f->buf[f->len] = '\0';
    const char *nul = memchr(f->buf, '\0', f->len);
    if (nul)
        return DSIM_ERR(DSIM_EPROTO, -1, "%s: a NUL byte at offset %zu: not a text CSV file",
                        f->path, (size_t)(nul - f->buf));
    return DSIM_OK;
}

/* The header's names, checked: each non-empty and different. */
static dsim_err csv_names(const csv_file *f, const csv_line *h, const char **name, size_t *nl,
                          size_t n)
{
    for (size_t c = 0; c < n; c++) {
        if (nl[c] == 0)
            return DSIM_ERR(DSIM_EPROTO, -1,
                            "%s:%zu: column %zu of the header has no name (the first row must "
                            "name every column)",
                            f->path, h->lineno, c + 1);
        for (size_t d = 0; d < c; d++)
            if (nl[d] == nl[c] && memcmp(name[d], name[c], nl[c]) == 0)
                return DSIM_ERR(DSIM_EPROTO, -1,
                                "%s:%zu: columns %zu and %zu are both named '%.*s'", f->path,
                                h->lineno, d + 1, c + 1, (int)nl[c], name[c]);
    }
    return DSIM_OK;
}

/* The label columns among the names: lab[i] for label i, is_label[c]. */
static dsim_err csv_labels(const csv_file *f, const dsim_data_source *src, const char **name,
                           const size_t *nl, size_t n, size_t *lab, unsigned char *is_label)
{
    for (size_t i = 0; i < src->n_label_columns; i++) {
        const char *want = src->label_columns[i];
        size_t c = 0;
        while (c < n && !(nl[c] == strlen(want) && memcmp(name[c], want, nl[c]) == 0))
            c++;
        if (c == n) {
            char names[256];
            size_t used = 0;
            for (size_t k = 0; k < n && used + 8 < sizeof names; k++)
                used += (size_t)snprintf(names + used, sizeof names - used, "%s%.*s", k ? ", " : "",
                                         (int)nl[k], name[k]);
            return DSIM_ERR(DSIM_EINVAL, -1,
                            "%s: there is no column '%s' (label_column); the header names: %s",
                            f->path, want, names);
        }
        if (is_label[c])
            return DSIM_ERR(DSIM_EINVAL, -1, "%s: label column '%s' is named twice", f->path, want);
        is_label[c] = 1;
        lab[i] = c;
    }
    if (n <= src->n_label_columns)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "%s: every column is a label: the file needs at least one feature column",
                        f->path);
    return DSIM_OK;
}

/* The header row: its names (*names, *nlen, allocated) and label columns. */
static dsim_err csv_header(csv_file *f, const dsim_data_source *src, csv_line *h, size_t *ncols,
                           const char ***names, size_t **nlen, size_t *lab,
                           unsigned char **is_label)
{
    if (!csv_next(f, h))
        return DSIM_ERR(DSIM_EPROTO, -1,
                        "%s: the file is empty: a CSV source needs a header row of column "
                        "names, then rows of numbers",
                        f->path);
    size_t n = csv_split(h, NULL, NULL, 0);
    if (n > CSV_MAX_COLUMNS)
        return DSIM_ERR(DSIM_EPROTO, -1, "%s:%zu: %zu columns; at most %u", f->path, h->lineno, n,
                        CSV_MAX_COLUMNS);
    *names = malloc(n * sizeof **names);
    *nlen = malloc(n * sizeof **nlen);
    *is_label = calloc(n, 1);
    if (!*names || !*nlen || !*is_label)
        return DSIM_ERR(DSIM_ENOMEM, -1, "%s: out of memory", f->path);
    csv_split(h, *names, *nlen, n);
    *ncols = n;
    DSIM_CHECK(csv_names(f, h, *names, *nlen, n));
    return csv_labels(f, src, *names, *nlen, n, lab, *is_label);
}

/* Parses one cell as a finite number. */
static dsim_err csv_number(const csv_file *f, const csv_line *l, size_t c, const char *name,
                           size_t nl, const char *cell, size_t cl, double *out)
{
    char tmp[128];
    if (cl == 0)
        return DSIM_ERR(DSIM_EPROTO, -1, "%s:%zu: column '%.*s' (column %zu) is empty", f->path,
                        l->lineno, (int)nl, name, c + 1);
    if (cl >= sizeof tmp)
        return DSIM_ERR(DSIM_EPROTO, -1,
                        "%s:%zu: column '%.*s' (column %zu) holds '%.40s...', not a number",
                        f->path, l->lineno, (int)nl, name, c + 1, cell);
    memcpy(tmp, cell, cl);
    tmp[cl] = '\0';
    char *end = NULL;
    errno = 0;
    double v = strtod(tmp, &end);
    if (end == tmp || *end != '\0')
        return DSIM_ERR(DSIM_EPROTO, -1,
                        "%s:%zu: column '%.*s' (column %zu) holds '%s', not a number", f->path,
                        l->lineno, (int)nl, name, c + 1, tmp);
    if (!isfinite(v) || !isfinite((float)v))
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "%s:%zu: column '%.*s' (column %zu) holds %s, which is %s (every value "
                        "must be a finite float32)",
                        f->path, l->lineno, (int)nl, name, c + 1, tmp,
                        isfinite(v) ? "beyond float32's range" : "not finite");
    *out = v;
    return DSIM_OK;
}

/* Every data row into x and y; names/nlen: the header's cells. */
static dsim_err csv_rows(csv_file *f, const char **names, const size_t *nlen, size_t ncols,
                         const unsigned char *is_label, const size_t *lab, size_t nlab,
                         dsim_dataset *ds)
{
    size_t F = ncols - nlab, n = ds->spec.n_examples;
    float *x = ds->files->x_owned, *y = ds->files->y_owned;
    const char **cell = malloc(ncols * sizeof *cell);
    size_t *cl = malloc(ncols * sizeof *cl);
    dsim_err e = cell && cl ? DSIM_OK : DSIM_ERR(DSIM_ENOMEM, -1, "%s: out of memory", f->path);
    csv_line l;
    for (size_t r = 0; e == DSIM_OK && r < n && csv_next(f, &l); r++) {
        size_t cells = csv_split(&l, cell, cl, ncols);
        if (cells != ncols) {
            e = DSIM_ERR(DSIM_EPROTO, -1, "%s:%zu: %zu cells, but the header names %zu columns",
                         f->path, l.lineno, cells, ncols);
            break;
        }
        size_t fi = 0;
        for (size_t c = 0; c < ncols; c++) {
            double v = 0;
            if ((e = csv_number(f, &l, c, names[c], nlen[c], cell[c], cl[c], &v)) != DSIM_OK)
                break;
            if (!is_label[c]) {
                x[r * F + fi++] = (float)v;
                continue;
            }
            for (size_t i = 0; i < nlab; i++)
                if (lab[i] == c)
                    y[r * nlab + i] = (float)v;
        }
    }
    free(cell);
    free(cl);
    return e;
}

static dsim_err csv_load(csv_file *f, const dsim_data_source *src, dsim_dataset *ds, size_t *lab,
                         csv_cols *cols)
{
    size_t ncols = 0, nlab = src->n_label_columns;
    csv_line hdr, l;
    DSIM_CHECK(csv_read(f));
    DSIM_CHECK(csv_header(f, src, &hdr, &ncols, &cols->names, &cols->nlen, lab, &cols->is_label));
    size_t n = 0, after_header = f->pos, line_after = f->lineno;
    while (csv_next(f, &l))
        n++;
    if (n == 0)
        return DSIM_ERR(DSIM_EPROTO, -1, "%s: a header and no data rows", f->path);
    size_t F = ncols - nlab;
    if (src->features && src->features != F)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "%s: the file has %zu feature columns, but data.features says %zu; "
                        "remove features: (it is read from the file) or fix it",
                        f->path, F, src->features);
    if (F > DSIM_MODEL_MAX_DIM || n > SIZE_MAX / 2 / (F + nlab) / sizeof(float))
        return DSIM_ERR(DSIM_EINVAL, -1, "%s: %zu rows of %zu columns are too many", f->path, n,
                        ncols);
    ds->spec.n_examples = n;
    ds->spec.in_dim = F;
    ds->files->x_owned = malloc(n * F * sizeof(float));
    ds->files->y_owned = malloc(n * nlab * sizeof(float));
    if (!ds->files->x_owned || !ds->files->y_owned)
        return DSIM_ERR(DSIM_ENOMEM, -1, "%s: out of memory for %zu rows", f->path, n);
    ds->x = ds->files->x_owned;
    ds->y = ds->files->y_owned;
    f->pos = after_header;
    f->lineno = line_after;
    return csv_rows(f, cols->names, cols->nlen, ncols, cols->is_label, lab, nlab, ds);
}

dsim_err dataset_load_csv(const dsim_data_source *src, dsim_dataset *ds)
{
    csv_file f = {.path = src->csv};
    size_t nlab = src->n_label_columns;
    size_t *lab = calloc(nlab, sizeof *lab);
    csv_cols cols = {0};
    dsim_err e = lab ? csv_load(&f, src, ds, lab, &cols)
                     : DSIM_ERR(DSIM_ENOMEM, -1, "%s: out of memory", src->csv);
    free(f.buf);
    free(lab);
    free(cols.names);
    free(cols.nlen);
    free(cols.is_label);
    if (e != DSIM_OK)
        return e;
    size_t n = ds->spec.n_examples;
    int whole = nlab == 1;
    for (size_t k = 0; whole && k < n; k++)
        whole = ds->y[k] >= 0 && ds->y[k] == floorf(ds->y[k]);
    int kind = src->task >= 0 ? src->task : whole ? DSIM_DATA_CLASSIFICATION : DSIM_DATA_REGRESSION;
    ds->spec.kind = (dsim_data_kind)kind;
    if (kind == DSIM_DATA_CLASSIFICATION) {
        if (nlab != 1)
            return DSIM_ERR(DSIM_EINVAL, -1,
                            "%s: classification takes one label column, not %zu (for several "
                            "targets use task: regression)",
                            src->csv, nlab);
        DSIM_CHECK(dataset_check_labels(ds, src, src->csv));
    } else {
        if (src->classes && src->classes != nlab)
            return DSIM_ERR(DSIM_EINVAL, -1,
                            "%s: %zu regression target column(s), but data.classes (the outputs) "
                            "says %zu; remove it or fix it",
                            src->csv, nlab, src->classes);
        ds->spec.out_dim = nlab;
    }
    snprintf(ds->files->origin, sizeof ds->files->origin,
             "%s (%zu rows x %zu features, %zu %s column%s, converted)", src->csv, n,
             ds->spec.in_dim, nlab, kind == DSIM_DATA_CLASSIFICATION ? "label" : "target",
             nlab == 1 ? "" : "s");
    return DSIM_OK;
}
