/* DSIM_API marks a declaration that libdsim exports. libdsim is built with
 * hidden visibility, so exactly the functions and variables declared with
 * DSIM_API in the public headers (the dsim folder) and in the interface for
 * people who write backends and strategies (dsim/spi) are visible to
 * programs and plugins; everything else stays inside the library.
 * tests/install checks that the shared library exports nothing else. */
#ifndef DSIM_API_H
#define DSIM_API_H

#if defined(__GNUC__) || defined(__clang__)
#define DSIM_API __attribute__((visibility("default")))
#else
#define DSIM_API
#endif

#endif
