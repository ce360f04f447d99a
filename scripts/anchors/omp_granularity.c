/* OpenMP's side of `pto bench dag`'s granularity line (Task Bench's METG(50%)), measured the same
 * way: a 1 -> N fan of tasks that each busy-wait D ns (D doubling from 250 ns), about 60 ms of
 * ideal work per measurement after a warm-up, efficiency = (N * D / threads) / elapsed; prints
 * the smallest D that reaches 50%. Written for pto (see docs/BENCHMARKS.md).
 * Build: gcc -O2 -fopenmp -o omp_granularity omp_granularity.c
 * Run:   OMP_NUM_THREADS=2 ./omp_granularity */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static void busy(long d) {
    double end = now_ns() + d;
    while (now_ns() < end) {
    }
}

/* Seconds for a fan of n tasks of d ns each. */
static double fan(int n, long d, int *cells) {
    int input = 0;
    double t0 = omp_get_wtime();
    #pragma omp parallel
    #pragma omp single
    {
        #pragma omp task depend(out: input)
        { input = 1; }
        for (int i = 0; i < n; i++) {
            #pragma omp task depend(in: input) depend(out: cells[i])
            { busy(d); cells[i] = input; }
        }
        #pragma omp taskwait
    }
    return omp_get_wtime() - t0;
}

int main(void) {
    int threads = omp_get_max_threads();
    int *cells = calloc(200000, sizeof(int));
    long found = -1;
    printf("threads=%d", threads);
    for (long d = 250; d <= 1L << 20; d *= 2) {
        long n = 60000000L * threads / d;
        if (n < 2000) n = 2000;
        if (n > 200000) n = 200000;
        fan(n < 2000 ? (int)n : 2000, d, cells); /* warm-up */
        double secs = fan((int)n, d, cells);
        double eff = ((double)d / threads) / (secs * 1e9 / n);
        printf(" eff_%ld=%.3f", d, eff);
        if (eff >= 0.5) {
            found = d;
            break;
        }
    }
    printf(" min_task_ns=%ld\n", found);
    free(cells);
    return found < 0;
}
