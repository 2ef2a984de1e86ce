/* Routes the allocator to glibc's, so that libfaketime can be preloaded
 * into a redis-server linked with jemalloc (see redisproc.StartBehind). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void __libc_free(void *);
extern void *__libc_memalign(size_t, size_t);

void *malloc(size_t n) { return __libc_malloc(n); }
void *calloc(size_t n, size_t m) { return __libc_calloc(n, m); }
void *realloc(void *p, size_t n) { return __libc_realloc(p, n); }
void free(void *p) { __libc_free(p); }
void *memalign(size_t a, size_t n) { return __libc_memalign(a, n); }
void *aligned_alloc(size_t a, size_t n) { return __libc_memalign(a, n); }
int posix_memalign(void **p, size_t a, size_t n) {
	*p = __libc_memalign(a, n);
	return *p ? 0 : 12; /* ENOMEM */
}

/* jemalloc's malloc_usable_size, found first, would read glibc's blocks. */
static size_t (*libc_usable)(void *);
size_t malloc_usable_size(void *p) {
	if (!libc_usable) {
		void *h = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
		libc_usable = (size_t (*)(void *))dlsym(h, "malloc_usable_size");
	}
	return libc_usable(p);
}
