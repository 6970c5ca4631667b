/* NumPy's .npy files: a strict reader of the header and a writer.
 *
 * The format (numpy.lib.format, versions 1.0, 2.0 and 3.0):
 *   bytes 0-5   magic "\x93NUMPY"
 *   byte  6, 7  major, minor version: 1.0, 2.0 or 3.0
 *   then        the header's length: u16 little-endian (1.0), u32 (2.0, 3.0)
 *   then        the header: an ASCII Python dict literal
 *                 {'descr': '<f4', 'fortran_order': False, 'shape': (100, 8), }
 *               padded with spaces and ended by '\n'
 *   then        the data: shape's product elements of descr, in C order
 *               (or Fortran order when fortran_order is True), to the end
 *               of the file.
 *
 * What the reader accepts, and refuses with the file and the reason:
 *   - the magic, a version of 1.0, 2.0 or 3.0, a header that fits the file
 *     and ends with '\n', printable ASCII only (3.0 allows UTF-8, which only
 *     structured types' field names need, and those are refused);
 *   - a dict of exactly the three keys descr, fortran_order and shape (in
 *     any order, quoted with ' or ", each once, a trailing comma allowed);
 *   - descr one of '<f4' '<f8' '<i1' '<i2' '<i4' '<i8' '<u1' '<u2' '<u4'
 *     '<u8', with '>' for big-endian ('|' for the one-byte types, as numpy
 *     writes them); a structured type (a list), a half float, a bool, a
 *     complex, a string or an object type is refused by name;
 *   - fortran_order True or False; shape a tuple of whole numbers >= 0
 *     ("()" a scalar, "(5,)", "(5, 3)"), at most DSIM_NPY_MAX_DIMS;
 *   - exactly as many bytes after the header as the shape needs: a shorter
 *     file is truncated, a longer one has bytes the header does not
 *     describe (both refused, with the counts).
 * The data's offset in the file is returned, so a reader can map it (the
 * writer pads the header so the data starts on a 64-byte boundary, as
 * numpy does). */
#ifndef DSIM_NPY_H
#define DSIM_NPY_H

#include <stddef.h>
#include <stdint.h>

#include "dsim/api.h"
#include "dsim/err.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DSIM_NPY_MAX_DIMS 8
/* The longest header read (numpy's own limit is 10,000 bytes by default). */
#define DSIM_NPY_MAX_HEADER 65536u

typedef enum dsim_npy_type {
    DSIM_NPY_F32 = 0,
    DSIM_NPY_F64,
    DSIM_NPY_I8,
    DSIM_NPY_I16,
    DSIM_NPY_I32,
    DSIM_NPY_I64,
    DSIM_NPY_U8,
    DSIM_NPY_U16,
    DSIM_NPY_U32,
    DSIM_NPY_U64,
    DSIM_NPY_TYPE_COUNT
} dsim_npy_type;

typedef struct dsim_npy_header {
    unsigned major, minor; /* the format version */
    dsim_npy_type type;
    size_t itemsize; /* bytes per element */
    int big_endian;  /* 1: '>' */
    int fortran_order;
    size_t ndim;
    uint64_t shape[DSIM_NPY_MAX_DIMS];
    uint64_t count;       /* elements: the product of shape (1 for a scalar) */
    uint64_t data_offset; /* bytes before the data */
    uint64_t data_bytes;  /* count * itemsize */
} dsim_npy_header;

/* "float32", "float64", "int8", ..., "uint64". */
DSIM_API const char *dsim_npy_type_name(dsim_npy_type t);
/* 1 for the float types. */
DSIM_API int dsim_npy_type_is_float(dsim_npy_type t);

/* Parses the header at the start of buf[0..len), which holds the file's
 * first len bytes (the whole header at least, or the whole file);
 * file_size is the file's size, checked against the shape. `name` (the
 * file) starts every message. DSIM_EPROTO naming the problem for a
 * malformed or unsupported header or a size that does not match. */
DSIM_API dsim_err dsim_npy_parse_header(const char *name, const void *buf, size_t len,
                                        uint64_t file_size, dsim_npy_header *out);

/* Element i of a parsed file's data (its byte order and type) as a double:
 * exact for every type but the 64-bit integers beyond 2^53. */
DSIM_API double dsim_npy_get(const dsim_npy_header *h, const void *data, uint64_t i);

/* Writes a .npy file (version 1.0, little-endian, C order) of `type`
 * (F32, F64, I64 or U64) holding data, shape[0..ndim) elements. Written to
 * PATH.tmp and renamed, so a reader never sees half a file. */
DSIM_API dsim_err dsim_npy_write(const char *path, dsim_npy_type type, const uint64_t *shape,
                                 size_t ndim, const void *data);

#ifdef __cplusplus
}
#endif
#endif
