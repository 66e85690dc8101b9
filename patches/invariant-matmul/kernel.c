/* invariant-matmul: the product of kernel.py, compiled (fixed-block's kernel.c, its product alone). The same
 * arithmetic, operation for operation:
 *
 *   out[b, m, n] = serial over K-blocks (from the first, starting at +0) of
 *                  tree16(a[b, m, k] * b[b, k, n] for the block's 16 k)
 *   tree16(p) = ((s8[0] + s8[4]) + (s8[2] + s8[6])) + ((s8[1] + s8[5]) + (s8[3] + s8[7])), s8[i] = p[i] + p[i + 8]
 *
 * written as kernel.py's `_tree` does it: slot i + slot i + h, halving h = 8, 4, 2, 1. Every product and sum is one
 * IEEE float32 operation, rounded to nearest, so the result has the bits of the torch implementation whatever code
 * the compiler emits, provided it neither fuses a multiply into an add nor reorders a sum: build with
 * -ffp-contract=off and without -ffast-math (kernel.py does). The caller pads K at its start to whole blocks with
 * zeros (kernel.py's `_left_pad`), so blocks are anchored at the end of the axis as there.
 *
 * Rows of the result are independent (row m reads row m of a and all of b), so tiling over rows and columns
 * changes no bit; it only keeps a tile of b in the L1 cache while every row of a passes over it.
 */
#include <stdint.h>

#define BLOCK 16
#define TILE 8 /* output columns computed together: one 8-lane vector */
#define ROWS 4 /* rows of a that pass over a packed tile of b together, sharing its loads */

/* b's columns [n0, n0 + width) as [k][TILE], zero beyond width (those lanes are computed and dropped). */
static void pack(const float *b, int64_t sk, int64_t sn, int64_t k, int64_t n0, int64_t width, float *bt) {
    if (sk == 1) { /* a linear layer's weight ([n][k] in memory): read each column along k, where it is contiguous */
        for (int64_t j = 0; j < width; j++) {
            const float *col = b + (n0 + j) * sn;
            for (int64_t kk = 0; kk < k; kk++) bt[kk * TILE + j] = col[kk];
        }
        for (int64_t kk = 0; kk < k; kk++)
            for (int64_t j = width; j < TILE; j++) bt[kk * TILE + j] = 0.0f;
        return;
    }
    for (int64_t kk = 0; kk < k; kk++) {
        const float *row = b + kk * sk + n0 * sn;
        float *dst = bt + kk * TILE;
        for (int64_t j = 0; j < width; j++) dst[j] = row[j * sn];
        for (int64_t j = width; j < TILE; j++) dst[j] = 0.0f;
    }
}

/* acc += tree16 of one block's products. The tree's sums are the ones kernel.py's `_tree` makes (slot i + slot
 * i + h, h = 8, 4, 2, 1), evaluated in an order that keeps fewer values live: s4[i] = s8[i] + s8[i + 4] with
 * s8[i] = p[i] + p[i + 8], then (s4[0] + s4[2]) + (s4[1] + s4[3]). */
static inline void block(const float *ar, const float *bb, float *acc) {
    float s4[4][TILE];
    for (int i = 0; i < 4; i++) {
        const float x0 = ar[i], x8 = ar[i + 8], x4 = ar[i + 4], x12 = ar[i + 12];
        for (int j = 0; j < TILE; j++) {
            const float s8 = x0 * bb[i * TILE + j] + x8 * bb[(i + 8) * TILE + j];
            const float s8h = x4 * bb[(i + 4) * TILE + j] + x12 * bb[(i + 12) * TILE + j];
            s4[i][j] = s8 + s8h;
        }
    }
    for (int j = 0; j < TILE; j++) acc[j] = acc[j] + ((s4[0][j] + s4[2][j]) + (s4[1][j] + s4[3][j]));
}

/* a: [batches, m, k] with unit stride along k; b: [batches, k, n], any strides; out: [batches, m, n] contiguous.
 * k is a whole number of blocks. bt: scratch of k * 16 floats. */
void fb_bmm_f32(const float *a, int64_t a_sb, int64_t a_sm, const float *b, int64_t b_sb, int64_t b_sk,
                int64_t b_sn, float *out, int64_t batches, int64_t m, int64_t k, int64_t n, float *bt) {
    float acc[ROWS][TILE];
    for (int64_t bi = 0; bi < batches; bi++) {
        for (int64_t n0 = 0; n0 < n; n0 += TILE) {
            const int64_t width = n - n0 < TILE ? n - n0 : TILE;
            pack(b + bi * b_sb, b_sk, b_sn, k, n0, width, bt);
            for (int64_t m0 = 0; m0 < m; m0 += ROWS) {
                const int rows = m - m0 < ROWS ? (int)(m - m0) : ROWS;
                const float *arows = a + bi * a_sb + m0 * a_sm;
                for (int r = 0; r < rows; r++)
                    for (int j = 0; j < TILE; j++) acc[r][j] = 0.0f;
                for (int64_t k0 = 0; k0 < k; k0 += BLOCK)
                    for (int r = 0; r < rows; r++) block(arows + r * a_sm + k0, bt + k0 * TILE, acc[r]);
                for (int r = 0; r < rows; r++) {
                    float *dst = out + (bi * m + m0 + r) * n + n0;
                    for (int64_t j = 0; j < width; j++) dst[j] = acc[r][j];
                }
            }
        }
    }
}
