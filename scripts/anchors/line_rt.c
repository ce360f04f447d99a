/* The machine's CPU-to-CPU latency: two threads, pinned to the first two CPUs this process may
 * use, hand a cache line back and forth; prints the mean round trip as a JSON line:
 *   {"bench":"line_roundtrip","cpus":[A,B],"ns":X}
 * Every hand-over of a task between two threads costs some of these: on the project's virtual
 * machine it reads about 90-120 ns most of the time and 230-440 ns in some spells, and in those
 * pto's empty tasks cost about twice as much (docs/BENCHMARKS.md). scripts/bench.sh prints it
 * before and after `pto bench dag`, so that a run's figures say which machine they ran on.
 * Build: gcc -O2 -pthread -o line_rt scripts/anchors/line_rt.c */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <time.h>

#define ROUNDS 200000

static _Atomic long word __attribute__((aligned(128)));
static _Atomic int failed;
static int cpu_a = -1, cpu_b = -1;

static int pin(int cpu) {
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu, &s);
    return pthread_setaffinity_np(pthread_self(), sizeof s, &s);
}

static void *pong(void *arg) {
    (void)arg;
    if (pin(cpu_b) != 0) {
        atomic_store(&failed, 1);
        return 0;
    }
    for (long i = 0; i < ROUNDS; i++) {
        while (atomic_load_explicit(&word, memory_order_acquire) != 2 * i + 1) {}
        atomic_store_explicit(&word, 2 * i + 2, memory_order_release);
    }
    return 0;
}

int main(void) {
    cpu_set_t allowed;
    if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) { perror("sched_getaffinity"); return 1; }
    for (int c = 0; c < CPU_SETSIZE && cpu_b < 0; c++) {
        if (!CPU_ISSET(c, &allowed)) continue;
        if (cpu_a < 0) cpu_a = c; else cpu_b = c;
    }
    if (cpu_b < 0) { fprintf(stderr, "line_rt: needs two CPUs\n"); return 1; }
    if (pin(cpu_a) != 0) { fprintf(stderr, "line_rt: cannot pin to CPU %d\n", cpu_a); return 1; }
    pthread_t t;
    if (pthread_create(&t, 0, pong, 0) != 0) { perror("pthread_create"); return 1; }
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long i = 0; i < ROUNDS; i++) {
        atomic_store_explicit(&word, 2 * i + 1, memory_order_release);
        while (atomic_load_explicit(&word, memory_order_acquire) != 2 * i + 2) {
            if (atomic_load_explicit(&failed, memory_order_relaxed)) {
                fprintf(stderr, "line_rt: cannot pin to CPU %d\n", cpu_b);
                return 1;
            }
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    pthread_join(t, 0);
    double ns = ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / ROUNDS;
    printf("{\"bench\":\"line_roundtrip\",\"cpus\":[%d,%d],\"ns\":%.1f}\n", cpu_a, cpu_b, ns);
    return 0;
}
