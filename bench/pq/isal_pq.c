/* ISA-L's RAID6 P/Q generation (pq_gen), the anchor for cairn's parity kernels.
 *
 *   isal_pq rate NDATA CHUNK cache|stream SECONDS   prints GB/s of data consumed
 *   isal_pq dump NDATA LEN FILE                      writes data blocks, P, Q of one stripe
 *
 * The buffers and the walk match `pq_bench rate` (crates/md/examples/pq_bench.rs) exactly:
 * one 64-byte-aligned region of stripes, stripe s holding NDATA data chunks then P then Q
 * back to back; every call generates P and Q of one stripe. "cache" repeats stripe 0
 * (working set (NDATA+2)*CHUNK, in L2 for 64 KiB chunks); "stream" walks enough stripes
 * for a working set of at least 256 MiB. Data bytes are filled by the same xorshift as
 * pq_bench, so both sides hash the same bytes.
 *
 * GB/s = data bytes (NDATA*CHUNK per call) / this thread's CPU time / 1e9, timed over
 * whole passes after one warm-up pass; a pass is every stripe ("stream") or enough
 * repeats of stripe 0 to consume 4 MiB of data ("cache"), so the clock is read rarely.
 *
 * ISA-L's pq_gen(vects, len, array): array = data pointers, then P, then Q; vects counts
 * all of them; len a multiple of 32; at least two data blocks. Its Q is Horner's rule
 * from the last data block down, so data block i is multiplied by g^i (g = 2, polynomial
 * 0x11d) -- md's order (lib/raid6/int.uc). `dump` lets the Rust side check that claim
 * byte for byte rather than trust it.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <isa-l/raid.h>

static const size_t STREAM_MIN = (size_t)256 << 20; /* working set in stream mode */
static const size_t CACHE_PASS = (size_t)4 << 20;   /* data per timed pass in cache mode */

static void die(const char *msg) {
	fprintf(stderr, "isal_pq: %s\n", msg);
	exit(1);
}

/* The same generator as pq_bench's fill(): xorshift64, low byte of each step. */
static void fill(uint8_t *buf, size_t len, uint64_t seed) {
	uint64_t x = (seed * 0x9e3779b97f4a7c15ull) | 1;
	for (size_t i = 0; i < len; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		buf[i] = (uint8_t)x;
	}
}

static double thread_cpu(void) {
	struct timespec ts;
	if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0)
		die("clock_gettime(CLOCK_THREAD_CPUTIME_ID) failed");
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static size_t parse_size(const char *s, const char *what) {
	char *end;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	if (errno || end == s)
		goto bad;
	switch (*end) {
	case 'K': case 'k': v <<= 10; end++; break;
	case 'M': case 'm': v <<= 20; end++; break;
	}
	if (*end == '\0' && v > 0)
		return (size_t)v;
bad:
	fprintf(stderr, "isal_pq: bad %s '%s'\n", what, s);
	exit(2);
}

/* Region of `stripes` stripes; data chunk j of stripe s is filled from seed s*256+j+1. */
static uint8_t *alloc_stripes(size_t ndata, size_t chunk, size_t stripes) {
	size_t stripe = (ndata + 2) * chunk;
	void *mem;
	if (posix_memalign(&mem, 64, stripe * stripes) != 0)
		die("out of memory");
	uint8_t *base = mem;
	for (size_t s = 0; s < stripes; s++) {
		for (size_t j = 0; j < ndata; j++)
			fill(base + s * stripe + j * chunk, chunk, s * 256 + j + 1);
		memset(base + s * stripe + ndata * chunk, 0, 2 * chunk);
	}
	return base;
}

static void pointers(void **ptrs, uint8_t *stripe, size_t ndata, size_t chunk) {
	for (size_t j = 0; j < ndata + 2; j++)
		ptrs[j] = stripe + j * chunk;
}

static int cmd_rate(int argc, char **argv) {
	if (argc != 6)
		die("usage: isal_pq rate NDATA CHUNK cache|stream SECONDS");
	size_t ndata = parse_size(argv[2], "NDATA");
	size_t chunk = parse_size(argv[3], "CHUNK");
	int stream = strcmp(argv[4], "stream") == 0;
	if (!stream && strcmp(argv[4], "cache") != 0)
		die("mode must be cache or stream");
	double min = strtod(argv[5], NULL);
	if (ndata < 2 || ndata > 253 || chunk % 64 != 0 || chunk > (1u << 30))
		die("need 2..253 data blocks and a chunk that is a multiple of 64 bytes");

	size_t stripe = (ndata + 2) * chunk;
	size_t stripes = stream ? (STREAM_MIN + stripe - 1) / stripe : 1;
	size_t calls = stream ? stripes : (CACHE_PASS + ndata * chunk - 1) / (ndata * chunk);
	uint8_t *base = alloc_stripes(ndata, chunk, stripes);
	void **ptrs = calloc(stripes * (ndata + 2), sizeof(void *));
	if (!ptrs)
		die("out of memory");
	for (size_t s = 0; s < stripes; s++)
		pointers(ptrs + s * (ndata + 2), base + s * stripe, ndata, chunk);

	int vects = (int)(ndata + 2), len = (int)chunk;
	/* One pass: every stripe once (stream) or stripe 0 `calls` times (cache). */
#define PASS()                                                                         \
	for (size_t c = 0; c < calls; c++)                                             \
		if (pq_gen(vects, len, ptrs + (stream ? c : 0) * (ndata + 2)) != 0)    \
			die("pq_gen failed");
	PASS(); /* warm up: page in, fill caches */
	double start = thread_cpu(), secs;
	size_t passes = 0;
	do {
		PASS();
		passes++;
		secs = thread_cpu() - start;
	} while (secs < min || passes < 3);
	printf("%.3f\n", (double)passes * (double)calls * (double)(ndata * chunk) / secs / 1e9);
	free(ptrs);
	free(base);
	return 0;
}

static int cmd_dump(int argc, char **argv) {
	if (argc != 5)
		die("usage: isal_pq dump NDATA LEN FILE");
	size_t ndata = parse_size(argv[2], "NDATA");
	size_t len = parse_size(argv[3], "LEN");
	if (ndata < 2 || ndata > 253 || len % 32 != 0 || len > (1u << 30))
		die("need 2..253 data blocks and a length that is a multiple of 32 bytes");
	uint8_t *base = alloc_stripes(ndata, len, 1);
	void *ptrs[255];
	pointers(ptrs, base, ndata, len);
	if (pq_gen((int)(ndata + 2), (int)len, ptrs) != 0)
		die("pq_gen failed");
	FILE *f = fopen(argv[4], "wb");
	if (!f || fwrite(base, 1, (ndata + 2) * len, f) != (ndata + 2) * len || fclose(f) != 0)
		die("cannot write the dump file");
	free(base);
	return 0;
}

int main(int argc, char **argv) {
	if (argc >= 2 && strcmp(argv[1], "rate") == 0)
		return cmd_rate(argc, argv);
	if (argc >= 2 && strcmp(argv[1], "dump") == 0)
		return cmd_dump(argc, argv);
	fprintf(stderr, "usage: isal_pq rate NDATA CHUNK cache|stream SECONDS\n"
			"       isal_pq dump NDATA LEN FILE\n");
	return 2;
}
