/* OpenMP's side of `pto bench dag`: the per-task cost of the same three task graphs in libgomp,
 * with `depend` clauses doing what pto's TensorMap does. Written for pto (docs/BENCHMARKS.md).
 *   chain:   N tasks, each `inout` on one cell (serial);
 *   fan:     one task writes an input, then N tasks each read it and write a cell of their own;
 *   diamond: layers of 8 tasks; task c of a layer reads cells c and c+1 (mod 8) of the layer
 *            before and writes cell c of its own (two rows used in turn, as pto's benchmark).
 * Each graph runs once untimed (the team starts), then timed. Prints one line:
 *   threads=T tasks=N chain_ns_per_task=.. fan_ns_per_task=.. diamond_ns_per_task=..
 * Build: gcc -O2 -fopenmp -o omp_deps scripts/anchors/omp_deps.c
 * Run:   OMP_NUM_THREADS=2 ./omp_deps [N]   (or: pto bench dag --omp-anchor ./omp_deps) */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

#define WIDTH 8

static long chain_cell;
static long layers[2][WIDTH];

static double chain(int n) {
    double t0 = omp_get_wtime();
    #pragma omp parallel
    #pragma omp single
    {
        for (int i = 0; i < n; i++) {
            #pragma omp task depend(inout: chain_cell)
            chain_cell += 1;
        }
        #pragma omp taskwait
    }
    return omp_get_wtime() - t0;
}

static double fan(int n, long *cells) {
    long input = 0;
    double t0 = omp_get_wtime();
    #pragma omp parallel
    #pragma omp single
    {
        #pragma omp task depend(out: input) shared(input)
        input = 1;
        for (int i = 0; i < n; i++) {
            #pragma omp task depend(in: input) depend(out: cells[i]) shared(input)
            cells[i] = input + 1;
        }
        #pragma omp taskwait
    }
    return omp_get_wtime() - t0;
}

static double diamond(int n) {
    double t0 = omp_get_wtime();
    #pragma omp parallel
    #pragma omp single
    {
        for (int j = 0; j < n; j++) {
            int layer = j / WIDTH, c = j % WIDTH;
            int src = (layer + 1) % 2, dst = layer % 2, c2 = (c + 1) % WIDTH;
            #pragma omp task depend(in: layers[src][c], layers[src][c2]) depend(out: layers[dst][c])
            layers[dst][c] = layers[src][c] + layers[src][c2] + 1;
        }
        #pragma omp taskwait
    }
    return omp_get_wtime() - t0;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 200000;
    if (n < 1) {
        fprintf(stderr, "usage: omp_deps [tasks >= 1]\n");
        return 2;
    }
    long *cells = calloc((size_t)n, sizeof(long));
    if (!cells) {
        fprintf(stderr, "omp_deps: out of memory for %d cells\n", n);
        return 1;
    }
    int warm = n < 10000 ? n : 10000;
    chain(warm);
    double c = chain(n);
    fan(warm, cells);
    double f = fan(n, cells);
    diamond(warm);
    double d = diamond(n);
    printf("threads=%d tasks=%d chain_ns_per_task=%.0f fan_ns_per_task=%.0f diamond_ns_per_task=%.0f\n",
           omp_get_max_threads(), n, c * 1e9 / n, f * 1e9 / n, d * 1e9 / n);
    free(cells);
    return 0;
}
