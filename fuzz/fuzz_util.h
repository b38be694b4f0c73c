/* Shared by the libFuzzer harnesses: memfit's readers take paths, so each
 * input is put in an anonymous memory file and read back through
 * /proc/self/fd/N (a regular file: mmap and fstat work as on disk). */
#ifndef MEMFIT_FUZZ_UTIL_H
#define MEMFIT_FUZZ_UTIL_H
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

/* Writes data to a fresh memfd; path gets "/proc/self/fd/N". -1 on failure. */
static inline int fuzz_memfile(const uint8_t *data, size_t size, char *path, size_t cap) {
    int fd = memfd_create("fuzz", MFD_CLOEXEC);
    if (fd < 0) return -1;
    size_t off = 0;
    while (off < size) {
        ssize_t w = write(fd, data + off, size - off);
        if (w <= 0) { close(fd); return -1; }
        off += (size_t)w;
    }
    snprintf(path, cap, "/proc/self/fd/%d", fd);
    return fd;
}
#endif
