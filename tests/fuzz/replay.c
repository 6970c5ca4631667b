/* Runs a libFuzzer target's LLVMFuzzerTestOneInput over files, without
 * libFuzzer: `replay FILE|DIR...` (a folder: each regular file in it, in
 * name order). Every build uses it to run the seed corpora (and any input a
 * fuzzer found) as ordinary tests, under the sanitizers when the build has
 * them; `-Dfuzz=true` builds the real fuzzers with clang. */
#include <dirent.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int replay_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        return -1;
    }
    size_t cap = 1 << 16, n = 0;
    uint8_t *buf = malloc(cap);
    for (;;) {
        if (!buf) {
            fclose(f);
            fprintf(stderr, "%s: out of memory\n", path);
            return -1;
        }
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap)
            break;
        uint8_t *bigger = realloc(buf, cap * 2);
        if (!bigger)
            free(buf);
        buf = bigger;
        cap *= 2;
    }
    fclose(f);
    /* an exact-size copy, so that ASan sees a read past the input's end */
    uint8_t *exact = malloc(n ? n : 1);
    if (exact) {
        memcpy(exact, buf, n);
        LLVMFuzzerTestOneInput(exact, n);
    }
    free(exact);
    free(buf);
    return exact ? 0 : -1;
}

static int replay_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int main(int argc, char **argv)
{
    int files = 0, bad = 0;
    for (int i = 1; i < argc; i++) {
        struct stat sb;
        if (stat(argv[i], &sb) != 0) {
            perror(argv[i]);
            bad++;
            continue;
        }
        if (!S_ISDIR(sb.st_mode)) {
            bad += replay_file(argv[i]) != 0;
            files++;
            continue;
        }
        struct dirent **list = NULL;
        int n = scandir(argv[i], &list, NULL, NULL);
        if (n < 0) {
            perror(argv[i]);
            bad++;
            continue;
        }
        char **names = calloc((size_t)n + 1, sizeof *names);
        int k = 0;
        for (int j = 0; j < n; j++) {
            if (names && list[j]->d_name[0] != '.')
                names[k++] = strdup(list[j]->d_name);
            free(list[j]);
        }
        free(list);
        if (!names) {
            bad++;
            continue;
        }
        qsort(names, (size_t)k, sizeof *names, replay_cmp);
        for (int j = 0; j < k; j++) {
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", argv[i], names[j] ? names[j] : "");
            if (names[j] && stat(path, &sb) == 0 && S_ISREG(sb.st_mode)) {
                bad += replay_file(path) != 0;
                files++;
            }
            free(names[j]);
        }
        free(names);
    }
    printf("%d input(s) replayed\n", files);
    return bad || files == 0 ? 1 : 0;
}
